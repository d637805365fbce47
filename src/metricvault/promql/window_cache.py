"""Long windows of rules, kept between evaluations: a 28-day ``avg_over_time`` re-evaluated every
30 s reads only what entered its window since the last evaluation.

A rule's window of days that starts before the raw horizon is answered from rollup rows
(tiers.py): its end and length moved to whole minutes (``T'``, ``R'``), the whole hours inside
it as 1h rows and its ragged edges as 1m rows, the last of them at ``T'`` itself. Evaluated again
30 s later, the window has slid by 30 s: the whole hours inside it are the same (until its
start or end crosses an hour), only its edges moved. So per (selector, window length) this
module keeps, for every series:

- the sums, counts, minima, maxima and merged quantile sketch counts of the 1h rows of the
  whole hours ``[a, b)`` inside the window, read once (``a``, ``b`` whole hours), and the
  same per hour;
- the 1m rows of the hour ``[a - 1h, a)`` that holds the window's start, per minute, so the
  leading edge ``[T' - R', a)`` is a slice of them at any ``T'`` in that hour;
- the same sums of the raw samples in ``[b, T']`` (raw samples are kept there: it is the
  last hour), extended by the samples after the last evaluation's ``T'`` only.

An evaluation then reads the raw samples of the last 30 s and adds three sets of per-series
vectors. The whole hours are kept hour by hour too (a ring of one column per hour and
series, and each hour's sketch counts), so the window slides across an hour without being
read again: when its end crosses into a new hour, the raw samples of the hour just
finished (the last part, and those read after it) become one more whole hour, the raw
samples from the new hour on starting the last part afresh; when its start crosses an
hour, the oldest whole hour leaves (its sketch counts subtracted, exactly, as integers;
the sums, minima and maxima reduced again over the ring, which costs far less than any
file read) and the 1m rows of the new start's hour are read. The finished hour's raw
samples are those its 1h row summarises (raw samples are kept there); a rollup written
since, or a late sample, changes the catalog version and drops the entry (below). A window
gone back in time, or moved by more than half its length, is read again from the store.

Whether an entry still holds is the store's catalog version, compared as the query-result
cache compares it (:func:`metricvault.promql.result_cache.still_holds`): maintenance
(rollups, compaction, retention, a kind change) drops every entry; a raw file with a sample
not after the newest time read (late data) drops it; raw files of newer samples only
(ordinary flushes, the rules' own writes at the evaluation time) keep it. Before comparing,
buffered samples are flushed, as every read does.

The answer is the one tiers.py computes from the same rows for the same moved window: the
same samples in each part, so counts, minima, maxima and quantiles are equal, and sums and
averages equal to within float rounding (the parts are summed in another order). Only the
functions whose rows compose (``sum/count/avg/min/max_over_time``, ``quantile_over_time``),
at one evaluation time (rule and instant queries), over a store with a catalog version, for
windows of at least :data:`MIN_RANGE_MS` that start before the raw horizon; anything else
(and any row without a sketch, for a quantile) takes the ordinary path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from metricvault.promql.parse import duration_ms
from metricvault.promql.result_cache import CatalogVersion, Version, still_holds
from metricvault.promql.values import Labels, StepVector, drop_name, make_labels
from metricvault.protocols import BucketSelection, SelectHints
from metricvault.selector import Matcher

if TYPE_CHECKING:
    from metricvault.promql.eval import Evaluator

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
SLOTS = HOUR_MS // MINUTE_MS  # 1m rows of the leading hour
MIN_RANGE_MS = 6 * HOUR_MS  # shorter windows hold too few whole hours to gain from keeping
MAX_CELLS = 16_000_000  # numbers kept across entries (about 128 MB), least recently used out
FUNCTIONS = frozenset(
    {"sum_over_time", "count_over_time", "avg_over_time", "min_over_time", "max_over_time",
     "quantile_over_time"}
)  # fmt: skip
# The function named to the store for the rows: it plans rows alike for any of these, and
# reads the rows' quantile sketches (two thirds of a row's bytes) only for a quantile.
_ROW_HINT = {False: "sum_over_time", True: "quantile_over_time"}


def catalog_of(source: Any) -> Callable[[], CatalogVersion | None] | None:
    """The catalog version of the store behind ``source`` (through a tenant's view), after
    flushing what is buffered, as every read of the store does; None: the store has none."""
    from metricvault.protocols import capabilities_of

    store = getattr(source, "inner", source)
    if "catalog" not in capabilities_of(store):
        return None  # e.g. InfluxDB: nothing to compare, nothing kept
    version = store.catalog_version
    flush = getattr(store, "flush_for_read", None)

    def current() -> CatalogVersion | None:
        if flush is not None:
            flush()
        snap: CatalogVersion | None = version()
        return snap

    return current


@dataclass
class _Parts:
    """Per-series sums over some rows or samples; ``sketch`` (series x vocabulary) counts."""

    total: np.ndarray
    count: np.ndarray
    low: np.ndarray
    high: np.ndarray
    sketch: np.ndarray

    @classmethod
    def empty(cls, series: int, codes: int) -> _Parts:
        return cls(np.zeros(series), np.zeros(series), np.full(series, np.nan),
                   np.full(series, np.nan), np.zeros((series, codes), np.int64))  # fmt: skip


@dataclass
class _Entry:
    version: Version
    inner: tuple[int, int]  # [a, b): whole hours
    labels: list[Labels]
    index: dict[Labels, int]
    vocab: np.ndarray  # sorted sketch codes; columns of every sketch matrix
    sketches: bool  # every row read holds a sketch
    tiers: tuple[str, ...]
    inner_parts: _Parts  # the whole hours [a, b) together, reduced from the ring below
    # the whole hours one by one: column (hour // 1h) % ring size; hours outside [a, b)
    # cleared (0 sums and counts, NaN minima and maxima); sketch counts by hour start
    hour_total: np.ndarray
    hour_count: np.ndarray
    hour_low: np.ndarray
    hour_high: np.ndarray
    hour_codes: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # series, code, n
    # the 1m rows of [a - 1h, a) by minute slot: (series, SLOTS) each
    lead_total: np.ndarray
    lead_count: np.ndarray
    lead_low: np.ndarray
    lead_high: np.ndarray
    lead_codes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # series, slot, code, n
    trail: _Parts  # raw samples in [b, trail_end]
    trail_end: int
    want_sketches: bool = False
    # the answer's row order (by label set) and its label sets (without the metric name);
    # None: to be worked out (again, after a series came)
    answer: tuple[np.ndarray, list[Labels]] | None = None

    @property
    def cells(self) -> int:
        s, v = len(self.labels), self.vocab.size
        hours = sum(int(c[0].size) for c in self.hour_codes.values()) * 3 // 2  # int32s
        ring = 4 * int(self.hour_total.shape[1])
        return s * (4 * SLOTS + 2 * v + 8 + ring) + int(self.lead_codes[0].size) * 4 + hours


class WindowCache:
    """The long windows of one engine's rules (see the module's text); thread-safe."""

    def __init__(self, max_cells: int = MAX_CELLS) -> None:
        self.max_cells = max_cells
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0  # entries read from the store in full
        self.slides = 0  # entries moved across an hour, reading that hour's rows only
        self.updates = 0  # evaluations answered from a kept entry
        self.invalidated = 0  # entries dropped because the catalog showed a change

    def __len__(self) -> int:
        return len(self._entries)

    def range_call(
        self, ev: Evaluator, name: str, ms: Any, steps: np.ndarray, args: list[Any]
    ) -> StepVector | None:
        """``name(ms)`` at the one step of ``steps`` from kept parts, or None where this
        module does not answer it (the ordinary path does)."""
        if name not in FUNCTIONS or steps.size != 1 or ev.options.left_open_windows:
            return None
        catalog = catalog_of(ev.source)
        if catalog is None:
            return None
        range_ms = duration_ms(ms.range)
        if range_ms < MIN_RANGE_MS:
            return None
        t = int(ev.reference_times(ms.vector_selector, steps)[0])
        horizon = ev.source.horizons().raw_start_ms
        end = t // MINUTE_MS * MINUTE_MS
        length = max(MINUTE_MS, round(range_ms / MINUTE_MS) * MINUTE_MS)
        start = end - length
        if not horizon or t - range_ms >= horizon or start >= horizon:
            return None  # within raw retention the rows answer exactly elsewhere, or raw
        a, b = -(-start // HOUR_MS) * HOUR_MS, end // HOUR_MS * HOUR_MS
        if b - a < 2 * HOUR_MS or b < horizon:
            return None
        q = float(ev.eval_scalar(args[0], steps)[0]) if name == "quantile_over_time" else 0.0
        matchers = tuple(ev.matchers(ms.vector_selector))
        with self._lock:
            snap = catalog()
            if snap is None:
                return None
            sketches = name == "quantile_over_time"
            key = (matchers, length, sketches)
            entry = self._current(key, snap, (a, b), end)
            moved = entry is not None and entry.inner != (a, b)
            if moved and entry is not None and not self._slide(ev, matchers, entry, (a, b), end):
                del self._entries[key]
                entry = None
            if entry is None:
                entry = self._build(ev, matchers, snap, (a, b), end, sketches, length)
                if entry is None:
                    return None
                self._keep(key, entry)
            else:
                self._extend(ev, matchers, entry, snap, end)
            if sketches and not entry.sketches:
                return None  # rows without one: tiers.py leaves those steps out, and says so
            value, ok = _finish(name, entry, start, q)
            if entry.answer is None:
                entry.answer = _answer_rows(entry.labels)
            order, names = entry.answer
            tiers = entry.tiers
        if len(set(names)) != len(names):
            return None  # two series the same without their name: the ordinary path says so
        ok = ok[order]
        rows = np.flatnonzero(ok)
        labels = [names[i] for i in rows.tolist()]
        ev.limits.selected(labels)
        ev.limits.reserve(len(labels))
        _annotate(ev, name, tiers, t, range_ms)
        if not labels:
            return StepVector.empty(1)
        present = np.ones((rows.size, 1), dtype=bool)
        return StepVector(labels, value[order][rows][:, None].astype(np.float64), present)

    # ------------------------------------------------------------------ entries
    def _current(
        self, key: tuple[Any, ...], snap: CatalogVersion, inner: tuple[int, int], end: int
    ) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not still_holds(entry.version, snap, entry.trail_end):
            del self._entries[key]
            self.invalidated += 1
            return None
        a, b = inner
        old_a, old_b = entry.inner
        back = end < entry.trail_end or a < old_a or b < old_b
        if back or a >= old_b or (b - old_b) * 2 > entry.hour_total.shape[1] * HOUR_MS:
            del self._entries[key]  # gone back, or moved too far to slide: read anew
            return None
        if entry.inner != inner and entry.want_sketches and not entry.sketches:
            del self._entries[key]  # an hour without a sketch may be leaving: read anew
            return None
        self._entries.move_to_end(key)
        return entry

    def _keep(self, key: tuple[Any, ...], entry: _Entry) -> None:
        self._entries[key] = entry
        while sum(e.cells for e in self._entries.values()) > self.max_cells and self._entries:
            self._entries.popitem(last=False)

    def _build(
        self,
        ev: Evaluator,
        matchers: Sequence[Matcher],
        snap: CatalogVersion,
        inner: tuple[int, int],
        end: int,
        sketches: bool,
        length: int,
    ) -> _Entry | None:
        a, b = inner
        source = ev.source
        hint = _ROW_HINT[sketches]
        hours = source.select_buckets(matchers, SelectHints(hint, b - a, 0, b, b))
        if hours is None or hours.width_ms != HOUR_MS or hours.shifted:
            return None
        lead_at = a - MINUTE_MS  # windows [a - 1h, a - 1m]: the 1m rows of [a - 1h, a)
        minutes = source.select_buckets(
            matchers, SelectHints(hint, HOUR_MS - MINUTE_MS, 0, lead_at, lead_at)
        )
        if minutes is None or minutes.width_ms != MINUTE_MS:
            return None
        raw = source.select(matchers, b, end)
        self.builds += 1
        labels: dict[Labels, int] = {}
        for sel in (hours, minutes):
            for s in sel.series:
                labels.setdefault(make_labels(s.labels.items()), len(labels))
        for r in raw:
            labels.setdefault(make_labels(r.labels.items()), len(labels))
        inner_rows = _rows(hours, a, b, sketches)
        lead_rows = _rows(minutes, a - HOUR_MS, a, sketches)
        trail_values = [(labels[make_labels(r.labels.items())], r.values) for r in raw]
        trail_values = [(i, v[np.isfinite(v)]) for i, v in trail_values]
        vocab = np.zeros(0, np.int64)
        if sketches:
            codes = [c["codes"] for _, c, _ in inner_rows + lead_rows]
            mapping = _mapping()
            codes += [mapping.codes(v).astype(np.int64) for _, v in trail_values]
            vocab = np.unique(np.concatenate(codes)) if codes else vocab
        n, v = len(labels), vocab.size
        ring = length // HOUR_MS + 2  # whole hours inside any window of this length, and one
        entry = _Entry(
            Version.of(snap), inner, list(labels), labels, vocab,
            sketches and all(ok for _, _, ok in inner_rows + lead_rows),
            tuple(dict.fromkeys([*hours.tiers, *minutes.tiers])),
            _Parts.empty(n, v), np.zeros((n, ring)), np.zeros((n, ring)),
            np.full((n, ring), np.nan), np.full((n, ring), np.nan), {},
            np.zeros((n, SLOTS)), np.zeros((n, SLOTS)),
            np.full((n, SLOTS), np.nan), np.full((n, SLOTS), np.nan),
            (np.zeros(0, np.int64),) * 4,
            _Parts.empty(n, v), end, sketches,
        )  # fmt: skip
        _add_rows(entry, inner_rows, labels)
        _reduce_hours(entry)
        _add_lead(entry, lead_rows, labels, a - HOUR_MS)
        _add_samples(entry, trail_values)
        return entry

    def _slide(
        self,
        ev: Evaluator,
        matchers: Sequence[Matcher],
        entry: _Entry,
        inner: tuple[int, int],
        end: int,
    ) -> bool:
        """Moves the entry's whole hours to ``inner`` and its last part to ``end``: the hours
        its end entered from the raw samples of the last part and those read after it, the
        hours its start left dropped, and the 1m rows of the new start's hour read; False:
        the store did not answer those as 1m rows (the entry is read anew)."""
        a, b = inner
        old_a, old_b = entry.inner
        source = ev.source
        minutes = None
        if a > old_a:
            lead_at = a - MINUTE_MS
            hint = _ROW_HINT[entry.want_sketches]
            minutes = source.select_buckets(
                matchers, SelectHints(hint, HOUR_MS - MINUTE_MS, 0, lead_at, lead_at)
            )
            if minutes is None or minutes.width_ms != MINUTE_MS:
                return False
        self.slides += 1
        lead_rows = _rows(minutes, a - HOUR_MS, a, entry.want_sketches) if minutes else []
        for lab, _, _ in lead_rows:
            if lab not in entry.index:
                _grow_series(entry, lab)
        if entry.want_sketches:
            codes = [c["codes"] for _, c, _ in lead_rows]
            missing = np.setdiff1d(np.concatenate(codes), entry.vocab) if codes else None
            if missing is not None and missing.size:
                _grow_vocab(entry, missing)
            entry.sketches = entry.sketches and all(ok for _, _, ok in lead_rows)
        for hour in range(old_a, min(a, old_b), HOUR_MS):
            _drop_hour(entry, hour)
        if minutes is not None:
            n = len(entry.labels)
            entry.lead_total, entry.lead_count = np.zeros((n, SLOTS)), np.zeros((n, SLOTS))
            entry.lead_low = np.full((n, SLOTS), np.nan)
            entry.lead_high = np.full((n, SLOTS), np.nan)
            entry.lead_codes = (np.zeros(0, np.int64),) * 4
            _add_lead(entry, lead_rows, entry.index, a - HOUR_MS)
            entry.tiers = tuple(dict.fromkeys([*entry.tiers, *minutes.tiers]))
        if b > old_b:
            # the last part holds the raw samples of [old_b, trail_end], all in hour old_b
            # (the last evaluation's end was before b): it becomes that hour; the raw
            # samples after it go to their hours before b, and to the new last part from b
            _trail_to_hour(entry, old_b)
            found = []
            for r in source.select(matchers, entry.trail_end + 1, end):
                key = make_labels(r.labels.items())
                i = entry.index.get(key)
                found.append((_grow_series(entry, key) if i is None else i, r.ts, r.values))
            _add_raw_hours(entry, [(i, ts[ts < b], v[ts < b]) for i, ts, v in found])
            _add_samples(entry, [(i, v[ts >= b]) for i, ts, v in found])
            entry.trail_end = max(entry.trail_end, end)
        entry.inner = inner
        _reduce_hours(entry)
        return True

    def _extend(
        self,
        ev: Evaluator,
        matchers: Sequence[Matcher],
        entry: _Entry,
        snap: CatalogVersion,
        end: int,
    ) -> None:
        """The raw samples after the entry's last read up to ``end``, added to its last part."""
        self.updates += 1
        if end > entry.trail_end:
            found = []
            for r in ev.source.select(matchers, entry.trail_end + 1, end):
                key = make_labels(r.labels.items())
                i = entry.index.get(key)
                if i is None:
                    i = _grow_series(entry, key)
                found.append((i, r.values))
            _add_samples(entry, found)
            entry.trail_end = end
        if entry.version.version != snap.version:  # only newer raw files came
            entry.version = Version.of(snap)


