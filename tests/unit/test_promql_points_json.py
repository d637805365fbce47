"""The points' JSON formatted a kind of value at a time (promql/points_json.py ``tails_of``,
``heads_of``) is the text :func:`format_value` and ``repr`` of the seconds give one by one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from metricvault.promql import STALE_NAN
from metricvault.promql.points_json import Heads, format_series, heads_of, tails_of, value_tails
from metricvault.promql.values import format_value

EDGES = [
    0.0, 1.0, -1.0, 0.5, 1e-4, -1e-4, 9.999999999999999e-05, 1.0000000000000002e-04, 1e-5,
    5e-324, 1e15, 1e15 + 0.5, 9007199254740991.0, 9007199254740992.0, 9999999999999998.0,
    1e16, -1e16, 1.2345e16, 1e21, 1e300, -1.7976931348623157e308, 123456.789, 0.1, 2.5,
    np.nan, np.inf, -np.inf, STALE_NAN, 45.0, 100.0, -3.0, 0.30000000000000004,
]  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
def test_value_texts_equal_format_value(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-12, 25, 2000)
    random = rng.normal(size=2000) * scale
    rounded = np.round(random, int(rng.integers(0, 4)))  # whole numbers and short fractions
    edges = np.array(EDGES)
    near = np.nextafter(edges[np.isfinite(edges)], 0)  # one float towards zero from each
    vs = np.concatenate([edges, random, rounded, near])
    vs = vs[~((vs == 0) & np.signbit(vs))]  # negative zero takes the one-by-one path
    assert tails_of(vs) == [format_value(v) + '"]' for v in vs.tolist()]


def test_timestamp_heads_equal_the_one_by_one_heads() -> None:
    rng = np.random.default_rng(3)
    ts = np.r_[0, 1, 999, 1000, 15_000, rng.integers(0, 2**52, 1000), 2**53 - 1, -1500]
    ts = ts.astype(np.int64)
    heads = Heads()
    assert heads_of(ts) == [heads[t] for t in ts.tolist()]


@pytest.mark.parametrize("digits", [1, 2, 9, 10, 11, 13])
def test_whole_second_heads_equal_repr_of_the_seconds(digits: int) -> None:
    """Whole seconds of one digit count take the character-matrix path (a Grafana step grid);
    mixed counts, zero, negative and fractional seconds the one-by-one path: same text."""
    rng = np.random.default_rng(digits)
    low, high = 10 ** (digits - 1), 10**digits - 1
    grid = np.arange(low, min(high, low + 60 * 40), 60, dtype=np.int64)[:40] * 1000
    spread = np.sort(rng.integers(low, high + 1, 100)) * 1000
    mixed = np.r_[5, 12, 123, np.arange(20) * 1000 + 10**12].astype(np.int64) * 1000
    fraction = grid + 500
    around_zero = np.arange(-20, 20, dtype=np.int64) * 1000
    for ts in (grid, spread, mixed, fraction, around_zero, grid[:3]):
        assert heads_of(ts) == [",[" + repr(t / 1000) + ',"' for t in ts.tolist()]


@pytest.mark.parametrize("seed", range(6))
def test_repeating_values_are_formatted_as_one_by_one(seed: int) -> None:
    """Each distinct value formatted once (np.unique) where values repeat, the sort skipped
    where they do not: the same texts as format_value of each value."""
    rng = np.random.default_rng(seed)
    pool = np.r_[np.array([x for x in EDGES if x != 0 or not np.signbit(x)]), rng.normal(size=50)]
    repeating = rng.choice(pool, 5000)
    quarters = rng.integers(0, 400, 3000) / 4.0
    rates = rng.random(3000) * 10.0 ** rng.integers(-6, 6)
    half = np.r_[rng.choice(pool, 1500), rng.normal(size=1500)]  # distinct near n/2
    for vs in (repeating, quarters, rates, half, np.array([np.nan] * 300 + [STALE_NAN] * 300)):
        assert value_tails(vs) == [format_value(v) + '"]' for v in vs.tolist()]


def test_series_formatted_together_keep_each_series_points() -> None:
    """An answer's series share one value pass: each gets its own points back, a series with
    a negative zero its own (one-by-one) text, an empty series no text."""
    steps = np.arange(100, dtype=np.int64) * 60_000 + 1_796_000_000_000
    first, second = np.arange(100) % 7 / 4.0, -np.arange(100) % 5 * 1.5
    negative = np.where(np.arange(100) % 2 == 0, -0.0, 2.0)
    items = [(steps, first), (steps[:0], first[:0]), (steps, negative), (steps[::3], second[::3])]
    out = format_series(items, with_starts=True)
    for (ts, vs), (text, starts) in zip(items, out, strict=True):
        pairs = zip(ts.tolist(), vs.tolist(), strict=True)
        expect = ",".join(f'[{t / 1000!r},"{format_value(v)}"]' for t, v in pairs)
        assert text == expect
        assert starts is not None and len(starts) == len(ts) + 1
        assert [text[s] for s in starts[:-1].tolist()] == ["["] * len(ts)
        assert int(starts[-1]) == (len(text) + 1 if text else 0)


def test_many_small_series_get_each_point_s_offset() -> None:
    """A refresh's few points of many series (no negative zero among them): each series'
    offsets come from one pass over every value, its timestamps' own (some off the second)."""
    rng = np.random.default_rng(7)
    items = []
    for i in range(40):
        n = int(rng.integers(1, 30))
        ts = 1_796_000_000_000 + np.sort(rng.choice(10_000, n, replace=False)) * (15_000 + i % 3)
        items.append((ts.astype(np.int64), rng.normal(size=n) * 10.0 ** (i % 9 - 4)))
    for (ts, vs), (text, starts) in zip(items, format_series(items, with_starts=True), strict=True):
        pieces = [
            f'[{t / 1000!r},"{format_value(v)}"]'
            for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
        ]
        assert text == ",".join(pieces)
        assert starts is not None
        assert [text[a : b - 1] for a, b in itertools.pairwise(starts.tolist())] == pieces


def test_values_arrow_writes_are_repr_s_text() -> None:
    """Below 1e10 the values' texts come from Arrow's cast (points_json.ARROW_BELOW): each is
    format_value's, at the boundaries and for digits as long as a float's."""
    from metricvault.promql import points_json

    assert points_json.arrow_writes_repr()  # this pyarrow: else repr writes them all
    rng = np.random.default_rng(3)
    edges = np.array([1e-4, 1.0000000000000002e-4, 9.999999999999999e9, 1e10 - 0.5, 0.1, 1 / 3,
                      2 / 3, 123456789.12345679, 5e-4, 4.35e-4, 0.30000000000000004])  # fmt: skip
    values = np.r_[edges, -edges, rng.random(20_000) * 10.0 ** rng.integers(-5, 17, 20_000)]
    values = values[values != 0]
    assert tails_of(values) == [format_value(v) + '"]' for v in values.tolist()]
