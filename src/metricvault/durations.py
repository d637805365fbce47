"""Durations (``30d``, ``90s``, ``forever``) and points in time (ISO, epoch ms, ``-30d``)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, date, datetime

from metricvault.errors import TimeRangeError

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
    "y": 365 * 86_400_000,
}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)$")
_COMPOUND_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
FOREVER = None
# Timestamps outside this window are refused as absurd (year 1990 .. year 2200, in ms).
MIN_TS_MS = 631_152_000_000
MAX_TS_MS = 7_258_118_400_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000

TimeLike = datetime | date | str | int | float


def parse_duration_ms(text: str | int | float) -> int:
    """``"90s"`` → 90000. Integers are taken as milliseconds. Compounds like ``1h30m`` work."""
    if isinstance(text, bool):
        raise TimeRangeError(f"duration {text!r} is not a duration; use e.g. '30d', '1h', '5m'")
    if isinstance(text, int | float):
        if text <= 0:
            raise TimeRangeError(f"duration {text!r} ms must be positive")
        return int(text)
    cleaned = text.strip().replace(" ", "")
    parts = _COMPOUND_RE.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise TimeRangeError(
            f"cannot parse duration {text!r}: use a number and a unit (ms, s, m, h, d, w, y), "
            "e.g. '30d', '1h30m', '5s'"
        )
    total = sum(float(n) * _UNITS_MS[u] for n, u in parts)
    if total <= 0:
        raise TimeRangeError(f"duration {text!r} must be positive")
    return int(total)


def parse_seconds(text: str) -> float:
    """A command-line duration in seconds: with a unit (``2s``, ``500ms``, ``1m30s``) as every
    duration setting takes, or a plain number of seconds (``2``, ``0.5``) as flags always did."""
    cleaned = text.strip().replace(" ", "")
    parts = _COMPOUND_RE.findall(cleaned)
    if parts and "".join(n + u for n, u in parts) == cleaned:
        return sum(float(n) * _UNITS_MS[u] for n, u in parts) / 1000
    try:
        seconds = float(cleaned)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise TimeRangeError(
            f"duration {text!r} must be a finite number of seconds, at least 0, or a number "
            "with a unit, e.g. '2s', '500ms', '1m'"
        )
    return seconds


def parse_retention_ms(text: str | int | None) -> int | None:
    """Like :func:`parse_duration_ms`, but ``forever``/``inf``/``None`` mean keep forever."""
    if text is None or (isinstance(text, str) and text.strip().lower() in {"forever", "inf", ""}):
        return FOREVER
    return parse_duration_ms(text)


def format_duration_ms(ms: int | None) -> str:
    if ms is None:
        return "forever"
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def day_closed(day_no: int, lookback_ms: int, now: int) -> bool:
    """Whether the day partition ``day_no`` (days since the epoch) takes no more ordinary
    writes: past its end by a counter lookback and an hour of slack. Maintenance merges such a
    day whole; a flush into it is written at the compaction level at once."""
    return (day_no + 1) * DAY_MS + lookback_ms + HOUR_MS <= now


def parse_time_ms(value: TimeLike, *, now: int | None = None) -> int:
    """A point in time as epoch milliseconds (UTC).

    Accepts datetimes (naive ones are taken as UTC), dates, ISO-8601 strings, epoch
    milliseconds (ints, or digit strings), ``"now"`` and relative forms ``"-30d"``, ``"-2h"``.
    """
    now = now_ms() if now is None else now
    if isinstance(value, bool):
        raise TimeRangeError(f"{value!r} is not a time")
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    if isinstance(value, date):
        return int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp() * 1000)
    if isinstance(value, int | float):
        return int(value)
    text = str(value).strip()
    if text == "now":
        return now
    if text.startswith(("-", "+")) and not text[1:].isdigit():
        sign = -1 if text[0] == "-" else 1
        return now + sign * parse_duration_ms(text[1:])
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise TimeRangeError(
            f"cannot parse time {value!r}: use an ISO-8601 time ('2026-03-03T12:00:00Z'), "
            "epoch milliseconds, 'now' or a relative form such as '-30d'"
        ) from exc
    return parse_time_ms(dt)


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def day_of(ms: int) -> str:
    return ms_to_datetime(ms).strftime("%Y-%m-%d")
