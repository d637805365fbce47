"""Prometheus's durations (``model.ParseDuration``): ``1h30m``, ``2d``, ``0``; whole units in
order, no fractions (``1.5h`` is refused, as Prometheus refuses it in a rule file)."""

from __future__ import annotations

import re

_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNITS_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)


def parse_prometheus_duration_ms(text: str) -> int:
    """``text`` in milliseconds; ValueError in Prometheus's words if it is not a duration."""
    if text == "0":
        return 0
    m = _DURATION.match(text)
    if not text or m is None:
        raise ValueError(f'not a valid duration string: "{text}"')
    return sum(int(g) * unit for g, unit in zip(m.groups(), _UNITS_MS, strict=True) if g)


def format_prometheus_duration(ms: int) -> str:
    """Prometheus's ``model.Duration.String()``: ``1h30m``, ``5m``, ``0s``."""
    if ms == 0:
        return "0s"
    out = ""
    for unit, size in (("y", 365 * 86_400_000), ("w", 7 * 86_400_000), ("d", 86_400_000),
                       ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):  # fmt: skip
        n, ms = divmod(ms, size)
        if n:
            out += f"{n}{unit}"
    return out
