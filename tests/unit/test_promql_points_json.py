"""The points' JSON formatted a kind of value at a time (promql/points_json.py ``tails_of``,
``heads_of``) is the text :func:`format_value` and ``repr`` of the seconds give one by one."""

from __future__ import annotations

import numpy as np
import pytest

from metricvault.promql import STALE_NAN
from metricvault.promql.points_json import Heads, heads_of, tails_of
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
