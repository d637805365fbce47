"""Functions over range vectors (functions.go: extrapolatedRate, instantValue, the
``*_over_time`` family, resets, changes, deriv, predict_linear, holt_winters).

Each series is handled with numpy over all steps at once: window bounds come from
``searchsorted``; sums/min/max from ``reduceat``; counts of resets/changes from cumulative
sums; functions that need every sample of a window (quantiles, variance, regression,
smoothing) gather the windows into a (steps, samples) matrix, in chunks of steps so the matrix
stays small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from metricvault.errors import PromQLError
from metricvault.promql.aggregate import quantile_sorted, sort_nan_first
from metricvault.promql.values import RangeSeries, RangeVector

GATHER_CELLS = 1 << 21  # cells per gathered chunk (16 MiB of float64)
Result = tuple[np.ndarray, np.ndarray]  # values and presence per step
Windowed = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, slice], np.ndarray]
Check = Callable[[], None]  # the query's deadline check (limits.py), between chunks


def _no_check() -> None:
    return None


def _reduce(ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    padded = np.append(values, 0.0)
    idx = np.empty(lo.size * 2, dtype=np.int64)
    idx[0::2], idx[1::2] = lo, hi
    with np.errstate(all="ignore"):
        return np.asarray(ufunc.reduceat(padded, idx)[0::2])


reduce_windows = _reduce  # ``ufunc`` over ``values[lo:hi]`` per window (tiers.py uses it too)


def gathered(
    s: RangeSeries, lo: np.ndarray, hi: np.ndarray, fn: Windowed, check: Check = _no_check
) -> np.ndarray:
    """``fn(values, ts, mask, n, steps)`` on windows gathered as (steps, width) matrices."""
    n = hi - lo
    width = max(int(n.max()) if n.size else 0, 1)
    out = np.full(lo.size, np.nan)
    chunk = max(1, GATHER_CELLS // width)
    cols = np.arange(width)
    last = max(s.ts.size - 1, 0)
    for start in range(0, lo.size, chunk):
        check()
        part = slice(start, min(start + chunk, lo.size))
        idx = np.minimum(lo[part, None] + cols[None, :], last)
        mask = cols[None, :] < n[part, None]
        if s.ts.size == 0:
            continue
        with np.errstate(all="ignore"):
            out[part] = fn(s.values[idx], s.ts[idx], mask, n[part], part)
    return out


def extrapolated_rate(
    s: RangeSeries, lo: np.ndarray, hi: np.ndarray, rv: RangeVector, counter: bool, rate: bool
) -> Result:
    n = hi - lo
    ok = n >= 2
    if not ok.any():
        return np.zeros(lo.size), ok
    first_i, last_i = np.where(ok, lo, 0), np.where(ok, hi - 1, 0)
    v, t = s.values, s.ts
    result = v[last_i] - v[first_i]
    with np.errstate(all="ignore"):
        if counter:
            # Each reset adds the value before it; summed per window (not a running sum,
            # which one +Inf would poison for every later window).
            drops = np.zeros(v.size)
            drops[1:] = np.where(v[1:] < v[:-1], v[:-1], 0.0)
            result = result + np.where(ok, _reduce(np.add, drops, first_i + 1, last_i + 1), 0.0)
    value = extrapolate(result, v[first_i], t[first_i], t[last_i], n, rv, counter, rate)
    return value, ok


def extrapolate(
    result: np.ndarray,
    first_v: np.ndarray,
    first_t: np.ndarray,
    last_t: np.ndarray,
    n: np.ndarray,
    rv: RangeVector,
    counter: bool,
    rate: bool,
) -> np.ndarray:
    """Prometheus's extrapolation of a window's ``result`` (last - first, plus resets for
    counters) from its first and last sample towards the window's ends (functions.go); the
    rollup path (tiers.py) gives the same inputs from bucket rows."""
    with np.errstate(all="ignore"):
        to_start = (first_t - rv.starts) / 1000.0
        to_end = (rv.ends - last_t) / 1000.0
        sampled = (last_t - first_t) / 1000.0
        average = sampled / (n - 1)
        if counter:
            to_zero = sampled * (first_v / result)
            shorten = (result > 0) & (first_v >= 0) & (to_zero < to_start)
            to_start = np.where(shorten, to_zero, to_start)
        threshold = average * 1.1
        interval = sampled.copy()
        interval += np.where(to_start < threshold, to_start, average / 2)
        interval += np.where(to_end < threshold, to_end, average / 2)
        factor = interval / sampled
        if rate:
            factor = factor / (rv.range_ms / 1000.0)
        return np.asarray(result * factor)


def instant_value(s: RangeSeries, lo: np.ndarray, hi: np.ndarray, rate: bool) -> Result:
    ok = (hi - lo) >= 2
    last_i = np.where(ok, hi - 1, 1)
    prev_i = last_i - 1
    v, t = s.values, s.ts
    if v.size < 2:
        return np.zeros(lo.size), np.zeros(lo.size, dtype=bool)
    last, prev = v[last_i], v[prev_i]
    value = np.where(rate & (last < prev), last, last - prev) if rate else last - prev
    interval = t[last_i] - t[prev_i]
    ok &= interval != 0
    with np.errstate(all="ignore"):
        if rate:
            value = value / (interval / 1000.0)
    return value, ok


def over_time(
    name: str, s: RangeSeries, lo: np.ndarray, hi: np.ndarray, check: Check = _no_check
) -> Result:
    n = hi - lo
    ok = n >= 1
    if name == "count_over_time":
        return n.astype(np.float64), ok
    if name == "present_over_time":
        return np.ones(lo.size), ok
    if name == "last_over_time":
        return s.values[np.where(ok, hi - 1, 0)] if s.values.size else np.zeros(lo.size), ok
    if s.values.size == 0:
        return np.zeros(lo.size), ok
    if name == "sum_over_time":
        return _reduce(np.add, s.values, lo, hi), ok
    if name == "avg_over_time":
        with np.errstate(all="ignore"):
            return _reduce(np.add, s.values, lo, hi) / n, ok
    if name == "max_over_time":
        return _reduce(np.fmax, s.values, lo, hi), ok
    if name == "min_over_time":
        return _reduce(np.fmin, s.values, lo, hi), ok
    if name in ("stddev_over_time", "stdvar_over_time"):
        var = gathered(s, lo, hi, _variance, check)
        return (np.sqrt(var) if name == "stddev_over_time" else var), ok
    raise PromQLError(f"unknown function {name}", "bad_data")


def _variance(
    values: np.ndarray, _ts: np.ndarray, mask: np.ndarray, n: np.ndarray, _part: slice
) -> np.ndarray:
    # Relative to each window's first sample, so a constant window gives exactly 0, as
    # Prometheus's running (Welford) update does.
    shifted = values - values[:, :1]
    x = np.where(mask, shifted, 0.0)
    mean = x.sum(axis=1) / n
    dev = np.where(mask, shifted - mean[:, None], 0.0)
    return np.asarray((dev * dev).sum(axis=1) / n)


def quantile_over_time(
    s: RangeSeries, lo: np.ndarray, hi: np.ndarray, q: np.ndarray, check: Check = _no_check
) -> Result:
    def fn(values: np.ndarray, _ts: np.ndarray, mask: np.ndarray, n: np.ndarray, part: slice):  # type: ignore[no-untyped-def]
        sorted_values, counts = sort_nan_first(values.T, mask.T)
        return quantile_sorted(sorted_values, counts, q[part])

    return gathered(s, lo, hi, fn, check), (hi - lo) >= 1


def resets_changes(name: str, s: RangeSeries, lo: np.ndarray, hi: np.ndarray) -> Result:
    ok = (hi - lo) >= 1
    v = s.values
    hits = np.zeros(v.size)
    if name == "resets":
        hits[1:] = v[1:] < v[:-1]
    else:
        hits[1:] = (v[1:] != v[:-1]) & ~(np.isnan(v[1:]) & np.isnan(v[:-1]))
    acc = np.cumsum(hits)
    if v.size == 0:
        return np.zeros(lo.size), ok
    first_i, last_i = np.where(ok, lo, 0), np.where(ok, hi - 1, 0)
    return acc[last_i] - acc[first_i], ok


def _regression(
    values: np.ndarray, ts: np.ndarray, mask: np.ndarray, n: np.ndarray, intercept_ms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    x = np.where(mask, (ts - intercept_ms[:, None]) / 1e3, 0.0)
    y = np.where(mask, values, 0.0)
    sum_x, sum_y = x.sum(axis=1), y.sum(axis=1)
    sum_xy, sum_x2 = (x * y).sum(axis=1), (x * x).sum(axis=1)
    cov = sum_xy - sum_x * sum_y / n
    var = sum_x2 - sum_x * sum_x / n
    slope = cov / var
    intercept = sum_y / n - slope * sum_x / n
    init = values[:, 0]
    const = (np.where(mask, values == init[:, None], True)).all(axis=1)
    slope = np.where(const, np.where(np.isinf(init), np.nan, 0.0), slope)
    intercept = np.where(const, np.where(np.isinf(init), np.nan, init), intercept)
    return slope, intercept


def deriv(s: RangeSeries, lo: np.ndarray, hi: np.ndarray, check: Check = _no_check) -> Result:
    def fn(values: np.ndarray, ts: np.ndarray, mask: np.ndarray, n: np.ndarray, _p: slice):  # type: ignore[no-untyped-def]
        return _regression(values, ts, mask, n, ts[:, 0])[0]

    return gathered(s, lo, hi, fn, check), (hi - lo) >= 2


def predict_linear(
    s: RangeSeries, lo: np.ndarray, hi: np.ndarray, steps: np.ndarray, duration: np.ndarray,
    check: Check = _no_check,
) -> Result:  # fmt: skip
    def fn(values: np.ndarray, ts: np.ndarray, mask: np.ndarray, n: np.ndarray, part: slice):  # type: ignore[no-untyped-def]
        slope, intercept = _regression(values, ts, mask, n, steps[part])
        return slope * duration[part] + intercept

    return gathered(s, lo, hi, fn, check), (hi - lo) >= 2


def holt_winters(
    s: RangeSeries, lo: np.ndarray, hi: np.ndarray, sf: np.ndarray, tf: np.ndarray,
    check: Check = _no_check,
) -> Result:  # fmt: skip
    bad_sf = (sf <= 0) | (sf >= 1)
    if bad_sf.any():
        raise PromQLError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {sf[bad_sf][0]:f}")
    bad_tf = (tf <= 0) | (tf >= 1)
    if bad_tf.any():
        raise PromQLError(f"invalid trend factor. Expected: 0 < tf < 1, got: {tf[bad_tf][0]:f}")

    def fn(values: np.ndarray, _ts: np.ndarray, mask: np.ndarray, n: np.ndarray, part: slice):  # type: ignore[no-untyped-def]
        a, b_f = sf[part], tf[part]
        s0 = np.zeros(values.shape[0])
        s1 = values[:, 0].copy()
        trend = values[:, 1] - values[:, 0] if values.shape[1] > 1 else np.zeros_like(s1)
        # A loop over sample positions, vectorised over all steps of the chunk.
        for i in range(1, values.shape[1]):
            live = i < n
            x = a * values[:, i]
            new_trend = trend if i == 1 else b_f * (s1 - s0) + (1 - b_f) * trend
            y = (1 - a) * (s1 + new_trend)
            s0 = np.where(live, s1, s0)
            s1 = np.where(live, x + y, s1)
            trend = np.where(live, new_trend, trend)
        return s1

    return gathered(s, lo, hi, fn, check), (hi - lo) >= 2
