"""The default anomaly detector (`range`): streaming, in [0, 1], deterministic, what it flags
and what it leaves alone, and the `metricvault anomaly score` contract with it."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from metricvault.analysis.detectors import (
    DEFAULT_DETECTOR,
    DETECTORS,
    RangeDetector,
    quantile_of_sorted,
    range_excess,
    score_series,
)


def _spiky(n: int = 1500, seed: int = 5) -> np.ndarray:
    """Noise around 10 with a normal daily spike to 30 (every 288 samples)."""
    rng = np.random.default_rng(seed)
    x = 10 + rng.normal(0, 0.5, n)
    x[100::288] = 30.0
    return x


def test_the_default_detector_is_range_for_the_cli_and_online_scoring() -> None:
    from metricvault.config import Settings

    assert DEFAULT_DETECTOR == "range"
    assert Settings.load(env={}).anomaly_detector == DEFAULT_DETECTOR


def test_range_excess_is_the_distance_beyond_the_range_in_range_widths() -> None:
    lo, hi = np.array([0.0, 5.0, 5.0]), np.array([10.0, 5.0, 5.0])
    np.testing.assert_allclose(range_excess(np.array([12.0, 5.0, 6.0]), lo, hi), [0.2, 0.0, 1.0])
    np.testing.assert_allclose(range_excess(np.array([-5.0, 5.0, 5.0]), lo, hi), [0.5, 0, 0])


@pytest.mark.parametrize("cut", [1, 50, 51, 400, 999, 1000, 1001])
def test_range_scores_of_every_prefix_equal_the_first_scores_of_the_whole(cut: int) -> None:
    x = _spiky()
    x[1000:] += 25  # a level shift
    whole = score_series(x, "range")
    np.testing.assert_array_equal(score_series(x[:cut], "range"), whole[:cut])


def test_range_scores_stay_in_the_unit_interval_and_repeat_exactly() -> None:
    rng = np.random.default_rng(11)
    x = np.cumsum(rng.normal(0, 1, 3000)) * rng.choice([1.0, 1e6], 3000)
    first = score_series(x, "range")
    assert first.min() >= 0.0 and first.max() < 1.0
    np.testing.assert_array_equal(score_series(x, "range"), first)


def test_a_new_extreme_fires_once_and_a_repeated_daily_spike_does_not() -> None:
    x = _spiky()
    x[1200] = 60.0  # twice the usual spike
    s = score_series(x, "range")
    threshold = RangeDetector().threshold()
    assert np.flatnonzero(s >= threshold).tolist() == [1200]


def test_a_level_shift_inside_the_range_of_past_spikes_is_flagged_by_the_median() -> None:
    x = _spiky()
    base = x[1000:] < 20
    x[1000:][base] += 8.0  # 18: far above the usual 10, still below the daily spikes at 30
    s = score_series(x, "range")
    flagged = np.flatnonzero(s >= RangeDetector().threshold())
    assert len(flagged) == 1 and 1000 <= flagged[0] < 1012  # within the median's half-width


@pytest.mark.parametrize("n", [1, 2, 5, 12, 24])
def test_quantile_of_sorted_is_numpys_linear_quantile(n: int) -> None:
    v = np.random.default_rng(n).normal(size=(n, 3))
    ordered = np.sort(v, axis=0)
    for q in (0.0, 0.15, 0.2, 0.5, 0.9, 1.0):
        np.testing.assert_allclose(
            quantile_of_sorted(ordered, q), np.quantile(v, q, axis=0), rtol=0, atol=1e-12
        )


def _stream(detector: RangeDetector, x: np.ndarray) -> np.ndarray:
    return np.array([detector.update(np.array([v]))[0] for v in x])


def test_a_floor_that_drops_under_an_unchanged_median_is_flagged_by_the_low_quantile() -> None:
    x = _spiky()
    x[150] = 2.0  # a past dip sets the lowest value far below what follows
    x[1000:][1::3] = 7.0  # an oscillation: every third sample dips; the median stays near 10
    assert abs(np.median(x[1000:1012]) - np.median(x[900:912])) < 1.0
    flagged = np.flatnonzero(_stream(RangeDetector(), x) >= 0.5)
    assert len(flagged) == 1 and 1000 <= flagged[0] < 1012
    # without the lower quantile neither the values (7 > 2) nor the medians leave their range
    alone = _stream(RangeDetector(low_weight=0.0), x)
    assert not np.any(alone >= 0.5)


def test_one_alarm_per_event_the_detector_stays_quiet_after_it() -> None:
    x = _spiky(n=1200)
    x[900:960] = np.linspace(40, 100, 60)  # a climb: every sample is a new record
    s = score_series(x, "range")
    flagged = np.flatnonzero(s >= 0.5)
    quiet = RangeDetector().quiet
    assert flagged[0] == 900
    assert np.all(np.diff(flagged) >= quiet)


def test_a_flat_history_flags_the_first_change() -> None:
    x = np.full(500, 7.0)
    x[400] = 7.5  # after the warm-up (288 samples)
    s = score_series(x, "range")
    assert np.flatnonzero(s >= 0.5).tolist() == [400]


def test_range_scores_a_group_as_each_column_alone() -> None:
    a, b = _spiky(seed=1), _spiky(seed=2) * 1000
    b[700] = 1e6
    both = score_series(np.column_stack([a, b]), "range")
    np.testing.assert_array_equal(both[:, 0], score_series(a, "range"))
    np.testing.assert_array_equal(both[:, 1], score_series(b, "range"))


def _csv(path: Path, values: np.ndarray) -> Path:
    lines = [
        "timestamp,value",
        *(f"{1_700_000_000 + 300 * i},{float(v)!r}" for i, v in enumerate(values)),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("detector", [None, "novelty"])
def test_cli_anomaly_score_writes_the_rows_with_score_and_flag(
    tmp_path: Path, detector: str | None
) -> None:
    x = _spiky(600)
    x[500] = 80.0
    src = _csv(tmp_path / "in.csv", x)
    out = tmp_path / "out.csv"
    cmd = [sys.executable, "-m", "metricvault.cli", "anomaly", "score", str(src), "-o", str(out)]
    if detector:
        cmd += ["--detector", detector]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"with {detector or DEFAULT_DETECTOR} ->" in done.stderr
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["timestamp", "value", "anomaly_score", "is_anomaly"]
    assert [float(r["value"]) for r in rows] == list(x)
    scores = np.array([float(r["anomaly_score"]) for r in rows])
    np.testing.assert_allclose(scores, score_series(x, detector or DEFAULT_DETECTOR), atol=1e-6)
    flags = [r["is_anomaly"] for r in rows]
    assert set(flags) <= {"0", "1"} and flags[500] == "1"


def test_every_detector_is_selectable_by_name() -> None:
    assert {"range", "novelty", "gaussian", "gaussian-rolling", "mad", "history"} <= set(DETECTORS)
