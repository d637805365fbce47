"""`baseline export-rules`: the rule file promtool accepts, whose numbers are the stored
baselines and whose alert expressions evaluate (no many-to-many) in the vault's engine too."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from metricvault import Vault
from metricvault.analysis.baseline_rules import baseline_rule_groups, rules_yaml
from metricvault.analysis.baselines import HOUR_MS, BaselineSpec, run_baselines
from metricvault.errors import InputError, NotFoundError

NOW = 1_790_000_000_000 // HOUR_MS * HOUR_MS
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    ts = np.arange(NOW - 3 * 24 * HOUR_MS, NOW, 60_000)
    rng = np.random.default_rng(3)
    frames = [
        pd.DataFrame(
            {"metric": "DCGM_FI_DEV_FB_USED", "timestamp": ts,
             "value": 30_000 + 1000 * int(gpu) + rng.normal(0, 300, ts.size),
             "Hostname": "node01", "gpu": gpu, "modelName": "H100"}
        )
        for gpu in ("0", "1", "2")
    ] + [
        pd.DataFrame(
            {"metric": "tokens_total", "timestamp": ts, "value": np.arange(ts.size) * 60.0,
             "Hostname": "node01", "gpu": "", "modelName": ""}
        )
    ]  # fmt: skip
    with Vault.open_local(str(tmp_path_factory.mktemp("rules") / "v")) as v:
        v.write(pd.concat(frames, ignore_index=True))
        v.maintain(now_ms=NOW)
        specs = [
            BaselineSpec("DCGM_FI_DEV_FB_USED", window="3d", min_history="1d"),
            BaselineSpec("DCGM_FI_DEV_FB_USED", ("modelName",), "3d", "1d"),
            BaselineSpec("tokens_total", window="3d", min_history="1d"),
        ]
        run_baselines(v, specs, NOW)
        yield v


def test_rule_file_holds_the_stored_numbers_and_promtool_accepts_it(
    vault: Vault, tmp_path: Path
) -> None:
    groups = baseline_rule_groups(vault, NOW, ("p95", "p99"), "10m")
    stored = vault.promql('metricvault_baseline{stat=~"p95|p99"}', NOW)
    records = [r for g in groups["groups"] for r in g["rules"] if "record" in r]
    assert len(records) == len(stored) == 2 * (3 + 1 + 1)
    for r in records:
        value = float(r["expr"].removeprefix("vector(").removesuffix(")"))
        row = stored
        for k, v in r["labels"].items():
            row = row[row[k] == v]
        labelled = [c for c in stored.columns if c not in ("timestamp", "metric", "value")]
        row = row[row[labelled].fillna("").apply(lambda x: dict(x[x != ""]), axis=1)
                  == r["labels"]]  # fmt: skip
        assert list(row["value"]) == [value]  # repr: the same float64
    path = tmp_path / "rules.yml"
    path.write_text(rules_yaml(groups))
    if PROMTOOL is None:
        pytest.skip("promtool (Debian's prometheus) is installed by make test")
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_alert_expressions_evaluate_in_the_vault(vault: Vault) -> None:
    groups = baseline_rule_groups(vault, NOW, ("p99",))
    alerts = [r for g in groups["groups"] for r in g["rules"] if "alert" in r]
    assert {(a["alert"], a["labels"]["baseline_on"]) for a in alerts} == {
        ("DCGM_FI_DEV_FB_USED_above_baseline_p99", "Hostname,gpu,modelName"),
        ("DCGM_FI_DEV_FB_USED_above_baseline_p99", "modelName"),
        ("tokens_total_above_baseline_p99", "Hostname"),
    }
    counter = next(a for a in alerts if a["alert"].startswith("tokens"))
    assert counter["expr"].startswith("rate(tokens_total[5m]) >")
    for alert in alerts:  # would raise on a many-to-many match
        vault.promql(alert["expr"], NOW - 60_000)


@pytest.mark.parametrize(
    ("stats", "error"), [(("p42",), InputError), ((), InputError), (("mad",), InputError)]
)
def test_bad_thresholds_are_refused(vault: Vault, stats: tuple[str, ...], error: type) -> None:
    with pytest.raises(error):
        baseline_rule_groups(vault, NOW, stats)


def test_no_stored_baselines_is_a_clear_error(tmp_path: Path) -> None:
    with (
        Vault.open_local(str(tmp_path / "empty")) as v,
        pytest.raises(NotFoundError, match="first"),
    ):
        baseline_rule_groups(v, NOW)


@pytest.fixture
def small_vault(tmp_path: Path) -> str:
    path = str(tmp_path / "cli")
    ts = np.arange(NOW - 2 * 24 * HOUR_MS, NOW, 60_000)
    with Vault.open_local(path) as v:
        v.write(
            pd.DataFrame(
                {"metric": "gpu_mem", "timestamp": ts, "value": np.sin(ts / 1e7) + 5, "gpu": "0"}
            )
        )
        v.maintain(now_ms=NOW)
    return path


def _baseline_series(path: str) -> int:
    with Vault.open_local(path) as v:
        return len(v.series('{__name__="metricvault_baseline"}'))


@pytest.mark.parametrize(
    "args",
    [
        ["--selector", "gpu_mem{"],
        ["--selector", "gpu_mem", "--by", "stat"],
        ["--selector", "gpu_mem", "--window", "30m"],
        ["--selector", "gpu_mem", "--min-history", "soon"],
        [],  # nothing to baseline: no --selector and no `baselines` setting
    ],
)
def test_cli_bad_input_is_refused_and_stores_nothing(small_vault: str, args: list[str]) -> None:
    from typer.testing import CliRunner

    from metricvault.cli.main import app

    done = CliRunner().invoke(app, ["baseline", "--data", small_vault, *args])
    assert done.exit_code != 0
    assert _baseline_series(small_vault) == 0


def test_cli_stores_and_exports(small_vault: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from metricvault.cli.main import app

    runner = CliRunner()
    now = ["--now", str(NOW), "--data", small_vault]
    base = ["baseline", "--selector", "gpu_mem", "--window", "2d", "--min-history", "1d", *now]
    dry = runner.invoke(app, [*base, "--dry-run"], catch_exceptions=False)
    assert dry.exit_code == 0 and _baseline_series(small_vault) == 0
    assert runner.invoke(app, base, catch_exceptions=False).exit_code == 0
    assert _baseline_series(small_vault) == 9  # 8 statistics and trained_at
    out = tmp_path / "rules.yml"
    done = runner.invoke(app, ["baseline", "export-rules", "-o", str(out), *now])
    assert done.exit_code == 0, done.output
    assert "gpu_mem_above_baseline_p99" in out.read_text()
