"""Long windows of rules, kept between evaluations: a 28-day ``avg_over_time`` re-evaluated every
30 s reads only what entered its window since the last evaluation.

A rule's window of days that starts before the raw horizon is answered from rollup rows
(tiers.py): its end and length moved to whole minutes (``T'``, ``R'``), the whole hours inside
it as 1h rows and its ragged edges as 1m rows, the last of them at ``T'`` itself. Evaluated again
30 s later, the window has slid by 30 s: the whole hours inside it are the same (until its
start or end crosses an hour), only its edges moved. So per (selector, window length) this
module keeps, for every series:

- the sums, counts, minima, maxima and merged quantile sketch counts of the 1h rows of the
  whole hours ``[a, b)`` inside the window, read once (``a``, ``b`` whole hours);
- the 1m rows of the hour ``[a - 1h, a)`` that holds the window's start, per minute, so the
  leading edge ``[T' - R', a)`` is a slice of them at any ``T'`` in that hour;
- the same sums of the raw samples in ``[b, T']`` (raw samples are kept there: it is the
  last hour), extended by the samples after the last evaluation's ``T'`` only.

An evaluation then reads the raw samples of the last 30 s and adds three sets of per-series
vectors. When the window's start or end crosses an hour (once an hour for whole-hour
lengths) the entry is read again from the store. Whether it still holds is the store's
catalog version, compared as the query-result cache compares it
(:func:`metricvault.promql.result_cache.still_holds`): maintenance (rollups, compaction,
retention, a kind change) drops every entry; a raw file with a sample not after the newest
time read (late data) drops it; raw files of newer samples only (ordinary flushes, the
rules' own writes at the evaluation time) keep it. Before comparing, buffered samples are
flushed, as every read does.

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
    store = getattr(source, "inner", source)
    version = getattr(store, "catalog_version", None)
    if version is None:
        return None
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
    inner_parts: _Parts
    # the 1m rows of [a - 1h, a) by minute slot: (series, SLOTS) each
    lead_total: np.ndarray
    lead_count: np.ndarray
    lead_low: np.ndarray
    lead_high: np.ndarray
    lead_codes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # series, slot, code, n
    trail: _Parts  # raw samples in [b, trail_end]
    trail_end: int
    # the answer's row order (by label set) and its label sets (without the metric name);
    # None: to be worked out (again, after a series came)
    answer: tuple[np.ndarray, list[Labels]] | None = None

    @property
    def cells(self) -> int:
        s, v = len(self.labels), self.vocab.size
        return s * (4 * SLOTS + 2 * v + 8) + int(self.lead_codes[0].size) * 4


class WindowCache:
    """The long windows of one engine's rules (see the module's text); thread-safe."""

    def __init__(self, max_cells: int = MAX_CELLS) -> None:
        self.max_cells = max_cells
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0  # entries read from the store in full
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
            if entry is None:
                entry = self._build(ev, matchers, snap, (a, b), end, sketches)
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
        if entry.inner != inner or end < entry.trail_end:
            del self._entries[key]  # the window crossed an hour (or went back): read anew
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
        entry = _Entry(
            Version.of(snap), inner, list(labels), labels, vocab,
            sketches and all(ok for _, _, ok in inner_rows + lead_rows),
            tuple(dict.fromkeys([*hours.tiers, *minutes.tiers])),
            _Parts.empty(n, v), np.zeros((n, SLOTS)), np.zeros((n, SLOTS)),
            np.full((n, SLOTS), np.nan), np.full((n, SLOTS), np.nan),
            (np.zeros(0, np.int64),) * 4,
            _Parts.empty(n, v), end,
        )  # fmt: skip
        _add_rows(entry, inner_rows, labels)
        _add_lead(entry, lead_rows, labels, a - HOUR_MS)
        _add_samples(entry, trail_values)
        return entry

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
    p = entry.inner_parts
    for lab, c, _ in rows:
        i = labels[lab]
        p.total[i] = float(np.add.reduce(c["sum"]))
        p.count[i] = float(np.add.reduce(c["count"].astype(np.float64)))
        p.low[i] = np.fmin.reduce(c["min"])
        p.high[i] = np.fmax.reduce(c["max"])
        if c["codes"].size:
            cols = np.searchsorted(entry.vocab, c["codes"])
            np.add.at(p.sketch[i], cols, c["counts"])


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