# ---------------------------------------------------------------------- the parts
_Rows = list[tuple[Labels, dict[str, np.ndarray], bool]]


def _rows(sel: BucketSelection, lo: int, hi: int, sketches: bool) -> _Rows:
    """Each series' rows with ``lo <= ts < hi`` holding a finite sample, and whether every
    one of them keeps a quantile sketch; the sketch arrays cut to those rows (``sketches``:
    else none)."""
    out: _Rows = []
    for s in sel.series:
        c = s.columns
        ts = c["ts"]
        a, b = int(np.searchsorted(ts, lo, "left")), int(np.searchsorted(ts, hi, "left"))
        if b <= a:
            continue
        held = c["count"][a:b] > 0
        cols = {k: c[k][a:b][held] for k in ("ts", "count", "sum", "min", "max")}
        start, stop = c["sketch_start"][a:b][held], c["sketch_end"][a:b][held]
        keeps = c["sketch_held"][a:b][held]
        if sketches and start.size:
            flat = slice(int(start[0]), int(stop[-1]))
            cols["codes"] = c["sketch_codes"][flat].astype(np.int64)
            cols["counts"] = c["sketch_counts"][flat].astype(np.int64)
            cols["lengths"] = (stop - start).astype(np.int64)
        else:
            cols["codes"] = cols["counts"] = cols["lengths"] = np.zeros(0, np.int64)
        out.append((make_labels(s.labels.items()), cols, bool(keeps.all())))
    return out


