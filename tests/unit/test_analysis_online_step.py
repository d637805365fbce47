"""Online anomaly scores kept by maintain: every new sample scored once (a restart resumes from
the vault), a spike scored high and flagged, and a rule over the scores firing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from metricvault.analysis.detectors import make_detector
from metricvault.analysis.online import FLAG_METRIC, SCORE_METRIC
from metricvault.analysis.online_step import OnlineScoring
from metricvault.cli.main import app
from metricvault.config import Settings
from metricvault.errors import ConfigError
from metricvault.promql import Engine
from metricvault.rules import load_rule_files
from metricvault.rules.group import engine_query
from metricvault.selector import Matcher
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000
STEP = 60_000
SPIKE = 250


def _values(n: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 50 + 2 * np.sin(np.arange(n) / 30) + rng.normal(0, 0.3, n)
    if n > SPIKE:
        x[SPIKE] += 40  # one spike
    return x


def _write(v: Vault, x: np.ndarray, lo: int, hi: int) -> None:
    """Samples lo..hi-1 of two GPUs' temperatures (the second one degree warmer)."""
    v.write([
        ("gpu_temp", {"gpu": str(g)}, T0 + i * STEP, float(x[i] + g))
        for g in range(2)
        for i in range(lo, hi)
    ])  # fmt: skip


def _stored(v: Vault, metric: str) -> dict[str, tuple[list[int], list[float]]]:
    found = v.select([Matcher("__name__", "=", metric)], T0, T0 + 10_000 * STEP)
    return {s.labels["gpu"]: (s.ts.tolist(), s.values.tolist()) for s in found}


def _scoring(detector: str = "novelty") -> OnlineScoring:
    settings = Settings.load(
        env={}, anomaly_score_selectors=("gpu_temp",), anomaly_detector=detector
    )
    return OnlineScoring.from_settings(settings)


def test_each_step_scores_only_new_samples_and_a_restart_resumes(tmp_path: Path) -> None:
    x = _values(400)
    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        _write(v, x, 0, 300)
        step = _scoring()
        assert step.run(v, T0 + 299 * STEP) == 2 * 300
        assert step.run(v, T0 + 299 * STEP + 1) is None  # within anomaly_score_interval
        _write(v, x, 300, 350)
        assert step.run(v, T0 + 349 * STEP) == 2 * 50  # only the new ones
    with Vault.open_local(path) as v:  # a restarted maintainer: its state is the vault's
        _write(v, x, 350, 400)
        assert _scoring().run(v, T0 + 399 * STEP) == 2 * 50
        assert _scoring().run(v, T0 + 399 * STEP) == 0
        scores, flags = _stored(v, SCORE_METRIC), _stored(v, FLAG_METRIC)
        (series,) = v.select([Matcher("__name__", "=", SCORE_METRIC), Matcher("gpu", "=", "0")],
                             T0, T0 + 400 * STEP)  # fmt: skip
    every = [T0 + i * STEP for i in range(400)]
    assert set(scores) == set(flags) == {"0", "1"}
    for gpu in ("0", "1"):
        assert scores[gpu][0] == every  # one score per sample: none skipped, none twice
        assert flags[gpu][0] == every
        assert set(flags[gpu][1]) <= {0.0, 1.0}
    assert series.labels == {
        "__name__": SCORE_METRIC, "gpu": "0", "source_metric": "gpu_temp", "detector": "novelty"
    }  # fmt: skip


@pytest.mark.parametrize("detector", ["novelty", "mad", "gaussian-rolling"])
def test_a_spike_gets_a_high_score_and_is_flagged(tmp_path: Path, detector: str) -> None:
    x = _values(300)
    with Vault.open_local(str(tmp_path / "v")) as v:
        _write(v, x, 0, 300)
        _scoring(detector).run(v, T0 + 299 * STEP)
        ts, scores = _stored(v, SCORE_METRIC)["0"]
        _, flags = _stored(v, FLAG_METRIC)["0"]
    at = ts.index(T0 + SPIKE * STEP)
    assert scores[at] >= make_detector(detector).threshold()
    assert scores[at] == max(scores[100:])  # after warm-up nothing scores above the spike
    assert flags[at] == 1.0


