"""The aggregation operators add a group's rows one numpy call a row where rows are long
(promql/aggregate.py ``_add_rows``): every sum the same float as ``np.add.at``'s."""

from __future__ import annotations

import numpy as np
import pytest

from metricvault.promql import aggregate


@pytest.mark.parametrize("steps", [1, 15, 16, 1441])
def test_rows_added_row_by_row_give_add_at_s_floats(steps: int) -> None:
    rng = np.random.default_rng(steps)
    rows = rng.standard_normal((97, steps)) * 10.0 ** rng.integers(-8, 12, (97, 1))
    rows[rng.random(rows.shape) < 0.05] = np.nan
    rows[rng.random(rows.shape) < 0.05] = -0.0
    rows[3, 0], rows[4, 0] = np.inf, -np.inf
    codes = rng.integers(0, 7, 97)
    want = np.zeros((7, steps))
    np.add.at(want, codes, rows)
    got = np.zeros((7, steps))
    aggregate._add_rows(got, codes, rows)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert np.array_equal(got, want, equal_nan=True)
