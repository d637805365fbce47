"""PcaDetector: streaming (no look-ahead), deterministic, and it finds a broken relation between
metrics that no per-metric band sees; plus bench/anomaly.py's machine groups."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from metricvault.analysis.detectors import make_detector
from metricvault.analysis.multivariate import PcaDetector, fit_pca
from metricvault.errors import InputError

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import anomaly as bench_anomaly  # noqa: E402


def _group(n: int, seed: int) -> np.ndarray:
    """Four metrics driven by one load signal (a machine's CPU, requests, network, memory)
    plus a fifth independent one, each with a little noise."""
    rng = np.random.default_rng(seed)
    load = 0.5 + 0.3 * np.sin(np.arange(n) * 2 * np.pi / 288) + rng.normal(0, 0.05, n)
    cols = [load, 0.8 * load + 0.1, 1.0 - 0.6 * load, 0.5 * load + 0.2, rng.uniform(0.3, 0.4, n)]
    return np.column_stack([c + rng.normal(0, 0.01, n) for c in cols])


def test_row_by_row_equals_batch_and_prefix_equals_whole() -> None:
    history, rows = _group(2000, 1), _group(300, 2)
    one = PcaDetector(5).fit(history)
    streamed = np.vstack([one.update(r) for r in rows])
    batch = PcaDetector(5).fit(history).score(rows)
    np.testing.assert_allclose(streamed, batch, rtol=1e-12, atol=1e-12)
    # the scores of a prefix are the first scores of the whole: no row sees a later one
    prefix = PcaDetector(5).fit(history).score(rows[:120])
    np.testing.assert_allclose(prefix, batch[:120], rtol=1e-12, atol=1e-12)
    # batches may be split anywhere: the smoothing carries over between calls
    split = PcaDetector(5).fit(history)
    parts = np.vstack([split.score(rows[:7]), split.score(rows[7:8]), split.score(rows[8:])])
    np.testing.assert_allclose(parts, batch, rtol=1e-12, atol=1e-12)
    # deterministic
    np.testing.assert_array_equal(PcaDetector(5).fit(history).score(rows), batch)
    assert ((batch >= 0.0) & (batch < 1.0)).all()


def test_a_broken_relation_scores_high_where_the_per_metric_band_does_not() -> None:
    history, rows = _group(3000, 3), _group(400, 4)
    broken = rows.copy()
    # metric 1 follows the inverse of the load for 20 rows: inside its own range all along
    broken[200:220, 1] = 0.8 * (1.0 - rows[200:220, 0]) + 0.1
    lo, hi = history[:, 1].min(), history[:, 1].max()
    assert ((broken[200:220, 1] >= lo) & (broken[200:220, 1] <= hi)).mean() > 0.8
    pca = PcaDetector(5, smooth=1).fit(history).score(broken).max(axis=1)
    normal = np.delete(pca, range(200, 220))
    # the anomaly is where the relation is broken most (|load - 0.5| large)
    far = 200 + np.flatnonzero(np.abs(rows[200:220, 0] - 0.5) > 0.15)
    assert len(far) > 3
    assert pca[far].min() > np.quantile(normal, 0.99)
    # the history band (mean +- k sigma per metric) does not separate the same rows
    band = make_detector("history", 5)
    scores = np.vstack([band.update(r) for r in np.vstack([history, broken])])[len(history) :]
    band_max = scores.max(axis=1)
    assert band_max[far].min() < np.quantile(np.delete(band_max, range(200, 220)), 0.99)


def test_a_metric_constant_in_the_history_does_not_make_every_wiggle_infinite() -> None:
    history = _group(1000, 5)
    history[:, 4] = 0.25
    rows = _group(50, 6)
    rows[:, 4] = 0.25 + np.linspace(0, 0.01, 50)
    scores = PcaDetector(5).fit(history).score(rows)
    assert np.isfinite(scores).all()
    assert scores[:, 4].max() < 0.9
    rows[40:, 4] = 0.9  # a real move still scores high
    assert PcaDetector(5, smooth=1).fit(history).score(rows)[45, 4] > 0.9


def test_without_fit_it_learns_from_the_first_warmup_rows() -> None:
    data = _group(700, 7)
    det = PcaDetector(5, warmup=500)
    out = np.vstack([det.update(r) for r in data])
    assert (out[:500] == 0.0).all()
    fitted = PcaDetector(5).fit(data[:500]).score(data[500:])
    np.testing.assert_allclose(out[500:], fitted, rtol=1e-12, atol=1e-12)


def test_model_keeps_the_components_that_explain_the_variance() -> None:
    history = _group(2000, 8)
    assert fit_pca(history, variance=0.9).components.shape == (5, 2)
    assert fit_pca(history, variance=0.5).components.shape == (5, 1)
    # one metric alone has no relation to learn: no component, the residual is the deviation
    assert fit_pca(history[:, :1]).components.shape == (1, 0)


def test_bad_input_is_an_input_error() -> None:
    with pytest.raises(InputError):
        PcaDetector(3).fit(np.zeros((10, 4)))
    with pytest.raises(InputError):
        PcaDetector(3).score(np.zeros((2, 3)))
    with pytest.raises(InputError):
        fit_pca(np.array([[1.0, np.nan], [2.0, 3.0]]))
    with pytest.raises(InputError):
        fit_pca(np.zeros((5, 2)), variance=0.0)
    with pytest.raises(InputError):
        PcaDetector(3, smooth=0)


def test_bench_groups_machines_and_averages_per_group() -> None:
    assert bench_anomaly.machine_group("omi-12") == "ASD"
    assert bench_anomaly.machine_group("machine-2-1") == "SMD machine-2"
    assert bench_anomaly.machine_group("machine-1-10") == "SMD machine-1"
    base = {"precision": 0.5, "recall": 0.5, "pa_f1": 0.9, "seconds": 1.0}
    rows = [
        {"machine": "omi-1", "detector": "pca", **base, "f1": 0.2, "vus_pr": 0.1},
        {"machine": "omi-2", "detector": "pca", **base, "f1": 0.4, "vus_pr": 0.3},
        {"machine": "machine-2-1", "detector": "pca", **base, "f1": 0.6, "vus_pr": 0.5},
    ]
    groups = {g["group"]: g for g in bench_anomaly.smd_groups(rows)}
    assert groups["ASD"]["f1"] == pytest.approx(0.3)
    assert groups["ASD"]["vus_pr"] == pytest.approx(0.2)
    assert groups["ASD"]["machines"] == "omi-1,omi-2"
    assert groups["SMD machine-2"]["f1"] == pytest.approx(0.6)
    # the bench's multivariate entry is this detector, fitted then streamed
    scores = bench_anomaly.MULTIVARIATE["pca"](5).fit(_group(500, 9)).score(_group(10, 10))
    assert scores.shape == (10, 5)
