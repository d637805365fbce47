"""What the PromQL engine reads through: the leaf's read seam
(:class:`metricvault.protocols.SampleSource`), a store in memory for tests, and the tenant's
view of a store that the HTTP API evaluates over.

Every readable store (the embedded vault, InfluxDB, an opened snapshot) implements the seam
itself, so ``Engine(vault)`` needs no adapter; the store chooses the rollup tier from the
:class:`~metricvault.protocols.SelectHints` the engine sends (``select_buckets``).

Staleness: a series may carry Prometheus's stale marker, the NaN with the bit pattern
``0x7ff0000000000002`` (:data:`STALE_NAN`), in ``values``. Selectors drop it the way Prometheus
does (an instant selector whose latest sample is a marker yields nothing; range windows skip
markers). Any other NaN is an ordinary value. Stores keep markers and NaN samples as they
came, and ``select`` returns them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from metricvault.model import STALE_NAN_BITS
from metricvault.protocols import (
    BucketSelection,
    Horizons,
    SampleSource,
    SelectHints,
    SeriesSamples,
)
from metricvault.selector import Matcher

__all__ = [
    "STALE_NAN",
    "MemorySource",
    "SampleSource",
    "SeriesSamples",
    "TenantSource",
    "hints_for",
    "is_stale",
]

STALE_NAN: float = float(np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0])


def is_stale(values: np.ndarray) -> np.ndarray:
    """A boolean mask of the stale markers in a float64 array (other NaNs are values)."""
    bits = np.asarray(values, dtype=np.float64).view(np.uint64)
    return np.asarray(bits == np.uint64(STALE_NAN_BITS))


def hints_for(
    refs: np.ndarray, range_ms: int = 0, func: str | None = None, left_open: bool = False
) -> SelectHints:
    """The hints of a selection evaluated at the reference times ``refs`` (an arithmetic
    grid, or one time repeated where ``@`` pins it)."""
    step = int(refs[1] - refs[0]) if refs.size > 1 else 0
    return SelectHints(func, range_ms, step, int(refs.min()), int(refs.max()), left_open)


def _matches(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels.get(m.name)) for m in matchers)


@dataclass
class MemorySource:
    """Series held in memory (tests, fixtures, the oracle): ``add`` them, then query. Raw
    samples only: no rollups, nothing dropped by retention."""

    series: list[SeriesSamples] = field(default_factory=list)

    def add(self, labels: Mapping[str, str], ts: Iterable[int], values: Iterable[float]) -> None:
        order_ts = np.asarray(list(ts), dtype=np.int64)
        vals = np.asarray(list(values), dtype=np.float64)
        order = np.argsort(order_ts, kind="stable")
        self.series.append(SeriesSamples(dict(labels), order_ts[order], vals[order]))

    def all_series(self) -> Iterable[SeriesSamples]:
        """Every series held (a subclass may build them on demand)."""
        return self.series

    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        out = []
        for s in self.all_series():
            if not _matches(matchers, s.labels):
                continue
            lo = np.searchsorted(s.ts, start_ms, side="left")
            hi = np.searchsorted(s.ts, end_ms, side="right")
            if hi > lo:
                out.append(SeriesSamples(s.labels, s.ts[lo:hi], s.values[lo:hi]))
        return out

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        return None

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        return self.select(matchers, start_ms, end_ms)

    def horizons(self) -> Horizons:
        return Horizons()

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        return None


class TenantSource:
    """One tenant's view of a store, for the HTTP API: every read is narrowed to the series
    ``tenant`` matches, and those matchers run FIRST, before any of the user's. Matchers are
    applied in order, so a user's (expensive) regex never runs against another tenant's
    series: its cost cannot tell whether they exist (a timing side channel).

    ``truncated`` records whether a raw selection reached before ``raw_horizon_ms`` (default:
    the store's raw horizon), where retention dropped samples: the API warns about it."""

    def __init__(
        self,
        inner: SampleSource,
        tenant: Sequence[Matcher] = (),
        raw_horizon_ms: int | None = None,
    ) -> None:
        self.inner = inner
        self.tenant = tuple(tenant)
        self.raw_horizon_ms = (
            inner.horizons().raw_start_ms if raw_horizon_ms is None else raw_horizon_ms
        )
        self.truncated = False

    def _scoped(self, matchers: Sequence[Matcher]) -> list[Matcher]:
        return [*self.tenant, *matchers]

    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        if self.raw_horizon_ms and start_ms < self.raw_horizon_ms:
            self.truncated = True
        return self.inner.select(self._scoped(matchers), start_ms, end_ms, hints)

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        return self.inner.select_buckets(self._scoped(matchers), hints)

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        return self.inner.select_kept(self._scoped(matchers), start_ms, end_ms)

    def horizons(self) -> Horizons:
        return self.inner.horizons()

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        return self.inner.samples_per_row(tier, start_ms, end_ms)
