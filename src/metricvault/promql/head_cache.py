"""Recent raw samples kept between the queries of one engine: the rules of a group, evaluated at
one time, read the same metrics over windows of minutes to an hour, and each read would decode
and slice the same files again.

Per selector (its matchers), the samples of the last read are kept: at least the hour
(:data:`HEAD_MS`) before its end, so the instant selector, the 5-minute and the 1-hour window
of a metric share one read. A later read inside that span is a slice of the kept arrays, the
same samples the store returns (staleness markers and NaN included); one that reaches past
the span's end (the next group's later time), or comes after a flush, reads the store only
from the span's end on (its samples at that end time too) and appends them; one that starts
before the span reads it all again. Whether the kept samples still hold is the store's
catalog version, compared as the query-result cache compares it
(:func:`metricvault.promql.result_cache.still_holds`) up to just before the span's end: a raw
file with an older sample (late data), any rollup or compaction drops them; files of samples
at the span's end or after (the scrapes since, a rule group's own writes at its evaluation
time) are what the read from the end on takes in. Buffered samples are flushed before
comparing, as every read flushes them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metricvault.promql.result_cache import CatalogVersion, Version, still_holds
from metricvault.promql.source import TenantSource
from metricvault.promql.window_cache import catalog_of
from metricvault.protocols import SampleSource, SeriesSamples
from metricvault.selector import Matcher

HEAD_MS = 3_600_000 + 300_000  # the widest window of shipped rules, and a lookback
MAX_SAMPLES = 20_000_000  # kept across selectors (about 320 MB), least recently used out


@dataclass
class _Kept:
    version: Version
    start: int
    end: int
    series: list[SeriesSamples]
    samples: int


class HeadCache:
    """The recent raw samples of one engine's selectors (see the module's text); thread-safe."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._kept: OrderedDict[tuple[Matcher, ...], _Kept] = OrderedDict()
        self._samples = 0
        self._lock = threading.Lock()
        self.hits = 0  # reads answered from kept samples alone
        self.extended = 0  # ... with the samples from the kept span's end read anew
        self.reads = 0  # reads of the whole span

    def __len__(self) -> int:
        return len(self._kept)

    def select(
        self, source: SampleSource, matchers: Sequence[Matcher], lo: int, hi: int, hints: Any
    ) -> list[SeriesSamples]:
        """``source.select(matchers, lo, hi, hints)``, from kept samples where they hold."""
        catalog = catalog_of(source)
        snap = catalog() if catalog is not None else None
        if snap is None or hi - lo > HEAD_MS:
            return source.select(matchers, lo, hi, hints)
        key = tuple(matchers)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and not still_holds(kept.version, snap, kept.end - 1):
                self._drop(key)
                kept = None
            if kept is not None and kept.start <= lo:
                self._kept.move_to_end(key)
                if hi <= kept.end and kept.version.version == snap.version:
                    self.hits += 1
                    return _sliced(kept.series, lo, hi)
                since = kept.end
            else:
                kept = None
        if kept is not None:
            # newer samples, or files of samples at kept.end or after: those read anew, outside
            # the lock (the queries of other selectors do not wait for this read)
            fresh = source.select(matchers, since, max(hi, since))
            with self._lock:
                if self._kept.get(key) is kept and kept.end == since:
                    self._extend(key, kept, fresh, max(hi, since), snap)
                    self.extended += 1
                    return _sliced(kept.series, lo, hi)
            # another query of this selector changed the kept samples meanwhile: read it all
            return source.select(matchers, lo, hi, hints)
        start = min(lo, hi - HEAD_MS)
        horizon = source.horizons().raw_start_ms
        if start < horizon <= lo:
            start = horizon  # not widened to where raw samples are gone (a tenant's warning)
        found = source.select(matchers, start, hi)
        self.reads += 1
        size = sum(int(s.ts.size) for s in found)
        with self._lock:
            self._drop(key)
            if size <= self.max_samples:
                self._kept[key] = _Kept(Version.of(snap), start, hi, found, size)
                self._samples += size
                self._bound()
        return _sliced(found, lo, hi) if start < lo else found

    def _extend(
        self,
        key: tuple[Matcher, ...],
        kept: _Kept,
        fresh: list[SeriesSamples],
        end: int,
        snap: CatalogVersion,
    ) -> None:
        """``kept`` with its samples at ``kept.end`` and after replaced by ``fresh`` (the
        store's samples of ``[kept.end, end]``), its oldest beyond two heads dropped."""
        start = kept.start if end - kept.start <= 2 * HEAD_MS else end - HEAD_MS
        by_labels = {_key(s): s for s in fresh}
        series = []
        for s in kept.series:
            new = by_labels.pop(_key(s), None)
            a = int(np.searchsorted(s.ts, start, "left"))
            b = int(np.searchsorted(s.ts, kept.end, "left"))
            if new is None:
                if b > a:
                    series.append(SeriesSamples(s.labels, s.ts[a:b], s.values[a:b]))
                continue
            ts, values = (
                np.concatenate([s.ts[a:b], new.ts]),
                np.concatenate([s.values[a:b], new.values]),
            )
            series.append(SeriesSamples(s.labels, ts, values))
        series += by_labels.values()  # series whose first samples are the newest
        size = sum(int(s.ts.size) for s in series)
        self._samples += size - kept.samples
        kept.series, kept.samples, kept.start, kept.end = series, size, start, end
        kept.version = Version.of(snap)
        self._bound()

    def _bound(self) -> None:
        while self._samples > self.max_samples and self._kept:
            self._drop(next(iter(self._kept)))

    def _drop(self, key: tuple[Matcher, ...]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._samples -= kept.samples


def _key(s: SeriesSamples) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(s.labels.items()))


def _sliced(series: list[SeriesSamples], lo: int, hi: int) -> list[SeriesSamples]:
    out = []
    for s in series:
        a = int(np.searchsorted(s.ts, lo, "left"))
        b = int(np.searchsorted(s.ts, hi, "right"))
        if b > a:
            out.append(SeriesSamples(s.labels, s.ts[a:b], s.values[a:b]))
    return out


class TenantHeads(HeadCache):
    """One head cache shared by the queries of every tenant of an API (each HTTP query has
    its own engine): a dashboard's refresh of a panel over the last hour reads from the store
    only the samples since its previous read. A tenant's view (:class:`TenantSource`) is kept
    under its own matchers, tenant matchers first, as its reads run; its ``truncated`` note
    is set as its own read would set it."""

    def select(
        self, source: SampleSource, matchers: Sequence[Matcher], lo: int, hi: int, hints: Any
    ) -> list[SeriesSamples]:
        if not isinstance(source, TenantSource):
            return super().select(source, matchers, lo, hi, hints)
        if source.raw_horizon_ms and lo < source.raw_horizon_ms:
            source.truncated = True
        return super().select(source.inner, [*source.tenant, *matchers], lo, hi, hints)
