"""The read protocol the PromQL engine evaluates over, and its two implementations.

The engine asks a :class:`SampleSource` for the raw samples of the series a selector matches in
a closed time range and does everything else itself, so any store that can answer ``select``
(the embedded vault, InfluxDB, a snapshot, a test fixture) can be queried with PromQL.

Staleness: a series may carry Prometheus's stale marker, the NaN with the bit pattern
``0x7ff0000000000002`` (:data:`STALE_NAN`), in ``values``. Selectors drop it the way Prometheus
does (an instant selector whose latest sample is a marker yields nothing; range windows skip
markers). Any other NaN is an ordinary value. The vault stores markers and NaN samples as
they came (issue 13); :class:`VaultSource` reads them with ``query(..., stale_markers=True)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from metricvault.model import STALE_NAN_BITS
from metricvault.selector import Matcher, Selector

STALE_NAN: float = float(np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0])


def is_stale(values: np.ndarray) -> np.ndarray:
    """A boolean mask of the stale markers in a float64 array (other NaNs are values)."""
    bits = np.asarray(values, dtype=np.float64).view(np.uint64)
    return np.asarray(bits == np.uint64(STALE_NAN_BITS))


@dataclass
class SeriesSamples:
    """One series: ``labels`` include ``__name__``; ``ts`` (int64 ms, ascending, unique) and
    ``values`` (float64, may hold NaN and stale markers) have the same length."""

    labels: dict[str, str]
    ts: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        self.ts = np.asarray(self.ts, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.ts.shape != self.values.shape:
            raise ValueError(
                f"series {self.labels}: {self.ts.size} timestamps but {self.values.size} values; "
                "give one value per timestamp"
            )


class SampleSource(Protocol):
    """What the engine reads through: the samples in ``[start_ms, end_ms]`` (both ends
    included) of every series that all ``matchers`` match, one :class:`SeriesSamples` each."""

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]: ...


def _matches(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels.get(m.name)) for m in matchers)


@dataclass
class MemorySource:
    """Series held in memory (tests, fixtures, the oracle): ``add`` them, then query."""

    series: list[SeriesSamples] = field(default_factory=list)

    def add(self, labels: Mapping[str, str], ts: Iterable[int], values: Iterable[float]) -> None:
        order_ts = np.asarray(list(ts), dtype=np.int64)
        vals = np.asarray(list(values), dtype=np.float64)
        order = np.argsort(order_ts, kind="stable")
        self.series.append(SeriesSamples(dict(labels), order_ts[order], vals[order]))

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        out = []
        for s in self.series:
            if not _matches(matchers, s.labels):
                continue
            lo = np.searchsorted(s.ts, start_ms, side="left")
            hi = np.searchsorted(s.ts, end_ms, side="right")
            if hi > lo:
                out.append(SeriesSamples(s.labels, s.ts[lo:hi], s.values[lo:hi]))
        return out


class VaultSource:
    """The read protocol over a store's public read API (raw samples, so answers cover the
    raw retention window): its typed ``select_series`` read (the embedded vault: series
    straight from the data files, labels from the series index), or, for a store without
    one, ``query``'s long shape split back into series (the same samples, slower)."""

    def __init__(self, vault: Any) -> None:
        self.vault = vault

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        # The vault's range is half-open [start, end): ask for end + 1 to include end_ms.
        select_series = getattr(self.vault, "select_series", None)
        if select_series is None:
            return self.select_long(matchers, start_ms, end_ms)
        found = select_series(Selector(tuple(matchers)), start_ms, end_ms + 1, stale_markers=True)
        return [SeriesSamples(labels, ts, values) for labels, ts, values in found]

    def select_buckets(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, width_ms: int
    ) -> Any:
        """Per-bucket summaries for the rollup path (``promql.tiers``), or None where the
        store keeps no rollups the engine can read (InfluxDB, snapshots)."""
        buckets = getattr(self.vault, "buckets", None)
        if buckets is None:
            return None
        from metricvault.promql.tiers import from_table

        return from_table(buckets(str(Selector(tuple(matchers))), start_ms, end_ms, width_ms))

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        """How many raw samples a ``tier`` row summarises there (None: not known)."""
        measure = getattr(self.vault, "samples_per_row", None)
        return None if measure is None else float(measure(tier, start_ms, end_ms) or 0.0)

    @property
    def counter_lookback_ms(self) -> int:
        settings = getattr(self.vault, "settings", None)
        if settings is None:
            return 0
        from metricvault.durations import parse_duration_ms

        return parse_duration_ms(settings.counter_lookback)

    def raw_horizon(self) -> int:
        """Raw samples before this are gone (0: none dropped, or not known)."""
        catalog_version = getattr(self.vault, "catalog_version", None)
        return int(catalog_version().raw_horizon_ms or 0) if catalog_version else 0

    def rolled_up_until(self) -> int | None:
        """Rollups are complete before this (None: everywhere); later buckets would be
        computed from raw samples at query time, which is slower than reading them."""
        catalog_version = getattr(self.vault, "catalog_version", None)
        if catalog_version is None:
            return 0
        watermark: int | None = catalog_version().rollup_watermark_ms()
        return watermark

    def select_long(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        """The same series through ``query(..., output="arrow")`` (stores without
        ``select_series``; the equality test compares the two)."""
        table = self.vault.query(
            str(Selector(tuple(matchers))),
            start=start_ms,
            end=end_ms + 1,
            output="arrow",
            stale_markers=True,
        )
        if table.num_rows == 0:
            return []
        columns = table.column_names
        label_names = [c for c in columns if c not in ("timestamp", "metric", "value")]
        ts = table["timestamp"].cast("int64").to_numpy()
        values = table["value"].to_numpy(zero_copy_only=False).astype(np.float64)
        boundaries = np.zeros(table.num_rows, dtype=bool)
        boundaries[0] = True
        for name in ["metric", *label_names]:
            codes = table[name].combine_chunks().dictionary_encode().indices
            codes_np = codes.fill_null(-1).to_numpy(zero_copy_only=False)
            boundaries[1:] |= codes_np[1:] != codes_np[:-1]
        return _split_runs(table, ["metric", *label_names], boundaries, ts, values)


def _split_runs(
    table: Any, columns: list[str], boundaries: np.ndarray, ts: np.ndarray, values: np.ndarray
) -> list[SeriesSamples]:
    # Rows come ordered by series then time, so each series is one contiguous run.
    starts = np.flatnonzero(boundaries)
    ends = np.append(starts[1:], len(boundaries))
    out: list[SeriesSamples] = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        labels: dict[str, str] = {}
        for column in columns:
            value = table[column][lo].as_py()
            if value:
                labels["__name__" if column == "metric" else column] = str(value)
        order = np.argsort(ts[lo:hi], kind="stable")
        out.append(SeriesSamples(labels, ts[lo:hi][order], values[lo:hi][order]))
    return out