def _add_rows(entry: _Entry, rows: _Rows, labels: dict[Labels, int]) -> None:
    """1h rows into the ring of whole hours (and their sketch counts, by hour, into the
    merged counts of the whole hours)."""
    ring = entry.hour_total.shape[1]
    series, hours, codes, counts = [], [], [], []
    for lab, c, _ in rows:
        i = labels[lab]
        col = (c["ts"] // HOUR_MS % ring).astype(np.int64)
        entry.hour_total[i, col] = c["sum"]
        entry.hour_count[i, col] = c["count"]
        entry.hour_low[i, col] = c["min"]
        entry.hour_high[i, col] = c["max"]
        if c["codes"].size:
            series.append(np.full(c["codes"].size, i, np.int64))
            hours.append(np.repeat(c["ts"].astype(np.int64), c["lengths"]))
            codes.append(c["codes"])
            counts.append(c["counts"])
    if not series:
        return
    s, h, code, n = (np.concatenate(x) for x in (series, hours, codes, counts))
    order = np.argsort(h, kind="stable")
    s, h, code, n = s[order], h[order], code[order], n[order]
    starts, cuts = np.unique(h, return_index=True)
    for hour, part in zip(starts.tolist(), np.split(np.arange(h.size), cuts[1:]), strict=True):
        entry.hour_codes[int(hour)] = _compact(s[part], code[part], n[part])
    _sketch_add(entry, s, code, n)


def _sketch_add(entry: _Entry, series: np.ndarray, codes: np.ndarray, n: np.ndarray) -> None:
    """Sketch counts ``n`` of ``codes`` (sketch codes, in the vocabulary) per ``series`` into
    the whole hours' merged counts; negative ``n`` takes them out (counts subtract exactly)."""
    sketch = entry.inner_parts.sketch
    width = entry.vocab.size
    flat = series.astype(np.int64) * width + np.searchsorted(entry.vocab, codes)
    cells = np.bincount(flat, n.astype(np.float64), sketch.size)
    sketch += np.rint(cells).astype(np.int64).reshape(sketch.shape)


def _drop_hour(entry: _Entry, hour: int) -> None:
    """The whole hour starting at ``hour`` out of the ring and the merged sketch counts."""
    col = hour // HOUR_MS % entry.hour_total.shape[1]
    entry.hour_total[:, col] = 0.0
    entry.hour_count[:, col] = 0.0
    entry.hour_low[:, col] = np.nan
    entry.hour_high[:, col] = np.nan
    codes = entry.hour_codes.pop(hour, None)
    if codes is not None:
        _sketch_add(entry, codes[0], codes[1], -codes[2])


def _trail_to_hour(entry: _Entry, hour: int) -> None:
    """The last part (raw samples, all in the hour starting at ``hour``) into that hour of
    the ring, and emptied."""
    t = entry.trail
    col = hour // HOUR_MS % entry.hour_total.shape[1]
    entry.hour_total[:, col] += t.total
    entry.hour_count[:, col] += t.count
    entry.hour_low[:, col] = np.fmin(entry.hour_low[:, col], t.low)
    entry.hour_high[:, col] = np.fmax(entry.hour_high[:, col], t.high)
    series, at = np.nonzero(t.sketch)
    if series.size:
        _hour_codes(entry, hour, series, entry.vocab[at], t.sketch[series, at])
    entry.trail = _Parts.empty(len(entry.labels), entry.vocab.size)


def _add_raw_hours(entry: _Entry, found: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
    """Raw samples ``(series, times, values)`` into the hours of the ring they fall in
    (non-finite ones left out, as rollup rows leave them out)."""
    found = [(i, ts, v) for i, ts, v in found if v.size]
    if not found:
        return
    idx = np.concatenate([np.full(v.size, i, np.int64) for i, _, v in found])
    ts = np.concatenate([t for _, t, _ in found])
    v = np.concatenate([v for _, _, v in found])
    finite = np.isfinite(v)
    idx, ts, v = idx[finite], ts[finite], v[finite]
    if not v.size:
        return
    ring, n = entry.hour_total.shape[1], len(entry.labels)
    hours = ts // HOUR_MS * HOUR_MS
    codes = _mapping().codes(v).astype(np.int64) if entry.sketches else None
    if codes is not None:
        missing = np.setdiff1d(codes, entry.vocab)
        if missing.size:
            _grow_vocab(entry, missing)
    for hour in np.unique(hours).tolist():
        at = hours == hour
        i, x = idx[at], v[at]
        col = int(hour) // HOUR_MS % ring
        entry.hour_total[:, col] += np.bincount(i, x, n)
        entry.hour_count[:, col] += np.bincount(i, None, n)
        low, high = np.full(n, np.nan), np.full(n, np.nan)
        np.fmin.at(low, i, x)
        np.fmax.at(high, i, x)
        entry.hour_low[:, col] = np.fmin(entry.hour_low[:, col], low)
        entry.hour_high[:, col] = np.fmax(entry.hour_high[:, col], high)
        if codes is not None:
            width = entry.vocab.size
            cells, counts = np.unique(
                i * width + np.searchsorted(entry.vocab, codes[at]), return_counts=True
            )
            _hour_codes(entry, int(hour), cells // width, entry.vocab[cells % width], counts)


def _hour_codes(
    entry: _Entry, hour: int, series: np.ndarray, codes: np.ndarray, n: np.ndarray
) -> None:
    """Sketch counts of one hour (codes in the vocabulary) kept for that hour and added to
    the whole hours' merged counts."""
    series, codes, n = series.astype(np.int64), codes.astype(np.int64), n.astype(np.int64)
    _sketch_add(entry, series, codes, n)
    kept = entry.hour_codes.get(hour)
    if kept is not None:
        series, codes, n = (np.concatenate(p) for p in zip(kept, (series, codes, n), strict=True))
    entry.hour_codes[hour] = _compact(series, codes, n)


def _compact(
    series: np.ndarray, codes: np.ndarray, n: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One hour's sketch counts as kept: int32 (series, sketch codes and an hour's counts fit
    in them), half the memory of the int64 they are read as."""
    return series.astype(np.int32), codes.astype(np.int32), n.astype(np.int32)


def _reduce_hours(entry: _Entry) -> None:
    """The whole hours' sums, counts, minima and maxima from the ring."""
    p = entry.inner_parts
    p.total = np.add.reduce(entry.hour_total, axis=1)
    p.count = np.add.reduce(entry.hour_count, axis=1)
    with np.errstate(all="ignore"):
        p.low = np.fmin.reduce(entry.hour_low, axis=1)
        p.high = np.fmax.reduce(entry.hour_high, axis=1)


def _add_lead(entry: _Entry, rows: _Rows, labels: dict[Labels, int], hour: int) -> None:
    series, slots, codes, counts = [], [], [], []
    for lab, c, _ in rows:
        i = labels[lab]
        slot = ((c["ts"] - hour) // MINUTE_MS).astype(np.int64)
        entry.lead_total[i, slot] = c["sum"]
        entry.lead_count[i, slot] = c["count"]
        entry.lead_low[i, slot] = c["min"]
        entry.lead_high[i, slot] = c["max"]
        if c["codes"].size:
            series.append(np.full(c["codes"].size, i, np.int64))
            slots.append(np.repeat(slot, c["lengths"]))
            codes.append(np.searchsorted(entry.vocab, c["codes"]))
            counts.append(c["counts"])
    if series:
        entry.lead_codes = (np.concatenate(series), np.concatenate(slots),
                            np.concatenate(codes), np.concatenate(counts))  # fmt: skip


def _add_samples(entry: _Entry, found: list[tuple[int, np.ndarray]]) -> None:
    """Raw samples ``(series, values)`` into the last part (NaN, ±Inf and staleness markers
    left out, as rollup rows leave them out)."""
    if not found:
        return
    idx = np.concatenate([np.full(v.size, i, np.int64) for i, v in found])
    v = np.concatenate([values for _, values in found])
    finite = np.isfinite(v)
    idx, v = idx[finite], v[finite]
    if not v.size:
        return
    p, n = entry.trail, len(entry.labels)
    p.total += np.bincount(idx, v, n)
    p.count += np.bincount(idx, None, n)
    np.fmin.at(p.low, idx, v)
    np.fmax.at(p.high, idx, v)
    if not entry.sketches:
        return
    codes = _mapping().codes(v).astype(np.int64)
    missing = np.setdiff1d(codes, entry.vocab)
    if missing.size:
        _grow_vocab(entry, missing)
    width = entry.vocab.size
    cells = np.bincount(idx * width + np.searchsorted(entry.vocab, codes), None, n * width)
    p.sketch += cells.astype(np.int64).reshape(n, width)


def _answer_rows(labels: list[Labels]) -> tuple[np.ndarray, list[Labels]]:
    order = np.asarray(sorted(range(len(labels)), key=labels.__getitem__), dtype=np.int64)
    return order, [drop_name(labels[i]) for i in order.tolist()]


def _grow_series(entry: _Entry, key: Labels) -> int:
    i = len(entry.labels)
    entry.labels.append(key)
    entry.index[key] = i
    entry.answer = None
    for p in (entry.inner_parts, entry.trail):
        p.total, p.count = np.append(p.total, 0.0), np.append(p.count, 0.0)
        p.low, p.high = np.append(p.low, np.nan), np.append(p.high, np.nan)
        p.sketch = np.vstack([p.sketch, np.zeros((1, entry.vocab.size), np.int64)])
    ring = entry.hour_total.shape[1]
    entry.hour_total = np.vstack([entry.hour_total, np.zeros((1, ring))])
    entry.hour_count = np.vstack([entry.hour_count, np.zeros((1, ring))])
    entry.hour_low = np.vstack([entry.hour_low, np.full((1, ring), np.nan)])
    entry.hour_high = np.vstack([entry.hour_high, np.full((1, ring), np.nan)])
    entry.lead_total = np.vstack([entry.lead_total, np.zeros((1, SLOTS))])
    entry.lead_count = np.vstack([entry.lead_count, np.zeros((1, SLOTS))])
    entry.lead_low = np.vstack([entry.lead_low, np.full((1, SLOTS), np.nan)])
    entry.lead_high = np.vstack([entry.lead_high, np.full((1, SLOTS), np.nan)])
    return i


def _grow_vocab(entry: _Entry, new: np.ndarray) -> None:
    vocab = np.union1d(entry.vocab, new)
    where = np.searchsorted(vocab, entry.vocab)
    for p in (entry.inner_parts, entry.trail):
        grown = np.zeros((p.sketch.shape[0], vocab.size), np.int64)
        grown[:, where] = p.sketch
        p.sketch = grown
    s, slot, code, n = entry.lead_codes
    entry.lead_codes = (s, slot, where[code] if code.size else code, n)
    entry.vocab = vocab


def _finish(name: str, entry: _Entry, start: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """The function's value per series for the window starting at ``start``, and presence."""
    k = (start - (entry.inner[0] - HOUR_MS)) // MINUTE_MS  # first 1m slot inside the window
    inner, trail = entry.inner_parts, entry.trail
    count = inner.count + entry.lead_count[:, k:].sum(axis=1) + trail.count
    ok = count >= 1
    if name == "count_over_time":
        return count, ok
    if name in ("sum_over_time", "avg_over_time"):
        total = inner.total + entry.lead_total[:, k:].sum(axis=1) + trail.total
        if name == "sum_over_time":
            return total, ok
        with np.errstate(all="ignore"):
            return total / count, ok
    if name in ("min_over_time", "max_over_time"):
        fn = np.fmin if name == "min_over_time" else np.fmax
        lead = entry.lead_low if fn is np.fmin else entry.lead_high
        with np.errstate(all="ignore"):
            edge = fn.reduce(lead[:, k:], axis=1) if k < SLOTS else np.full(count.size, np.nan)
        parts = (inner.low, trail.low) if fn is np.fmin else (inner.high, trail.high)
        return fn(fn(parts[0], edge), parts[1]), ok
    sketch = inner.sketch + trail.sketch
    s, slot, code, n = entry.lead_codes
    inside = slot >= k
    if inside.any():
        width = entry.vocab.size
        flat = np.bincount(s[inside] * width + code[inside], n[inside], sketch.size)
        sketch = sketch + flat.astype(np.int64).reshape(sketch.shape)
    return _quantiles(sketch, entry.vocab, q), ok


def _quantiles(sketch: np.ndarray, vocab: np.ndarray, q: float) -> np.ndarray:
    """``model.sketch_quantile`` of each row of ``sketch`` (counts of the codes ``vocab``)."""
    rows = sketch.shape[0]
    if np.isnan(q) or not vocab.size:
        return np.full(rows, np.nan)
    if q < 0 or q > 1:
        return np.full(rows, -np.inf if q < 0 else np.inf)
    cum = np.cumsum(sketch, axis=1)
    n = cum[:, -1]
    rank = q * (n - 1)
    at = np.minimum((cum <= rank[:, None]).sum(axis=1), vocab.size - 1)
    values = np.asarray(_mapping().values(vocab[at]), dtype=np.float64)
    return np.where(n > 0, values, np.nan)


def _mapping() -> Any:
    from metricvault.model import sketch_mapping

    return sketch_mapping()


def _annotate(ev: Evaluator, name: str, tiers: tuple[str, ...], t: int, range_ms: int) -> None:
    """The notes and tiers the rows' path gives the same window: at whole hours it reads
    1h rows only; else 1m rows at the edges, each window moved to whole minutes unless it
    is whole minutes already."""
    from metricvault.promql import tiers as tier_rows

    if not (t % HOUR_MS or range_ms % HOUR_MS):
        kept: tuple[str, ...] = ("1h",)
        res = HOUR_MS
    else:  # in the order the rows' path names them: its segments by time, a 1m edge first
        kept = tuple(dict.fromkeys(["1m"] + [t for t in tiers if t != "raw"]))
        res = MINUTE_MS
    shifted = bool(t % MINUTE_MS or range_ms % MINUTE_MS)
    plan = tier_rows.Plan(res, shifted, np.zeros(1, np.int64), 0)
    selection = BucketSelection([], 0, 0, kept, res, shifted)
    ev.notes.append(tier_rows._approximation_note(plan, selection))
    if name == "quantile_over_time":
        ev.notes.append(tier_rows.QUANTILE_NOTE)
    ev.served_by.update(kept)
