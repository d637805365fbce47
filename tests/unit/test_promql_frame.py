"""``vault.promql`` and ``metricvault promql``: PromQL answers in the long shape (issue 13),
under the vault's query limits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.cli.main import app
from metricvault.config import Settings
from metricvault.errors import PromQLError
from metricvault.promql import EngineOptions

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture
def vault_dir(tmp_path: Path) -> Path:
    path = tmp_path / "v"
    with Vault.open_local(str(path)) as vault:  # counters rising by 1 (a) and 2 (b) per 15 s
        vault.write(
            [
                ("req_total", {"job": job}, T0 + i * 15_000, float(k * i))
                for job, k in (("a", 1), ("b", 2))
                for i in range(41)
            ]
        )
    return path


def test_vault_promql_is_the_long_shape(vault_dir: Path) -> None:
    with Vault.open_local(str(vault_dir)) as vault:
        instant = vault.promql("sum by (job) (rate(req_total[1m]))", T0 + 300_000)
        ranged = vault.promql("req_total", T0 + 60_000, T0 + 180_000, "1m", output="arrow")
    assert list(instant.columns) == ["timestamp", "metric", "job", "value"]
    assert instant["metric"].isna().all()  # rate drops the metric name, as in Prometheus
    assert dict(zip(instant["job"], instant["value"], strict=True)) == pytest.approx(
        {"a": 1 / 15, "b": 2 / 15}
    )
    assert ranged.num_rows == 6  # 3 steps x 2 series
    assert ranged["value"].to_pylist() == [4.0, 8.0, 12.0, 8.0, 16.0, 24.0]


def test_a_range_query_needs_a_step(vault_dir: Path) -> None:
    with (
        Vault.open_local(str(vault_dir)) as vault,
        pytest.raises(PromQLError, match="needs a step"),
    ):
        vault.promql("req_total", T0, T0 + 60_000)


def test_promql_on_the_command_line(vault_dir: Path) -> None:
    args = ["promql", "sum(req_total)", f"--start={T0 + 600_000}", "-d", str(vault_dir)]
    result = CliRunner().invoke(app, [*args, "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["value"] for r in rows] == [120.0]  # 40 + 80 at the 40th sample
    bad = CliRunner().invoke(app, ["promql", "sum(", "-d", str(vault_dir)])
    assert isinstance(bad.exception, PromQLError) and "parse error" in str(bad.exception)
    half = CliRunner().invoke(app, [*args, "--end", "now"])
    assert half.exit_code != 0 and "--end and --step" in half.output


def test_an_empty_answer_past_the_data_says_where_the_data_ends(vault_dir: Path) -> None:
    result = CliRunner().invoke(app, ["promql", "req_total", "-d", str(vault_dir)])  # now
    assert result.exit_code == 0, result.output
    assert "no series at now" in result.stderr and "raw data ends at 2026-01-01 00:10:00" in (
        result.stderr
    )


def test_answers_past_the_raw_horizon_warn_in_python_and_on_the_command_line(
    tmp_path: Path,
) -> None:
    from metricvault.errors import ApproximateAnswer

    t0, day = 1_767_225_600_000, 86_400_000
    vault = Vault.open_local(str(tmp_path / "v"), retention_raw="1d")
    vault.write([("req_total", {}, t0 + i * 15_000, float(i)) for i in range(3 * 5760)])
    vault.maintain(now_ms=t0 + 3 * day)
    with pytest.warns(ApproximateAnswer, match="raw horizon"):
        frame = vault.promql("rate(req_total[1h])", t0 + 3_600_000, t0 + 7_200_000, "1h")
    assert frame["value"].tolist() == pytest.approx([1 / 15, 1 / 15])
    vault.close()
    span = ["--start", str(t0 + 3_600_000), "--end", str(t0 + 7_200_000), "--step", "1h"]
    args = ["promql", "rate(req_total[1h])", *span, "-d", str(tmp_path / "v"), "-f", "csv"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "warning: raw samples before the raw horizon" in result.stderr


def test_engine_options_from_settings_carry_the_query_limits() -> None:
    settings = Settings.load(
        env={}, query_max_samples=123, query_max_series=7, query_timeout="90s", lookback_delta="1m"
    )
    options = EngineOptions.from_settings(settings)
    assert (options.max_samples, options.max_series) == (123, 7)
    assert (options.timeout_s, options.lookback_delta_ms) == (90.0, 60_000)
    assert EngineOptions.from_settings(settings, timeout_s=5.0).timeout_s == 5.0


@pytest.mark.parametrize(
    ("setting", "expr", "message"),
    [
        ("query_max_samples=50", "req_total[10m]", "too many samples"),  # 2 x 41
        ("query_max_series=1", "req_total", "maximum number of series (limit: 1 series)"),
    ],
)
def test_vault_promql_and_the_command_line_hold_the_vault_query_limits(
    vault_dir: Path, setting: str, expr: str, message: str
) -> None:
    name, value = setting.split("=")
    overrides: dict[str, Any] = {name: int(value)}
    with (
        Vault.open_local(str(vault_dir), Settings.load(env={}, **overrides)) as vault,
        pytest.raises(PromQLError, match=re.escape(message)) as info,
    ):
        vault.promql(expr, T0 + 600_000)
    assert info.value.kind == "execution"
    args = ["promql", expr, f"--start={T0 + 600_000}", "-d", str(vault_dir), "--set", setting]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code != 0
    assert isinstance(refused.exception, PromQLError) and message in str(refused.exception)
