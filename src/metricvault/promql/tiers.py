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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

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
FUNCTIONS = BUCKET_FUNCTIONS  # what rollup rows can answer (the store plans which tier)


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


def range_call(ev: Evaluator, name: str, ms: Any, steps: np.ndarray) -> StepVector | None:
    """``name(ms)`` at every step from rollup rows; None where they cannot answer exactly."""
    if not ev.options.use_rollups or name not in FUNCTIONS or not isinstance(ms, pp.MatrixSelector):
        return None
    refs = ev.reference_times(ms.vector_selector, steps)
    hints = hints_for(refs, duration_ms(ms.range), name, ev.options.left_open_windows)
    # The store chooses the tier (store/query.py plan_buckets); None: read raw samples.
    selection = ev.source.select_buckets(ev.matchers(ms.vector_selector), hints)
    if selection is None:
        return None
    ev.count_buckets(selection, steps.size)  # the query's series and sample limits
    res = selection.width_ms
    p = Plan(res, selection.shifted, refs // res * res if selection.shifted else refs,
             selection.range_ms)  # fmt: skip
    exact = int(p.refs.min()) - p.range_ms >= selection.raw_horizon_ms
    if exact and (p.shifted or not _exact(selection, name)):
        return None
    if not exact:
        ev.notes.append(_approximation_note(p, selection))
    ev.served_by.update(selection.tiers)
    rv = RangeVector([], p.refs - p.range_ms, p.refs, p.range_ms)
    rows = []
    # Sorted by label set, as the raw path (and Prometheus's storage) returns series.
    for s in sorted(selection.series, key=lambda s: make_labels(s.labels.items())):
        if name in ("rate", "increase") and not s.counter:
            continue  # only before the horizon (else _exact said no): rows have no increase
        cols = _finite_rows(s.columns)
        if name in ("rate", "increase", "delta") and (cols["first_ts"] < 0).any():
            # only before the horizon: rows from older versions keep no first sample
            ev.notes.append(OLD_ROWS_NOTE)
            continue
        v, ok = _evaluate(name, cols, p, rv, selection.counter_lookback_ms, s.counter)
        rows.append((make_labels(s.labels.items()), v, ok))
    return per_series(rows, steps.size, keep_name=name == "last_over_time")


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


def _exact(selection: BucketSelection, name: str) -> bool:
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


def _finite_rows(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    held = cols["count"] > 0
    return cols if held.all() else {k: v[held] for k, v in cols.items()}


def _evaluate(
    name: str,
    c: dict[str, np.ndarray],
    p: Plan,
    rv: RangeVector,
    lookback_ms: int,
    counter: bool,
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
    last = np.where(edge, edge_value, c["last"][last_i])
    if name in OVER_TIME:
        return _over_time(name, c, lo, hi, n, edge, edge_value, last)
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
    last: np.ndarray,
) -> rf.Result:
    ok = n >= 1
    has_rows = hi > lo
    if name == "count_over_time":
        return n, ok
    if name == "present_over_time":
        return np.ones(n.size), ok
    if name == "last_over_time":
        return last, ok
    total = np.where(has_rows, _sum(c["sum"], lo, hi), 0.0) + edge_value
    if name == "sum_over_time":
        return total, ok
    if name == "avg_over_time":
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
) -> np.ndarray:
    """The rises between consecutive samples of each window (a drop counts the new value)."""
    first, last, increase = c["first"], c["last"], c["increase"]
    # Rise from the previous row's last sample into each row's first, and whether the row's
    # stored increase already holds it (the previous sample within the counter lookback).
    into = np.zeros(first.size)
    within_lookback = np.zeros(first.size, dtype=bool)
    if first.size > 1:
        into[1:] = _rise(last[:-1], first[1:])
        within_lookback[1:] = c["first_ts"][1:] - c["last_ts"][:-1] <= lookback_ms
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