def test_a_rule_over_the_score_fires_at_the_spike(tmp_path: Path) -> None:
    rules = tmp_path / "r.yml"
    rules.write_text(
        "groups:\n  - name: anomalies\n    rules:\n"
        "      - alert: Anomalous\n        expr: metricvault_anomaly_score > 0.9\n"
    )
    (group,) = load_rule_files([str(rules)])
    for rule in group.alerting_rules():
        rule.restored = True
    x = _values(300)
    with Vault.open_local(str(tmp_path / "v")) as v:
        _write(v, x, 0, 300)
        _scoring().run(v, T0 + 299 * STEP)
        query = engine_query(Engine(v))

        def write(samples: list[tuple[str, dict[str, str], int, float]]) -> None:
            v.write(samples)  # the rules' ALERTS series, as the evaluator writes them

        (rule,) = group.alerting_rules()
        group.evaluate(T0 + (SPIKE - 1) * STEP, query, write)
        assert rule.state() == "inactive"
        group.evaluate(T0 + SPIKE * STEP, query, write)
        assert rule.state() == "firing"
        labels = {tuple(sorted(a.labels.items())) for a in rule.active.values()}
    assert labels == {
        (("alertname", "Anomalous"), ("detector", "novelty"), ("gpu", "0"),
         ("source_metric", "gpu_temp")),
        (("alertname", "Anomalous"), ("detector", "novelty"), ("gpu", "1"),
         ("source_metric", "gpu_temp")),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("anomaly_detector", "nope", "unknown detector 'nope'"),
        ("anomaly_score_selectors", "gpu_temp{", "is not a PromQL selector"),
        ("anomaly_score_interval", "soon", "anomaly_score_interval"),
    ],
)
def test_maintain_refuses_a_bad_setting_before_writing(
    tmp_path: Path, setting: str, value: str, words: str
) -> None:
    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        _write(v, _values(10), 0, 10)
    args = ["maintain", "-d", path, "--set", "anomaly_score_selectors=gpu_temp"]
    result = CliRunner().invoke(app, [*args, "--set", f"{setting}={value}"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)  # the CLI prints it as `error (...)`
    assert words in str(result.exception)
    with Vault.open_local(path) as v:
        assert _stored(v, SCORE_METRIC) == {}


def test_maintain_scores_the_configured_series(tmp_path: Path) -> None:
    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        _write(v, _values(300), 0, 300)
    now = "2026-01-01T05:00:00Z"  # T0 + 300 minutes
    args = ["maintain", "-d", path, "--now", now, "--set", "anomaly_score_selectors=gpu_temp"]
    first = CliRunner().invoke(app, args, catch_exceptions=False)
    assert "anomaly scores: 600 new sample(s) scored (range)" in first.output
    again = CliRunner().invoke(app, args, catch_exceptions=False)
    assert "anomaly scores: 0 new sample(s) scored (range)" in again.output
    with Vault.open_local(path) as v:
        assert {gpu: len(ts) for gpu, (ts, _) in _stored(v, SCORE_METRIC).items()} == {
            "0": 300,
            "1": 300,
        }


def test_nothing_configured_is_no_step(tmp_path: Path) -> None:
    step = OnlineScoring.from_settings(Settings.load(env={}))
    assert not step.enabled
    with Vault.open_local(str(tmp_path / "v")) as v:
        assert step.run(v, T0) is None


def test_bad_settings_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="anomaly_detector: unknown detector"):
        OnlineScoring.from_settings(Settings.load(env={}, anomaly_detector="nope"))


def test_a_maintenance_loop_scores_samples_as_they_arrive(tmp_path: Path) -> None:
    from metricvault.durations import now_ms
    from metricvault.store.upkeep import MaintenanceLoop

    x = _values(120)
    start = now_ms() - 120 * STEP
    settings = Settings.load(
        env={}, anomaly_score_selectors=("gpu_temp",), anomaly_score_interval="1ms"
    )
    step = OnlineScoring.from_settings(settings)

    def rows(lo: int, hi: int) -> list[tuple[str, dict[str, str], int, float]]:
        return [("gpu_temp", {"gpu": "0"}, start + i * STEP, float(x[i])) for i in range(lo, hi)]

    def scored(v: Vault) -> int:
        found = v.select([Matcher("__name__", "=", SCORE_METRIC)], start, start + 200 * STEP)
        return sum(len(s.ts) for s in found)

    def wait_for(v: Vault, n: int) -> None:
        stop_at = time.monotonic() + 25
        while scored(v) < n and time.monotonic() < stop_at:
            time.sleep(0.05)

    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(rows(0, 100))

        def score(report: dict[str, object]) -> None:
            report["anomaly_scores"] = step.run(v)

        loop = MaintenanceLoop(v, 0.05, steps=[score])
        stop = threading.Event()
        thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_for(v, 100)
            v.write(rows(100, 120))  # arrive while the loop runs
            wait_for(v, 120)
        finally:
            stop.set()
            thread.join(timeout=25)
        assert scored(v) == 120


def test_serves_maintainer_scores_after_its_rounds(make_client) -> None:
    from metricvault.durations import now_ms

    x = _values(60)
    start = now_ms() - 60 * STEP
    _, v = make_client(
        gateway_maintain=True,
        maintain_interval="50ms",
        anomaly_score_selectors=("gpu_temp",),
        anomaly_score_interval="1ms",
    )
    v.write([("gpu_temp", {"gpu": "0"}, start + i * STEP, float(x[i])) for i in range(60)])
    stop_at = time.monotonic() + 60
    found: list[int] = []
    while time.monotonic() < stop_at:
        found = [
            len(s.ts)
            for s in v.select([Matcher("__name__", "=", SCORE_METRIC)], start, start + 61 * STEP)
        ]
        if sum(found) >= 60:
            break
        time.sleep(0.1)
    assert sum(found) == 60, f"serve's maintainer scored {found} of 60 samples"
