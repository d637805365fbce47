"""The rollup-row windows of :mod:`tiers` compiled with numba: every series in one call.

:func:`tiers._evaluate_rows` answers ``rate``, ``increase``, ``delta`` and the ``*_over_time``
functions from 1m/1h rows with about forty numpy calls a pass, and a day's 1,441 steps are
one series a pass: a dashboard panel of 100 series paid those calls 100 times. Here one
compiled loop walks every series' rows and steps once, with the same arithmetic in the same
order, so each answer is numpy's bit for bit: sums over a window are numpy's (its ``reduceat``
adds a window's first row to the pairwise sum of the others, eight accumulators in blocks of
up to 128), and min/max are ``fmin``/``fmax`` taken left to right
(``tests/unit/test_promql_tiers_compiled.py`` checks equality on random rows).

Loaded through :mod:`metricvault.compiled` (a server starts it; until it is ready, and in a
one-shot command, :mod:`tiers` evaluates with numpy).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

# the functions it evaluates, by number
OPS = {
    "rate": 0,
    "increase": 1,
    "delta": 2,
    "count_over_time": 3,
    "sum_over_time": 4,
    "avg_over_time": 5,
    "min_over_time": 6,
    "max_over_time": 7,
    "last_over_time": 8,
    "present_over_time": 9,
}
_RATE, _INCREASE, _DELTA, _COUNT, _SUM, _AVG, _MIN, _MAX, _LAST, _PRESENT = range(10)
_jit = numba.njit(nogil=True, cache=True, error_model="numpy")


@_jit
def _pairwise(a: Any, start: int, n: int) -> float:
    """numpy's pairwise sum of ``a[start:start + n]`` (``DOUBLE_pairwise_sum``)."""
    if n < 8:
        res: float = 0.0
        for i in range(n):
            res += a[start + i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
        r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
        i = 8
        while i < n - (n % 8):
            r0 += a[start + i]
            r1 += a[start + i + 1]
            r2 += a[start + i + 2]
            r3 += a[start + i + 3]
            r4 += a[start + i + 4]
            r5 += a[start + i + 5]
            r6 += a[start + i + 6]
            r7 += a[start + i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[start + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, start, n2) + _pairwise(a, start + n2, n - n2)


@_jit
def _window_sum(a: Any, lo: int, hi: int) -> float:
    """``np.add.reduceat``'s sum of ``a[lo:hi]`` (``hi > lo``): the first, plus the rest."""
    if hi - lo == 1:
        return float(a[lo])
    total: float = a[lo] + _pairwise(a, lo + 1, hi - lo - 1)
    return total


@_jit
def _fmin(a: float, b: float) -> float:
    return a if (a <= b or b != b) else b


@_jit
def _fmax(a: float, b: float) -> float:
    return a if (a >= b or b != b) else b


@_jit
def _rise(before: float, after: float) -> float:
    return after - before if after >= before else after


@_jit
def _left(ts: Any, value: int, lo: int, hi: int) -> int:
    """The first index in ``[lo, hi)`` with ``ts >= value`` (``searchsorted``, left)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if ts[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def _extrapolate(
    result: float,
    first_v: float,
    first_t: int,
    last_t: int,
    n: float,
    start: int,
    end: int,
    range_ms: int,
    counter: bool,
    rate: bool,
) -> float:
    """rangefuncs.extrapolate for one window, operation for operation."""
    to_start = (first_t - start) / 1000.0
    to_end = (end - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    average = sampled / (n - 1)
    if counter:
        to_zero = sampled * (first_v / result)
        if result > 0 and first_v >= 0 and to_zero < to_start:
            to_start = to_zero
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if rate:
        factor = factor / (range_ms / 1000.0)
    return result * factor


@_jit
def _rises(
    first: Any,
    last: Any,
    first_ts: Any,
    last_ts: Any,
    increase: Any,
    lookback_ms: int,
    rs: int,
    lo: int,
    hi: int,
    inside: Any,
    into: Any,
) -> int:
    """Rows ``lo:hi`` (of the series from row ``rs``): the rise from the row before
    (``into``) and the rest of each row's increase (``inside``), at ``i - rs``
    (tiers._window_increase); returns ``hi``."""
    for i in range(lo, hi):
        rise = 0.0
        within = False
        if i > rs:
            rise = _rise(last[i - 1], first[i])
            within = first_ts[i] - last_ts[i - 1] <= lookback_ms
        into[i - rs] = rise
        inside[i - rs] = increase[i] - (rise if within else 0.0)
    return hi


@_jit
def evaluate(
    op: int,
    columns: Any,
    row_starts: Any,
    row_ends: Any,
    refs: Any,
    range_ms: int,
    lookback_ms: int,
    values: Any,
    ok: Any,
) -> None:
    """``op`` over every series' rows (series ``s``: rows ``row_starts[s]:row_ends[s]`` of
    ``columns``) at each of ``refs``: ``values[s, j]`` and ``ok[s, j]``."""
    ts, first_ts, last_ts, first, last, count, sums, mins, maxs, increase = columns
    counter_fn = op in (_RATE, _INCREASE)
    longest = 0
    for s in range(row_starts.size):
        longest = max(longest, row_ends[s] - row_starts[s])
    # one series' rises at a time, indexed from its first row: they stay in the CPU's caches
    # (arrays of every row measured 25 ns a row, mostly first-touch page faults)
    inside = np.empty(longest if counter_fn else 0)
    into = np.empty(longest if counter_fn else 0)
    ascending = True
    for j in range(1, refs.size):
        ascending = ascending and refs[j - 1] <= refs[j]
    for s in range(row_starts.size):
        rs, re = row_starts[s], row_ends[s]
        if re == rs:
            for j in range(refs.size):
                values[s, j] = 0.0
                ok[s, j] = False
            continue
        done = rs  # rows before this have their rises (or no window reads them)
        if counter_fn and not ascending:
            done = _rises(first, last, first_ts, last_ts, increase, lookback_ms, rs, rs, re,
                          inside, into)  # fmt: skip
        lo = hi = rs
        for j in range(refs.size):
            ref = refs[j]
            if ascending:  # each window's bounds move on from the last step's
                while lo < re and ts[lo] < ref - range_ms:
                    lo += 1
                hi = max(hi, lo)
                while hi < re and ts[hi] < ref:
                    hi += 1
                if counter_fn and hi > done:  # the rises of the rows this window adds
                    done = _rises(first, last, first_ts, last_ts, increase, lookback_ms, rs,
                                  max(done, lo), hi, inside, into)  # fmt: skip
            else:
                lo = _left(ts, ref - range_ms, rs, re)
                hi = _left(ts, ref, lo, re)
            at = min(hi, re - 1)
            edge = hi < re and ts[at] == ref and first_ts[at] == ref
            edge_value = first[at] if edge else 0.0
            has_rows = hi > lo
            n = (_window_sum(count, lo, hi) if has_rows else 0.0) + (1.0 if edge else 0.0)
            last_i = max(hi - 1, rs)
            if op >= _COUNT:
                ok[s, j] = n >= 1
                if op == _COUNT:
                    v = n
                elif op == _PRESENT:
                    v = 1.0
                elif op == _LAST:
                    v = edge_value if edge else last[last_i]
                elif op in (_SUM, _AVG):
                    v = (_window_sum(sums, lo, hi) if has_rows else 0.0) + edge_value
                    if op == _AVG:
                        v = v / n
                else:
                    rows = np.nan
                    if has_rows:
                        rows = mins[lo] if op == _MIN else maxs[lo]
                        for i in range(lo + 1, hi):
                            rows = _fmin(rows, mins[i]) if op == _MIN else _fmax(rows, maxs[i])
                    v = rows
                    if edge:
                        v = _fmin(rows, edge_value) if op == _MIN else _fmax(rows, edge_value)
                values[s, j] = v
                continue
            last_v = edge_value if edge else last[last_i]
            first_i = min(lo, re - 1)
            first_v = first[first_i] if has_rows else edge_value
            first_t = first_ts[first_i] if has_rows else ref
            last_t = ref if edge else last_ts[last_i]
            if op == _DELTA:
                result = last_v - first_v
            else:
                result = _window_sum(inside, lo - rs, hi - rs) if has_rows else 0.0
                result = result + (_window_sum(into, lo + 1 - rs, hi - rs) if hi > lo + 1 else 0.0)
                result = result + (_rise(last[last_i], edge_value) if edge and has_rows else 0.0)
            values[s, j] = _extrapolate(
                result,
                first_v,
                first_t,
                last_t,
                n,
                ref - range_ms,
                ref,
                range_ms,
                op != _DELTA,
                op == _RATE,
            )
            ok[s, j] = n >= 2


def columns_of(flat: dict[str, Any]) -> tuple[Any, ...]:
    """The kernel's columns from the rows laid end to end (empty where a function reads none)."""

    def column(name: str, dtype: type) -> Any:
        return np.ascontiguousarray(flat[name], dtype=dtype) if name in flat else np.zeros(0, dtype)

    # counts stay integers (the store's column, no 8 MB copy a million rows): their window
    # sums are the same floats as numpy's sums of them as float64 (whole numbers under 2**53)
    ints = [column(k, np.int64) for k in ("ts", "first_ts", "last_ts")]
    floats = [column(k, np.float64) for k in ("sum", "min", "max", "increase")]
    return (*ints, column("first", np.float64), column("last", np.float64),
            column("count", np.int64), *floats)  # fmt: skip


def warm() -> None:
    """Compile (or load from numba's cache) the kernel for every operation."""
    rows = {
        "ts": np.array([0, 60_000], dtype=np.int64),
        "first_ts": np.array([0, 60_000], dtype=np.int64),
        "last_ts": np.array([45_000, 105_000], dtype=np.int64),
        "first": np.array([1.0, 3.0]),
        "last": np.array([2.0, 4.0]),
        "count": np.array([4, 4], dtype=np.int64),
        "sum": np.array([6.0, 14.0]),
        "min": np.array([1.0, 3.0]),
        "max": np.array([2.0, 4.0]),
        "increase": np.array([1.0, 1.0]),
    }
    refs = np.array([60_000, 120_000], dtype=np.int64)
    for op in OPS.values():
        values = np.empty((1, 2))
        ok = np.empty((1, 2), dtype=np.bool_)
        bounds = np.array([0]), np.array([2])
        evaluate(op, columns_of(rows), *bounds, refs, 120_000, 120_000, values, ok)
        evaluate(op, columns_of(rows), *bounds, refs[::-1].copy(), 120_000, 120_000, values, ok)
