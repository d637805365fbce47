"""High-rate sampling without inflation: the agent reads GPU utilisation and power ten times a
second and exports, beside the instantaneous DCGM gauge, their mean and max over the window
since the previous scrape — so a 5 s or 15 s scrape neither misses a short spike nor reports a
GPU that was busy for one instant as busy all along.

The rate backs off (halves, down to ``min_hz``) while the host is loaded above ``load_high``
(1-minute load per CPU) or while sampling itself takes more than a tenth of its interval, and
recovers (doubles, up to ``hz``) when the load falls below ``load_low``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from metricvault.collect.sources import FastReading, Source

log = logging.getLogger("metricvault.agent")

Key = tuple[str, tuple[tuple[str, str], ...]]
# Exported names of the window statistics, by the DCGM metric they summarise.
WINDOW_NAMES = {
    "DCGM_FI_DEV_GPU_UTIL": ("metricvault_gpu_util_window", "GPU utilisation (%)"),
    "DCGM_FI_DEV_POWER_USAGE": ("metricvault_gpu_power_watts_window", "GPU power draw (W)"),
}


@dataclass(frozen=True)
class WindowStat:
    metric: str
    labels: tuple[tuple[str, str], ...]
    mean: float
    max: float
    samples: int


class FastSampler:
    """A daemon thread reading every source's fast readings at an adaptive rate."""

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        hz: float = 10.0,
        min_hz: float = 1.0,
        load_high: float = 0.9,
        load_low: float = 0.6,
        keep_s: float = 300.0,
        load: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < min_hz <= hz:
            raise ValueError(f"sample rates must satisfy 0 < min_hz <= hz, got {min_hz}, {hz}")
        self.sources = list(sources)
        self.target_hz, self.min_hz, self.hz = hz, min_hz, hz
        self.load_high, self.load_low = load_high, load_low
        self.keep_s = keep_s
        self._load = load
        self._clock = clock
        self._series: dict[Key, _Ring] = {}
        self._next_prune = -math.inf
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_taken = 0
        self.backoffs = 0

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        if self.sources and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fast-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        next_check = self._clock()
        while not self._stop.is_set():
            began = self._clock()
            self.sample_once(began)
            spent = self._clock() - began
            if began >= next_check:
                self._adapt(spent)
                next_check = began + 1.0
            self._stop.wait(max(0.0, 1.0 / self.hz - spent))

    def sample_once(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        readings: list[FastReading] = []
        for source in self.sources:
            try:
                readings.extend(source.fast_readings())
            except Exception:  # a source must not stop the sampler; it logs its own errors
                log.exception("fast readings of %s failed", getattr(source, "name", source))
        with self._lock:
            for r in readings:
                ring = self._series.get((r.metric, r.labels))
                if ring is None:
                    ring = self._series[(r.metric, r.labels)] = _Ring(
                        int(self.keep_s * self.hz) + 1
                    )
                ring.append(now, r.value)
            self.samples_taken += 1
            self._forget_stale(now)

    def _forget_stale(self, now: float) -> None:
        """Drop the rings of series not read for ``keep_s``: a series' labels may change (a GPU
        gets a pod's labels and loses them when the pod ends), and a ring is 16 bytes a reading
        for ``keep_s * hz`` readings, so a node running many short jobs would otherwise grow."""
        if now < self._next_prune:
            return
        self._next_prune = now + 1.0
        stale = [key for key, ring in self._series.items() if ring.newest() < now - self.keep_s]
        for key in stale:
            del self._series[key]

    def _adapt(self, spent: float) -> None:
        load = self._load() if self._load else 0.0
        too_costly = spent > 0.1 / self.hz
        if (load > self.load_high or too_costly) and self.hz > self.min_hz:
            self.hz = max(self.min_hz, self.hz / 2)
            self.backoffs += 1
            log.info("host load %.2f per CPU: sampling at %.2g Hz", load, self.hz)
        elif load < self.load_low and not too_costly and self.hz < self.target_hz:
            self.hz = min(self.target_hz, self.hz * 2)

    # ------------------------------------------------------------------ reading
    def window(self, seconds: float, now: float | None = None) -> list[WindowStat]:
        """Mean and max of each fast series over the last ``seconds``."""
        now = self._clock() if now is None else now
        since = now - seconds
        stats = []
        with self._lock:
            for (metric, labels), ring in self._series.items():
                values = ring.since(since)
                if values:
                    stats.append(
                        WindowStat(
                            metric, labels, sum(values) / len(values), max(values), len(values)
                        )
                    )
        return stats


class _Ring:
    """The last ``capacity`` (time, value) readings of one series in two flat float arrays
    (16 bytes a reading rather than ~100 for a tuple of floats: the agent's memory budget)."""

    def __init__(self, capacity: int) -> None:
        self.times = array("d", [0.0]) * capacity
        self.values = array("d", [0.0]) * capacity
        self.next = 0
        self.size = 0

    def append(self, t: float, value: float) -> None:
        self.times[self.next] = t
        self.values[self.next] = value
        self.next = (self.next + 1) % len(self.times)
        self.size = min(self.size + 1, len(self.times))

    def newest(self) -> float:
        """Time of the newest reading (-inf while empty)."""
        return self.times[(self.next - 1) % len(self.times)] if self.size else -math.inf

    def since(self, t: float) -> list[float]:
        """Values read after time ``t``, oldest first."""
        cap = len(self.times)
        out = []
        for k in range(self.size, 0, -1):
            i = (self.next - k) % cap
            if self.times[i] > t:
                out.append(self.values[i])
        return out


def window_families(stats: Iterable[WindowStat], window_s: float) -> list[Metric]:
    """Gauge families ``<name>_mean`` / ``<name>_max`` for the window statistics."""
    families: dict[str, GaugeMetricFamily] = {}
    for stat in stats:
        base, what = WINDOW_NAMES.get(stat.metric, (f"{stat.metric}_window", stat.metric))
        for agg, value in (("mean", stat.mean), ("max", stat.max)):
            name = f"{base}_{agg}"
            family = families.get(name)
            if family is None:
                family = GaugeMetricFamily(
                    name,
                    f"{agg.capitalize()} of {what} sampled at high rate over the last "
                    "scrape window (see metricvault_agent_window_seconds)",
                )
                families[name] = family
            # by name, not position: series of one metric may differ in their label names
            # (a GPU a pod holds has namespace/pod/container, another GPU has not)
            family.add_sample(name, dict(stat.labels), value)
    return [*families.values()]
