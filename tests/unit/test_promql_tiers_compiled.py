"""The compiled rollup-row kernel (``promql/tiers_compiled.py``) against numpy's evaluation
(``tiers._evaluate_batch``): the same values exactly, and the same presence, for every
function it answers, on random rows (windows of 1 to 300 rows, steps on and off the rows'
times, zero and negative-zero values, counter resets, empty series), and a query through the
engine the same with the kernel as without it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metricvault import compiled
from metricvault.promql import Engine, tiers
from metricvault.promql.values import RangeVector
from tests.unit.test_promql_tiers_batched import EXPRS, RANGES
from tests.unit.test_promql_tiers_batched import engine as engine  # the fixture: a vault's

MINUTE = 60_000


@pytest.fixture(scope="module")
def kernel() -> Any:
    module = compiled.start(tiers.KERNEL, wait=True)
    assert module is not None, "numba's compiled kernel loads"
    return module


def _rows(rng: np.random.Generator, count: int, counter: bool) -> dict[str, np.ndarray]:
    """``count`` 1m rows with gaps, as the store hands them over (every column)."""
    ts = np.cumsum(rng.choice([MINUTE, MINUTE, MINUTE, 2 * MINUTE, 5 * MINUTE], count))
    ts = ts.astype(np.int64) + 1_767_225_600_000
    first_ts = ts + rng.choice([0, 0, 5_000, 15_000], count)
    last_ts = np.maximum(first_ts, ts + rng.choice([0, 45_000, 59_000], count))
    samples = rng.integers(1, 13, count).astype(np.float64)
    if counter:
        first = np.cumsum(rng.choice([0.0, 1.5, 3.0, 100.0], count))
        first[rng.random(count) < 0.05] = 0.0  # resets
        last = first + rng.choice([0.0, 0.5, 2.0], count)
        increase = last - first + rng.choice([0.0, 0.0, 1.0], count)
    else:
        first = rng.choice([0.0, -0.0, 1.0, -2.5, 97.25, 1e-300, 3e15], count)
        last = rng.choice([0.0, -0.0, 1.0, 4.0, -7.125, 1e300], count)
        increase = np.zeros(count)
    low = np.minimum(first, last) - rng.choice([0.0, 1.0], count)
    return {
        "ts": ts,
        "first_ts": first_ts,
        "last_ts": last_ts,
        "first": first,
        "last": last,
        "count": samples,
        "sum": rng.normal(0, 1e3, count) * samples,
        "min": low,
        "max": np.maximum(first, last) + rng.choice([0.0, 0.25], count),
        "increase": increase,
    }


CASES = [  # (rows per series, window in minutes, step in minutes)
    (200, 1, 1),
    (300, 5, 1),
    (600, 10, 10),
    (900, 30, 7),
    (400, 300, 60),  # windows of up to 300 rows: numpy's pairwise sum past 128
    (500, 3, 10),  # rows no window reads between the windows (their rises never needed)
]


@pytest.mark.parametrize("name", sorted(tiers.EVALUATED))
@pytest.mark.parametrize("case", CASES)
def test_the_kernel_answers_as_numpy_bit_for_bit(
    kernel: Any, name: str, case: tuple[int, int, int]
) -> None:
    rows, window, step = case
    rng = np.random.default_rng(rows * 31 + window)
    counter = name in ("rate", "increase")
    cols = [_rows(rng, rows, counter) for _ in range(4)]
    cols.insert(2, {k: v[:0] for k, v in cols[0].items()})  # a series without rows
    t0 = int(cols[0]["ts"][0])
    refs = np.arange(t0 - 3 * MINUTE, t0 + rows * 2 * MINUTE, step * MINUTE, dtype=np.int64)
    refs[::3] = refs[::3] // MINUTE * MINUTE + 5_000  # steps off the minute, some on a row
    refs.sort()
    plan = tiers.Plan(MINUTE, False, refs, window * MINUTE)
    rv = RangeVector([], refs - plan.range_ms, refs, plan.range_ms)
    lookback = 2 * MINUTE
    expected = tiers._evaluate_batch(name, cols, plan, rv, lookback)
    got = tiers._evaluate_compiled(kernel, name, cols, plan, lookback)
    # the same rows as the store lays them out: end to end, the series in another order
    order = [3, 0, 4, 2, 1]
    flat = {k: np.concatenate([cols[i][k] for i in order]) for k in cols[0]}
    ends = np.cumsum([cols[i]["ts"].size for i in order])
    at = {i: (int(e) - cols[i]["ts"].size, int(e)) for i, e in zip(order, ends, strict=True)}
    spans = np.array([at[i] for i in range(len(cols))], dtype=np.int64)
    laid = flat, spans[:, 0].copy(), spans[:, 1].copy()
    from_layout = tiers._evaluate_compiled(kernel, name, cols, plan, lookback, laid)
    reversed_plan = tiers.Plan(MINUTE, False, refs[::-1].copy(), window * MINUTE)
    descending = tiers._evaluate_compiled(kernel, name, cols, reversed_plan, lookback)
    for (value, ok), (want, want_ok), (laid_value, laid_ok), (down, down_ok) in zip(
        got, expected, from_layout, descending, strict=True
    ):
        assert np.array_equal(laid_value, value, equal_nan=True) and np.array_equal(laid_ok, ok)
        assert np.array_equal(down[::-1], value, equal_nan=True) and np.array_equal(
            down_ok[::-1], ok
        )
        assert np.array_equal(ok, want_ok)
        # equal floats (exactly: no tolerance), NaN where numpy has NaN; the sign of a zero
        # max/min is not compared: numpy's own fmax gives +0 or -0 for (0, -0) depending on
        # whether its SIMD loop or its scalar one ran
        assert np.array_equal(value, want, equal_nan=True), np.flatnonzero(value != want)[:5]


@pytest.mark.parametrize("expr", EXPRS)
def test_queries_answer_the_same_with_the_kernel_and_without(
    kernel: Any, engine: Engine, expr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    numpy_batch = tiers._evaluate_batch

    def not_numpy(*args: Any) -> Any:
        raise AssertionError("numpy evaluated what the kernel answers")

    for query in RANGES:
        monkeypatch.setattr(tiers, "USE_COMPILED", True)
        monkeypatch.setattr(tiers, "_evaluate_batch", not_numpy)
        with_kernel = engine.evaluate(expr, *query)
        assert with_kernel.served_by & {"1m", "1h"}, "rollup rows answered"
        monkeypatch.setattr(tiers, "USE_COMPILED", False)
        monkeypatch.setattr(tiers, "_evaluate_batch", numpy_batch)
        without = engine.evaluate(expr, *query)
        assert [s[0] for s in with_kernel.series] == [s[0] for s in without.series]
        for (_, ts, values), (_, want_ts, want) in zip(
            with_kernel.series, without.series, strict=True
        ):
            assert np.array_equal(ts, want_ts), (expr, query)
            assert np.array_equal(values, want, equal_nan=True), (expr, query)
