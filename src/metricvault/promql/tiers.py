"""Range functions answered from the rollup tiers (docs/decisions/0003).

A rollup row summarises one series over one bucket ``[k, k + res)``: ``count, sum, min, max``,
the first and last sample with their times, ``nonfinite`` (NaN/±Inf samples) and, for
counters, ``increase`` (the rises of the bucket's samples, each from the sample before it,
which may sit in an earlier bucket up to ``counter_lookback`` back). When a range function's
window and every evaluation time are whole multiples of a tier's resolution, Prometheus 2.x's
closed window ``[t - range, t]`` is exactly the buckets ``[t - range, t)`` plus the sample at
``t`` itself, which is the first sample of the bucket starting at ``t`` when its time is ``t``.
From those rows:

- ``count/sum/avg/min/max/last/present_over_time`` are sums, minima and maxima of rows;
- ``delta`` is last minus first, ``rate``/``increase`` the sum of the rises between the
  window's consecutive samples: the rows' increases without the rise into the window's first
  sample (derived from the row before), plus the rises across gaps longer than the lookback
  (which a row's increase leaves out), plus the rise into the sample at ``t``; then Prometheus's
  extrapolation, which needs only the first and last sample, their times and the count.

Within raw retention the answer must equal the raw one (tested against Prometheus), so a
selection falls back to raw samples when any of its rows holds a NaN/±Inf sample (a value in
PromQL, left out of rollups), a row predates the first/last columns, or ``rate`` meets a series
that is not a counter. Before the raw horizon there is nothing else to read: a window that is
not whole minutes is moved to whole minutes (its end rounded down, its length to the nearest
minute), so the value at ``t`` is the exact value of a window ending less than a minute
earlier; NaN samples are left out; the answer says so in ``warnings``.
Prometheus 3's left-open windows ``(t - range, t]`` would need the second sample of a bucket
whose first sample sits on the window start, which rows do not keep: they read raw samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

from metricvault import compiled
from metricvault.model import PAST_HORIZON_FUNCTIONS
from metricvault.promql import rangefuncs as rf
from metricvault.promql.parse import duration_ms
from metricvault.promql.source import hints_for
from metricvault.promql.values import (
    Labels,
    RangeSeries,
    RangeVector,
    StepVector,
    make_labels,
    per_series,
)
from metricvault.protocols import BUCKET_FUNCTIONS, BucketSelection, SelectHints

if TYPE_CHECKING:
    from metricvault.promql.eval import Evaluator

OVER_TIME = {
    "count_over_time", "sum_over_time", "avg_over_time", "min_over_time", "max_over_time",
    "last_over_time", "present_over_time",
}  # fmt: skip
FUNCTIONS = BUCKET_FUNCTIONS | PAST_HORIZON_FUNCTIONS  # what rollup rows can answer


OLD_ROWS_NOTE = (
    "some rollup rows were written before rollups kept each bucket's first and last sample: "
    "rate, increase and delta leave those series out where only such rows remain"
)


OLD_ROWS_SELECTOR_NOTE = (
    "some rollup rows were written by a metricvault that kept no bucket's first and last "
    "sample with its time: selectors leave those buckets out"
)


@dataclass(frozen=True)
class Plan:
    res: int
    shifted: bool  # windows moved to whole buckets (only where raw samples are gone)
    refs: np.ndarray
    range_ms: int


RawCall = Callable[[np.ndarray], StepVector]  # the function at some steps, from raw samples


def range_call(
    ev: Evaluator,
    name: str,
    ms: Any,
    steps: np.ndarray,
    args: list[Any] | None = None,
    raw: RawCall | None = None,
) -> StepVector | None:
    """``name(ms)`` at every step from rollup rows; None where they cannot answer exactly.
    ``args``: the call's arguments (``quantile_over_time``'s ``q``); ``raw``: the raw path,
    for the steps the rows do not answer."""
    if not ev.options.use_rollups or name not in FUNCTIONS or not isinstance(ms, pp.MatrixSelector):
        return None
    if ev.windows is not None:  # a long window kept from the last evaluation
        kept = ev.windows.range_call(ev, name, ms, steps, args or [])
        if kept is not None:
            return kept
    if name in PAST_HORIZON_FUNCTIONS:
        if raw is None:
            return None
        return _past_horizon_call(ev, name, ms, steps, args or [], raw)
    return _range_call(ev, name, ms, steps, None)


def _past_horizon_call(
    ev: Evaluator, name: str, ms: Any, steps: np.ndarray, args: list[Any], raw_call: RawCall
) -> StepVector | None:
    """``stddev``/``stdvar``/``quantile_over_time``: the steps whose window starts before
    the raw horizon from the rows' m2 and sketches; the others (within raw retention) from
    raw samples, exactly as Prometheus answers."""
    horizon = ev.source.horizons().raw_start_ms
    refs = ev.reference_times(ms.vector_selector, steps)
    old = refs - duration_ms(ms.range) < horizon if horizon else np.zeros(steps.size, bool)
    if not old.any():
        return None
    qs = ev.eval_scalar(args[0], steps) if name == "quantile_over_time" else None
    if old.all():
        return _range_call(ev, name, ms, steps, qs)
    rolled = _range_call(ev, name, ms, steps[old], None if qs is None else qs[old])
    raw = raw_call(steps[~old])
    return _join_steps(rolled, raw, old)


def _join_steps(first: StepVector | None, rest: StepVector, where: np.ndarray) -> StepVector:
    """One vector over all steps from ``first`` (the steps ``where`` marks) and ``rest``."""
    parts = [(first, where), (rest, ~where)] if first is not None else [(rest, ~where)]
    labels: dict[Labels, int] = {}
    for vec, _ in parts:
        for lab in vec.labels:
            labels.setdefault(lab, len(labels))
    values = np.zeros((len(labels), where.size))
    present = np.zeros((len(labels), where.size), dtype=bool)
    for vec, cols in parts:
        for i, lab in enumerate(vec.labels):
            values[labels[lab], cols] = vec.values[i]
            present[labels[lab], cols] = vec.present[i]
    return StepVector(list(labels), values, present)


def _range_call(
    ev: Evaluator, name: str, ms: Any, steps: np.ndarray, qs: np.ndarray | None
) -> StepVector | None:
    refs = ev.reference_times(ms.vector_selector, steps)
    range_ms = duration_ms(ms.range)
    rounded = _rounds_windows(ev, name, refs, range_ms)
    if rounded:  # opted in: windows moved to whole minutes within raw retention too
        refs, range_ms = refs // MINUTE_MS * MINUTE_MS, round(range_ms / MINUTE_MS) * MINUTE_MS
        step = MINUTE_MS if refs.size > 1 else 0  # every moved time is a whole minute
        hints = SelectHints(name, range_ms, step, int(refs.min()), int(refs.max()))
    else:
        hints = hints_for(refs, range_ms, name, ev.options.left_open_windows)
    # The store chooses the tier (store/query.py plan_buckets); None: read raw samples.
    selection = ev.source.select_buckets(ev.matchers(ms.vector_selector), hints)
    if selection is None:
        return None
    ev.count_buckets(selection, steps.size)  # the query's series and sample limits
    res = selection.width_ms
    p = Plan(res, selection.shifted or rounded,
             refs // res * res if selection.shifted else refs, selection.range_ms)  # fmt: skip
    exact = int(p.refs.min()) - p.range_ms >= selection.raw_horizon_ms
    if exact and ((p.shifted and not rounded) or not _exact(selection, name)):
        return None
    if exact and rounded:
        ev.notes.append(ROUNDED_NOTE)
    if not exact:
        ev.notes.append(_approximation_note(p, selection))
        if name == "quantile_over_time":
            ev.notes.append(QUANTILE_NOTE)
    ev.served_by.update(selection.tiers)
    rv = RangeVector([], p.refs - p.range_ms, p.refs, p.range_ms)
    rows = []
    pending: list[tuple[Labels, dict[str, np.ndarray]]] = []  # evaluated a batch at a time
    pending_spans: list[tuple[int, int] | None] = []  # where each one's rows are laid out
    every_row_held, old_rows = _row_facts(selection, name)
    # Sorted by label set, as the raw path (and Prometheus's storage) returns series.
    labelled = sorted(((make_labels(s.labels.items()), s) for s in selection.series),
                      key=lambda pair: pair[0])  # fmt: skip
    for labels, s in labelled:
        if name in ("rate", "increase") and not s.counter:
            continue  # only before the horizon (else _exact said no): rows have no increase
        cols = s.columns if every_row_held else _finite_rows(s.columns)
        if old_rows and name in ("rate", "increase", "delta") and (cols["first_ts"] < 0).any():
            # only before the horizon: rows from older versions keep no first sample
            ev.notes.append(OLD_ROWS_NOTE)
            continue
        if name in PAST_HORIZON_FUNCTIONS:
            v, ok, lacking = _spread(name, cols, p, qs)
            if lacking:
                ev.notes.append(SPREAD_NOTE)
            rows.append((labels, v, ok))
            continue
        pending.append((labels, cols))
        pending_spans.append(s.rows_at)
    kernel = compiled.ready(KERNEL) if USE_COMPILED and name in EVALUATED else None
    if kernel is not None and pending:  # every series in one compiled call
        ev.limits.check()
        laid = _laid_out(selection, pending_spans) if every_row_held else None
        lookback = selection.counter_lookback_ms
        found = _evaluate_compiled(kernel, name, [c for _, c in pending], p, lookback, laid)
        rows += [(labels, v, ok) for (labels, _), (v, ok) in zip(pending, found, strict=True)]
        pending = []
    per_batch = max(1, BATCH_CELLS // max(steps.size, 1))
    for a in range(0, len(pending), per_batch):
        ev.limits.check()
        batch = pending[a : a + per_batch]
        found = _evaluate_batch(name, [c for _, c in batch], p, rv, selection.counter_lookback_ms)
        rows += [(labels, v, ok) for (labels, _), (v, ok) in zip(batch, found, strict=True)]
    return per_series(rows, steps.size, keep_name=name == "last_over_time")


# (series x steps) cells evaluated in one numpy pass. A refresh's few steps over a hundred
# series is then one pass instead of a hundred (each ~40 numpy calls on a few elements);
# a day's 1,441 steps stay one series a pass (larger passes over many steps measured
# slower: their arrays leave the CPU's caches). 1: each series on its own (:func:`_evaluate`).
BATCH_CELLS = 1 << 10
_ROW_COLUMNS = ("ts", "first_ts", "last_ts", "first", "last", "count", "sum", "min", "max",
                "increase")  # fmt: skip
_KEY_BITS = 42  # a series' rank above its rows' times (from the batch's earliest) in one key


KERNEL = "metricvault.promql.tiers_compiled"  # loaded by servers (metricvault.compiled)
USE_COMPILED = True  # False: numpy alone (tests run both)
EVALUATED = BUCKET_FUNCTIONS  # the kernel answers every function rows answer exactly


def _evaluate_compiled(
    kernel: Any,
    name: str,
    cols: list[dict[str, np.ndarray]],
    p: Plan,
    lookback_ms: int,
    laid: tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] | None = None,
) -> list[rf.Result]:
    """:func:`_evaluate_batch`'s answers from the compiled kernel, every series in one call;
    ``laid``: the selection's rows laid end to end and each series' (start, end) in them (else
    ``cols`` are laid end to end here)."""
    if laid is None:
        sizes = np.fromiter((c["ts"].size for c in cols), np.int64, len(cols))
        ends = np.cumsum(sizes)
        flat = {k: np.concatenate([c[k] for c in cols]) for k in _ROW_COLUMNS if k in cols[0]}
        laid = flat, ends - sizes, ends
    flat, starts, ends = laid
    values = np.empty((len(cols), p.refs.size))
    ok = np.empty((len(cols), p.refs.size), dtype=np.bool_)
    refs = np.ascontiguousarray(p.refs, dtype=np.int64)
    kernel.evaluate(
        kernel.OPS[name], kernel.columns_of(flat), starts, ends, refs, p.range_ms,
        int(lookback_ms), values, ok,
    )  # fmt: skip
    return [(values[i], ok[i]) for i in range(len(cols))]


def _laid_out(
    selection: BucketSelection, spans: list[tuple[int, int] | None]
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] | None:
    """The selection's rows laid end to end and each pending series' (start, end) in them,
    where the store gave both (``BucketSelection.rows``, ``SeriesBuckets.rows_at``)."""
    if selection.rows is None or any(span is None for span in spans):
        return None
    bounds = np.array(spans, dtype=np.int64).reshape(len(spans), 2)
    flat = {k: v for k, v in selection.rows.items() if k in _ROW_COLUMNS}
    return flat, np.ascontiguousarray(bounds[:, 0]), np.ascontiguousarray(bounds[:, 1])


def _evaluate_batch(
    name: str, cols: list[dict[str, np.ndarray]], p: Plan, rv: RangeVector, lookback_ms: int
) -> list[rf.Result]:
    """:func:`_evaluate` of each series' rows, for several series in one pass: their rows laid
    end to end, each window's bounds found by one search over keys of (series, time), and
    every index kept within its own series' rows, so each answer is the one-series answer
    bit for bit (sums over the same rows in the same order)."""
    steps = p.refs.size
    sizes = np.fromiter((c["ts"].size for c in cols), np.int64, len(cols))
    held = [c["ts"] for c in cols if c["ts"].size]
    lowest = min([int(p.refs.min()) - p.range_ms, *(int(t[0]) for t in held)])
    highest = max([int(p.refs.max()), *(int(t[-1]) for t in held)])
    if len(cols) == 1 or not held or highest - lowest >= 1 << _KEY_BITS:
        return [_evaluate(name, c, p, rv, lookback_ms) for c in cols]
    # the columns the store handed over (protocols.bucket_columns: those ``name`` reads)
    flat = {k: np.concatenate([c[k] for c in cols]) for k in _ROW_COLUMNS if k in cols[0]}
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    rank = np.arange(len(cols), dtype=np.int64) << _KEY_BITS
    keys = np.repeat(rank, sizes) + (flat["ts"] - lowest)
    lo = np.searchsorted(keys, (rank[:, None] + (p.refs - p.range_ms - lowest)).ravel(), "left")
    hi = np.searchsorted(keys, (rank[:, None] + (p.refs - lowest)).ravel(), "left")
    first_row = np.repeat(starts, steps)  # each window's series: its first row, its end
    end_row = first_row + np.repeat(sizes, steps)
    refs = np.tile(p.refs, len(cols))
    tiled = RangeVector([], refs - p.range_ms, refs, p.range_ms)
    value, ok = _evaluate_rows(name, flat, lo, hi, (first_row, end_row), refs, tiled, lookback_ms)
    value, ok = value.reshape(len(cols), steps), ok.reshape(len(cols), steps)
    empty = sizes == 0  # as _evaluate answers a series without rows
    value[empty], ok[empty] = 0.0, False
    return [(value[i], ok[i]) for i in range(len(cols))]


def _evaluate_rows(
    name: str,
    c: dict[str, np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    series_rows: tuple[np.ndarray, np.ndarray],
    refs: np.ndarray,
    rv: RangeVector,
    lookback_ms: int,
) -> rf.Result:
    """:func:`_evaluate`'s arithmetic over windows ``[lo, hi)`` of rows laid end to end, each
    window's series holding rows ``[first_row, end_row)`` (``series_rows``), at reference
    times ``refs``."""
    first_row, end_row = series_rows
    ts = c["ts"]
    at = np.minimum(hi, end_row - 1)
    edge = (hi < end_row) & (ts[at] == refs) & (c["first_ts"][at] == refs)
    edge_value = np.where(edge, c["first"][at], 0.0)
    has_rows = hi > lo
    n = np.where(has_rows, _sum(c["count"].astype(np.float64), lo, hi), 0.0) + edge
    last_i = np.minimum(np.maximum(hi - 1, first_row), ts.size - 1)  # (a series without rows)
    if name in OVER_TIME:
        return _over_time(name, c, lo, hi, n, edge, edge_value, last_i)
    last = np.where(edge, edge_value, c["last"][last_i])
    first_i = np.minimum(lo, end_row - 1)
    first = np.where(has_rows, c["first"][first_i], edge_value)
    first_t = np.where(has_rows, c["first_ts"][first_i], refs)
    last_t = np.where(edge, refs, c["last_ts"][last_i])
    if name == "delta":
        result = last - first
    else:
        series_start = np.zeros(ts.size, dtype=bool)
        series_start[first_row[first_row < ts.size]] = True
        result = _window_increase(c, lo, hi, edge, edge_value, lookback_ms, series_start)
    value = rf.extrapolate(
        result, first, first_t, last_t, n, rv, counter=name != "delta", rate=name == "rate"
    )
    return value, n >= 2


def selector_before_horizon(
    ev: Evaluator, vs: Any, refs: np.ndarray, lookback_ms: int
) -> tuple[dict[Labels, RangeSeries], int, int] | None:
    """A plain selector's samples before the raw horizon, from rollup rows: each bucket's
    first and last sample at its own time (real samples, as remote_read returns them and
    as Thanos answers from downsampled blocks), by label set; the horizon; and the lookback
    the steps there use (at least one bucket, so every step finds its bucket's sample).
    None where raw samples reach back far enough, or the store has no rows there."""
    if not ev.options.use_rollups:
        return None
    horizon = ev.source.horizons().raw_start_ms
    first = int(refs.min())
    if not horizon or first - lookback_ms >= horizon:
        return None
    step = int(refs[1] - refs[0]) if refs.size > 1 else 0
    last = min(int(refs.max()), horizon)  # rows past the horizon: raw samples answer there
    hints = SelectHints(None, lookback_ms, step, first, last, ev.options.left_open_windows)
    selection = ev.source.select_buckets(ev.matchers(vs), hints)
    if selection is None:
        return None
    ev.count_buckets(selection, refs.size)
    out: dict[Labels, RangeSeries] = {}
    old_rows = False
    for s in selection.series:
        c = s.columns
        held = c["count"] > 0
        timed = held & (c["first_ts"] >= 0)
        old_rows |= bool((held & ~timed).any())
        ts = np.concatenate([c["first_ts"][timed], c["last_ts"][timed]])
        values = np.concatenate([c["first"][timed], c["last"][timed]])
        ts, pos = np.unique(ts, return_index=True)  # a one-sample bucket: once
        keep = ts < horizon
        if keep.any():
            labels = make_labels(s.labels.items())
            out[labels] = RangeSeries(labels, ts[keep], values[pos][keep])
    if old_rows:
        ev.notes.append(OLD_ROWS_SELECTOR_NOTE)
    ev.served_by.update(t for t in selection.tiers if t != "raw")
    width = selection.width_ms
    ev.notes.append(
        "raw samples before the raw horizon are gone (retention_raw): selectors there were "
        f"answered from the {', '.join(t for t in selection.tiers if t != 'raw') or 'rollup'} "
        "rollups, with each bucket's first and last sample at its own time (real samples; "
        "NaN samples and staleness markers left out)"
        + (
            f" and a lookback of {width // 60_000} minutes, one bucket"
            if width > lookback_ms
            else ""
        )
    )
    return out, horizon, max(lookback_ms, width)


def selector_from_rows(
    ev: Evaluator, vs: Any, refs: np.ndarray, lookback_ms: int
) -> list[RangeSeries] | None:
    """A plain selector within raw retention from rollup rows, where they answer it exactly:
    every evaluation time a whole minute, a step of a minute or more. The newest sample at
    or before such a time ``t`` is the first sample of the bucket starting at ``t`` when it
    sits on ``t``, else the last sample of the newest bucket before ``t`` (a later sample in
    that bucket would be newer), so the rows' first and last samples, at their own times,
    hold every sample the lookback can take; the store answers only where no raw sample
    there is NaN, ±Inf or a staleness marker (store/query.py ``_plan_exact_selector``). The
    samples in ``[first ref - lookback, last ref]``, as the raw read returns them; None:
    read raw samples."""
    if not (ev.options.use_rollups and ev.options.selector_rows) or refs.size < 2:
        return None
    if lookback_ms <= 0:
        return None
    step = int(refs[1] - refs[0])
    first, last = int(refs.min()), int(refs.max())
    if step < MINUTE_MS or step % MINUTE_MS or first % MINUTE_MS:
        return None
    hints = SelectHints(None, lookback_ms, step, first, last, ev.options.left_open_windows)
    selection = ev.source.select_buckets(ev.matchers(vs), hints)
    if selection is None or selection.shifted:
        return None
    if first - lookback_ms < selection.raw_horizon_ms or not _exact(selection, "last"):
        return None  # retention moved under the query, or a NaN/±Inf/old row: raw samples
    ev.count_buckets(selection, refs.size)
    lo = first - lookback_ms
    out = []
    for s in selection.series:
        c = s.columns
        held = c["count"] > 0
        ts = np.concatenate([c["first_ts"][held], c["last_ts"][held]])
        values = np.concatenate([c["first"][held], c["last"][held]])
        ts, pos = np.unique(ts, return_index=True)  # a one-sample bucket: once
        keep = (ts >= lo) & (ts <= last)
        if keep.any():
            labels = make_labels(s.labels.items())
            out.append(RangeSeries(labels, ts[keep], values[pos][keep]))
    ev.served_by.update(t for t in selection.tiers if t != "raw")
    return sorted(out, key=lambda s: s.labels)


def merge_before(old: dict[Labels, RangeSeries], raw: list[RangeSeries]) -> list[RangeSeries]:
    """The rows' samples before the horizon followed by the raw samples after it, per label
    set, sorted by label set as the raw path returns them."""
    merged = dict(old)
    for s in raw:
        before = merged.get(s.labels)
        if before is None:
            merged[s.labels] = s
        else:
            earlier = before.ts < (s.ts[0] if s.ts.size else np.iinfo(np.int64).max)
            merged[s.labels] = RangeSeries(
                s.labels,
                np.concatenate([before.ts[earlier], s.ts]),
                np.concatenate([before.values[earlier], s.values]),
            )
    return [merged[k] for k in sorted(merged)]


MINUTE_MS = 60_000
ROUNDED_NOTE = (
    "promql_round_windows is on: range windows that are not whole minutes (Grafana's "
    "$__rate_interval) were answered from the 1m rollups with each window moved to whole "
    "minutes (its end rounded down, by less than a minute, its length to the nearest "
    "minute), so each value is Prometheus's exact value for that moved window, not for the "
    "window asked for"
)


def _rounds_windows(ev: Evaluator, name: str, refs: np.ndarray, range_ms: int) -> bool:
    """Whether the user opted in to whole-minute windows (``EngineOptions.round_windows``,
    setting ``promql_round_windows``) and this window needs moving: never for Prometheus 3's
    left-open windows, windows under a minute, or the spread functions."""
    if not ev.options.round_windows or ev.options.left_open_windows:
        return False
    if name not in BUCKET_FUNCTIONS or range_ms < MINUTE_MS:
        return False
    return bool(range_ms % MINUTE_MS or (refs % MINUTE_MS).any())


_COUNTING = ("rate", "increase")  # read each bucket's counter increase


def _row_facts(selection: BucketSelection, name: str) -> tuple[bool, bool]:
    """(every row holds a sample, some held row lacks its first sample's time), from all
    rows at once where the store laid them end to end; else (False, True): each series'
    rows are then filtered and checked on their own."""
    flat = selection.rows
    if flat is None or "count" not in flat or "first_ts" not in flat:
        return False, True
    held = flat["count"] > 0
    every = bool(held.all())
    if name not in ("rate", "increase", "delta"):
        return every, False
    first_ts = flat["first_ts"] if every else flat["first_ts"][held]
    return every, bool((first_ts < 0).any())


def _exact(selection: BucketSelection, name: str) -> bool:
    flat = selection.rows
    needed = {"nonfinite", "count", "first_ts"} | ({"increase"} if name in _COUNTING else set())
    if flat is not None and needed <= flat.keys():
        return _exact_rows(selection, flat, name)
    for s in selection.series:
        c = s.columns
        if c["nonfinite"].any():
            return False  # a NaN/±Inf sample is a value to PromQL; rollups leave it out
        held = c["count"] > 0
        if (c["first_ts"][held] < 0).any():
            return False  # rows written before rollups kept their first and last samples
        if name in ("rate", "increase") and (not s.counter or np.isnan(c["increase"][held]).any()):
            return False
    return True


def _exact_rows(selection: BucketSelection, flat: dict[str, np.ndarray], name: str) -> bool:
    """:func:`_exact` over every series' rows at once (the store's rows laid end to end)."""
    if flat["nonfinite"].any():
        return False
    held = flat["count"] > 0
    every = bool(held.all())  # as a day's rows are: no boolean copy of each column then

    def of_held(column: np.ndarray) -> np.ndarray:
        return column if every else column[held]

    if (of_held(flat["first_ts"]) < 0).any():
        return False
    if name in _COUNTING:
        if not all(s.counter for s in selection.series):
            return False
        return not bool(np.isnan(of_held(flat["increase"])).any())
    return True


_FLAT = ("sketch_codes", "sketch_counts")  # indexed by sketch_start/sketch_end, not by row


def _finite_rows(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    held = cols["count"] > 0
    if held.all():
        return cols
    return {k: v if k in _FLAT else v[held] for k, v in cols.items()}


QUANTILE_NOTE = (
    "quantile_over_time before the raw horizon merges each rollup row's quantile sketch "
    "(DDSketch, 1 % relative accuracy): each value is within 1 % of the window's sample at "
    "rank q * (n - 1), where Prometheus interpolates between that sample and the next"
)
SPREAD_NOTE = (
    "some rollup rows were written by a metricvault that kept no sum of squares or quantile "
    "sketch per bucket: stddev_over_time, stdvar_over_time and quantile_over_time leave out "
    "the steps whose windows hold such rows"
)


def _spread(
    name: str, c: dict[str, np.ndarray], p: Plan, qs: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """stddev/stdvar/quantile_over_time over each window's rows (and the sample at ``t``):
    values, presence, and whether some window met rows that keep no m2 or sketch."""
    ts = c["ts"]
    steps = p.refs.size
    if ts.size == 0:
        return np.zeros(steps), np.zeros(steps, dtype=bool), False
    lo = np.searchsorted(ts, p.refs - p.range_ms, side="left")
    hi = np.searchsorted(ts, p.refs, side="left")
    at = np.minimum(hi, ts.size - 1)
    edge = (hi < ts.size) & (ts[at] == p.refs) & (c["first_ts"][at] == p.refs)
    edge_value = np.where(edge, c["first"][at], 0.0)
    n = _sum(c["count"].astype(np.float64), lo, hi) * (hi > lo) + edge
    if name == "quantile_over_time":
        assert qs is not None
        value, known = _window_quantiles(c, lo, hi, edge, edge_value, qs)
    else:
        var, known = _window_variance(c, lo, hi, edge, edge_value)
        value = np.sqrt(var) if name == "stddev_over_time" else var
    ok = (n >= 1) & known
    return value, ok, bool(((n >= 1) & ~known).any())


def _window_variance(
    c: dict[str, np.ndarray], lo: np.ndarray, hi: np.ndarray, edge: np.ndarray, x_t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Population variance per window by Chan's merge of the rows' ``(count, mean, m2)`` and
    the sample at ``t``: ``(sum(m2_i) + sum(n_i (mean_i - mean)^2)) / n``, from deviations of
    means (no large sums of squares cancelling). Windows are gathered as (steps, rows)
    matrices in chunks, as the raw path gathers samples."""
    count = c["count"].astype(np.float64)
    sums, m2 = c["sum"], c["m2"]
    out = np.full(lo.size, np.nan)
    known = np.ones(lo.size, dtype=bool)
    width = max(int((hi - lo).max()), 1)
    cols = np.arange(width)
    chunk = max(1, rf.GATHER_CELLS // width)
    last = max(count.size - 1, 0)
    for a in range(0, lo.size, chunk):
        part = slice(a, min(a + chunk, lo.size))
        idx = np.minimum(lo[part, None] + cols[None, :], last)
        inside = cols[None, :] < (hi[part] - lo[part])[:, None]
        n_i = np.where(inside, count[idx], 0.0)
        s_i = np.where(inside, sums[idx], 0.0)
        m_i = np.where(inside, m2[idx], 0.0)
        e = edge[part].astype(np.float64)
        with np.errstate(all="ignore"):
            n = n_i.sum(axis=1) + e
            mean = (s_i.sum(axis=1) + np.where(edge[part], x_t[part], 0.0)) / n
            mean_i = np.where(n_i > 0, s_i / np.where(n_i > 0, n_i, 1.0), 0.0)
            dev = np.where(inside, mean_i - mean[:, None], 0.0)
            spread = m_i.sum(axis=1) + (n_i * dev * dev).sum(axis=1)
            spread += e * (np.where(edge[part], x_t[part], 0.0) - mean) ** 2
            out[part] = np.maximum(spread / n, 0.0)
        known[part] = ~np.isnan(m_i).any(axis=1)
    return out, known


def _window_quantiles(
    c: dict[str, np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    edge: np.ndarray,
    x_t: np.ndarray,
    qs: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The quantile of each window from its rows' sketches merged (and the sample at ``t``):
    within the sketch's relative accuracy (1 %) of the window's sample at rank
    ``q * (n - 1)`` (model.sketch_quantile)."""
    from metricvault.model import sketch_mapping, sketch_quantile

    start, end, held = c["sketch_start"], c["sketch_end"], c["sketch_held"]
    codes, counts = c["sketch_codes"], c["sketch_counts"]
    edge_codes = sketch_mapping().codes(x_t)
    out = np.full(lo.size, np.nan)
    known = np.ones(lo.size, dtype=bool)
    for j in range(lo.size):
        a, b = int(lo[j]), int(hi[j])
        if b > a and not held[a:b].all():
            known[j] = False
            continue
        # rows of one series are contiguous in the flat arrays: the window's codes are a slice
        lo_flat = int(start[a]) if b > a else 0
        hi_flat = int(end[b - 1]) if b > a else 0
        w_codes, w_counts = codes[lo_flat:hi_flat], counts[lo_flat:hi_flat]
        if edge[j]:
            w_codes = np.append(w_codes, edge_codes[j])
            w_counts = np.append(w_counts, 1)
        if w_counts.size:
            out[j] = sketch_quantile(w_codes, w_counts, float(qs[j]))
    return out, known


def _evaluate(
    name: str,
    c: dict[str, np.ndarray],
    p: Plan,
    rv: RangeVector,
    lookback_ms: int,
) -> rf.Result:
    ts = c["ts"]
    if ts.size == 0:
        return np.zeros(p.refs.size), np.zeros(p.refs.size, dtype=bool)
    lo = np.searchsorted(ts, p.refs - p.range_ms, side="left")
    hi = np.searchsorted(ts, p.refs, side="left")
    # The sample at t: the first of the bucket starting at t, if it sits exactly on t.
    at = np.minimum(hi, max(ts.size - 1, 0))
    edge = (hi < ts.size) & (ts[at] == p.refs) & (c["first_ts"][at] == p.refs)
    edge_value = np.where(edge, c["first"][at], 0.0)
    has_rows = hi > lo
    n = np.where(has_rows, _sum(c["count"].astype(np.float64), lo, hi), 0.0) + edge
    last_i = np.maximum(hi - 1, 0)
    if name in OVER_TIME:
        return _over_time(name, c, lo, hi, n, edge, edge_value, last_i)
    last = np.where(edge, edge_value, c["last"][last_i])
    first_i = np.minimum(lo, ts.size - 1)
    first = np.where(has_rows, c["first"][first_i], edge_value)
    first_t = np.where(has_rows, c["first_ts"][first_i], p.refs)
    last_t = np.where(edge, p.refs, c["last_ts"][last_i])
    if name == "delta":
        result = last - first
    else:
        result = _window_increase(c, lo, hi, edge, edge_value, lookback_ms)
    ok = n >= 2
    value = rf.extrapolate(
        result, first, first_t, last_t, n, rv, counter=name != "delta", rate=name == "rate"
    )
    return value, ok


def _over_time(
    name: str,
    c: dict[str, np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    n: np.ndarray,
    edge: np.ndarray,
    edge_value: np.ndarray,
    last_i: np.ndarray,
) -> rf.Result:
    """``name`` (of OVER_TIME) over windows ``[lo, hi)`` of rows, ``last_i`` each window's
    last row; only the columns ``protocols.bucket_columns(name)`` names are read."""
    ok = n >= 1
    has_rows = hi > lo
    if name == "count_over_time":
        return n, ok
    if name == "present_over_time":
        return np.ones(n.size), ok
    if name == "last_over_time":
        return np.where(edge, edge_value, c["last"][last_i]), ok
    if name in ("sum_over_time", "avg_over_time"):
        total = np.where(has_rows, _sum(c["sum"], lo, hi), 0.0) + edge_value
        if name == "sum_over_time":
            return total, ok
        with np.errstate(all="ignore"):
            return total / n, ok
    ufunc = np.fmin if name == "min_over_time" else np.fmax
    rows = np.where(has_rows, rf.reduce_windows(ufunc, c[name[:3]], lo, hi), np.nan)
    return np.where(edge, ufunc(rows, edge_value), rows), ok


def _window_increase(
    c: dict[str, np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    edge: np.ndarray,
    edge_value: np.ndarray,
    lookback_ms: int,
    series_start: np.ndarray | None = None,
) -> np.ndarray:
    """The rises between consecutive samples of each window (a drop counts the new value);
    ``series_start``: the rows where a series' rows start (the row before is another's)."""
    first, last, increase = c["first"], c["last"], c["increase"]
    # Rise from the previous row's last sample into each row's first, and whether the row's
    # stored increase already holds it (the previous sample within the counter lookback).
    into = np.zeros(first.size)
    within_lookback = np.zeros(first.size, dtype=bool)
    if first.size > 1:
        into[1:] = _rise(last[:-1], first[1:])
        within_lookback[1:] = c["first_ts"][1:] - c["last_ts"][:-1] <= lookback_ms
    if series_start is not None:
        into[series_start], within_lookback[series_start] = 0.0, False
    inside = increase - np.where(within_lookback, into, 0.0)  # rises within each row
    has_rows = hi > lo
    total = np.where(has_rows, _sum(inside, lo, hi), 0.0)
    later = hi > lo + 1  # rises into the window's second and later rows
    total += np.where(later, _sum(into, np.minimum(lo + 1, hi), hi), 0.0)
    last_i = np.maximum(hi - 1, 0)
    total += np.where(edge & has_rows, _rise(last[last_i], edge_value), 0.0)
    return np.asarray(total)


def _rise(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    return np.asarray(np.where(after >= before, after - before, after))


def _sum(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return rf.reduce_windows(np.add, values, lo, hi)


def _approximation_note(p: Plan, selection: BucketSelection) -> str:
    tiers = ", ".join(t for t in selection.tiers if t != "raw") or "rollup"
    when = (
        f"; windows that are not whole {p.res // 60_000}-minute buckets were moved to them "
        "(each window's end rounded down to a whole minute, by less than one bucket, and its "
        "length to the nearest whole minute)"
        if p.shifted
        else ""
    )
    return (
        f"raw samples before the raw horizon are gone (retention_raw): windows there were "
        f"answered from the {tiers} rollups, which leave out NaN and ±Inf samples{when}"
    )
