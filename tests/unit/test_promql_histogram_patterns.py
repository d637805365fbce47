"""histogram_quantile evaluates together the steps at which the same buckets are present
(promql/histogram.py ``_patterns``): every step in exactly one pattern, the one it has."""

from __future__ import annotations

import numpy as np
import pytest

from metricvault.promql import histogram


@pytest.mark.parametrize("buckets", [1, 12, 62, 63, 80])
@pytest.mark.parametrize("kind", ["all present", "one bucket gone at times", "random"])
def test_each_step_is_in_the_one_pattern_it_has(buckets: int, kind: str) -> None:
    rng = np.random.default_rng(buckets)
    present = np.ones((buckets, 500), dtype=bool)
    if kind == "one bucket gone at times":
        present[buckets // 2, ::7] = False
    elif kind == "random":
        present = rng.random((buckets, 500)) < 0.97
    found = histogram._patterns(present)
    steps = np.sort(np.concatenate([cols for _, cols in found]))
    assert np.array_equal(steps, np.arange(500))  # each step once
    for pattern, cols in found:
        assert (present[:, cols] == pattern[:, None]).all()
    assert len({p.tobytes() for p, _ in found}) == len(found)  # distinct patterns
    want = np.unique(present.T, axis=0)
    assert len(found) == len(want)
