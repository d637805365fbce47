"""The streaming anomaly detectors, NAB's scoring function, the root-cause ranking and
``metricvault anomaly score``."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from metricvault.analysis.detectors import DETECTORS, score_series
from metricvault.analysis.nab_score import LabelledFile, nab_score, scaled_sigmoid
from metricvault.analysis.rootcause_rank import rank_metrics
from metricvault.analysis.score_csv import parse_timestamp, score_csv
from metricvault.errors import InputError


def _series(n: int = 900, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 10 + np.sin(np.arange(n) / 20) + rng.normal(0, 0.2, n)
    if n > 700:
        x[700] += 15  # one spike
    return x


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_scores_of_a_prefix_equal_the_first_scores_of_the_whole(name: str) -> None:
    x = _series()
    whole = score_series(x, name)
    for cut in (1, 50, 699, 701):
        np.testing.assert_array_equal(score_series(x[:cut], name), whole[:cut])


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_scores_stay_in_the_unit_interval(name: str) -> None:
    s = score_series(_series(), name)
    assert s.min() >= 0.0 and s.max() <= 1.0


@pytest.mark.parametrize("name", ["gaussian-rolling", "mad", "novelty"])
def test_the_spike_scores_highest_after_warm_up(name: str) -> None:
    s = score_series(_series(), name)
    assert int(np.argmax(s[200:])) + 200 == 700


def test_multivariate_scores_equal_each_column_scored_alone() -> None:
    a, b = _series(seed=1), _series(seed=2) * 3
    both = score_series(np.column_stack([a, b]), "mad")
    np.testing.assert_allclose(both[:, 0], score_series(a, "mad"))
    np.testing.assert_allclose(both[:, 1], score_series(b, "mad"))


# --- NAB's scoring function on hand-made windows --------------------------------------------

N = 1000  # probation: 150 rows
WINDOWS = ((400, 499),)


def _nab(flags: dict[int, float], profile: str = "standard") -> float:
    s = np.zeros(N)
    for i, v in flags.items():
        s[i] = v
    return nab_score([LabelledFile(s, WINDOWS)], profile).score


@pytest.mark.parametrize(
    ("flags", "profile", "expected"),
    [
        ({}, "standard", 0.0),  # the null detector
        ({400: 1.0}, "standard", 100.0),  # first row of the window: perfect
        ({499: 1.0}, "standard", 50.0 * (1 + scaled_sigmoid(-0.01) / scaled_sigmoid(-1.0))),
        # a false positive far from any window costs fpWeight; the best threshold drops it
        ({400: 0.9, 200: 1.0}, "standard", 100.0 * (2 - 0.11) / 2),
        ({400: 0.9, 200: 1.0}, "reward_low_FP_rate", 100.0 * (2 - 0.22) / 2),
        ({400: 1.0, 100: 1.0}, "standard", 100.0),  # in the probationary period: not scored
        ({400: 1.0, 450: 1.0}, "standard", 100.0),  # a window counts once
    ],
)
def test_nab_score_of_hand_made_detections(
    flags: dict[int, float], profile: str, expected: float
) -> None:
    assert _nab(flags, profile) == pytest.approx(expected, abs=1e-9)


def test_nab_threshold_is_one_for_the_whole_set() -> None:
    # file A's detection scores 0.6, file B's false positive 0.7: one threshold takes both
    a = np.zeros(N)
    a[400] = 0.6
    b = np.zeros(N)
    b[300] = 0.7
    result = nab_score([LabelledFile(a, WINDOWS), LabelledFile(b, ())], "standard")
    assert result.threshold == pytest.approx(0.6)
    assert result.score == pytest.approx(100 * (2 - 0.11) / 2)


def test_a_false_positive_just_after_a_window_costs_less_than_a_far_one() -> None:
    near = _nab({400: 0.9, 505: 1.0})
    far = _nab({400: 0.9, 900: 1.0})
    assert far == pytest.approx(100 * (2 - 0.11) / 2)
    assert near > far


# --- root cause -------------------------------------------------------------------------------


def test_rank_metrics_puts_the_moved_metric_first() -> None:
    rng = np.random.default_rng(0)
    history = rng.normal(0, 1, (500, 5))
    segment = rng.normal(0, 1, (5, 5))
    segment[:, 3] += 12
    assert rank_metrics(history, segment)[0] == 3


def test_rank_metrics_refuses_mismatched_columns() -> None:
    with pytest.raises(InputError, match="same number of metrics"):
        rank_metrics(np.zeros((10, 3)), np.zeros((2, 4)))


# --- the CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-01T00:00:00Z", 1704067200.0),
        ("2024-01-01 00:00:00", 1704067200.0),
        ("1704067200", 1704067200.0),
        ("1704067200000", 1704067200.0),
    ],
)
def test_timestamps_iso_or_epoch_seconds_or_milliseconds(text: str, expected: float) -> None:
    assert parse_timestamp(text, "x") == expected


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("timestamp,value\n" + "".join(r + "\n" for r in rows))
    return path


def test_score_csv_keeps_the_rows_and_adds_two_columns(tmp_path: Path) -> None:
    x = _series(400)
    src = _write(
        tmp_path / "in.csv", [f"{1_700_000_000 + 300 * i},{float(v)!r}" for i, v in enumerate(x)]
    )
    out = tmp_path / "out.csv"
    assert score_csv(src, out, "mad") == 400
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["timestamp", "value", "anomaly_score", "is_anomaly"]
    assert [float(r["value"]) for r in rows] == list(x)
    scores = np.array([float(r["anomaly_score"]) for r in rows])
    np.testing.assert_allclose(scores, score_series(x, "mad"), atol=1e-6)
    assert {r["is_anomaly"] for r in rows} <= {"0", "1"}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["1700000000,1", "yesterday,2"], "line 3: timestamp 'yesterday'"),
        (["1700000000,1", "1700000300,abc"], "line 3: value 'abc' is not a number"),
        (["1700000300,1", "1700000000,2"], "line 3: .* earlier than the row before"),
        (["1700000000,nan"], "line 2: value 'nan' is not finite"),
        (["1700000000"], "line 2: expected 'timestamp,value'"),
    ],
)
def test_bad_input_names_the_line_and_leaves_the_output_alone(
    tmp_path: Path, rows: list[str], message: str
) -> None:
    src = _write(tmp_path / "in.csv", rows)
    out = tmp_path / "out.csv"
    out.write_text("before\n")
    with pytest.raises(InputError, match=message):
        score_csv(src, out)
    assert out.read_text() == "before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.csv"]


def test_a_file_without_the_header_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("time,v\n1,2\n")
    with pytest.raises(InputError, match="header 'timestamp,value'"):
        score_csv(src, tmp_path / "out.csv")


def test_cli_scores_a_file_and_refuses_an_unknown_detector(tmp_path: Path) -> None:
    src = _write(tmp_path / "in.csv", [f"{1_700_000_000 + 60 * i},{i % 7}" for i in range(200)])
    out = tmp_path / "out.csv"
    cmd = [sys.executable, "-m", "metricvault.cli", "anomaly", "score", str(src), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 201
    bad = subprocess.run([*cmd, "--detector", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "unknown detector 'nope'" in bad.stderr


# --- online scoring in a vault -----------------------------------------------------------------

T0 = 1_767_225_600_000
STEP = 300_000


def test_online_scoring_writes_score_series_once_per_sample(tmp_path: Path) -> None:
    from metricvault import Vault
    from metricvault.analysis.online import SCORE_METRIC, score_new_samples
    from metricvault.selector import Matcher

    x = _series()
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write([("cpu", {"host": "a"}, T0 + i * STEP, float(x[i])) for i in range(800)])
        first = score_new_samples(v, ['cpu{host="a"}'], T0 + 800 * STEP, "mad")
        assert first == 800
        v.write([("cpu", {"host": "a"}, T0 + i * STEP, float(x[i])) for i in range(800, 900)])
        second = score_new_samples(v, ['cpu{host="a"}'], T0 + 900 * STEP, "mad")
        assert second == 100  # only the new samples
        assert score_new_samples(v, ['cpu{host="a"}'], T0 + 900 * STEP, "mad") == 0
        (scores,) = v.select([Matcher("__name__", "=", SCORE_METRIC)], T0, T0 + 900 * STEP)
    assert scores.labels == {
        "__name__": SCORE_METRIC, "host": "a", "source_metric": "cpu", "detector": "mad"
    }  # fmt: skip
    assert len(scores.ts) == 900
    # causal: the vault's scores equal the whole series scored row by row
    np.testing.assert_allclose(scores.values, score_series(x, "mad"))
    assert int(np.argmax(scores.values[200:])) + 200 == 700


def test_online_scoring_refuses_an_unknown_detector_before_writing(tmp_path: Path) -> None:
    from metricvault import Vault
    from metricvault.analysis.online import score_new_samples

    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write([("cpu", {}, T0, 1.0)])
        with pytest.raises(InputError, match="unknown detector"):
            score_new_samples(v, ["cpu"], T0 + STEP, "nope")
