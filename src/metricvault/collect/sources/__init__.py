"""Metric sources of the agent.

A source is a prometheus-client custom collector (``collect()`` yields metric families, called
on every scrape or push; built from `metricvault.collect.families`, so the edge agent can
collect a source without importing prometheus-client) that may also offer *fast readings*:
the few gauges (GPU utilisation, power) the agent samples at a high internal rate (default
10 Hz) to export per-window mean and max beside the instantaneous value. A source never
raises out of ``collect``: what a device or driver does not support is absent, with one log
line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from metricvault.collect.families import Metric


@dataclass(frozen=True)
class FastReading:
    """One high-rate reading: a DCGM metric name, its label values, and the value."""

    metric: str  # e.g. "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"
    labels: tuple[tuple[str, str], ...]  # sorted (name, value) pairs, as exported
    value: float


class Source(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]:
        """Metric families for one scrape (prometheus-client's custom-collector protocol)."""
        ...

    def fast_readings(self) -> Sequence[FastReading]:
        """Cheap readings for high-rate sampling ([] when the source has none)."""
        ...

    def close(self) -> None: ...
