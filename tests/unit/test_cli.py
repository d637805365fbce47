"""The command line: help reads like a manual, commands print and save results, errors are clear."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.cli.main import app

T0 = 1_767_225_600_000
runner = CliRunner()


@pytest.fixture
def vault_dir(tmp_path):
    path = tmp_path / "v"
    with Vault.open(str(path)) as v:
        v.write(
            [
                ("gpu_util", {"gpu": str(g)}, T0 + i * 5000, float(i % 50))
                for g in range(2)
                for i in range(1440)
            ]
        )
        v.maintain(now_ms=T0 + 86_400_000 * 2)
    return str(path)


def run(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_help_lists_every_command_with_a_sentence():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("query", "sql", "series", "stats", "maintain", "import", "config", "demo"):
        assert command in result.output


@pytest.mark.parametrize(
    "command", ["query", "sql", "series", "stats", "maintain", "import", "demo"]
)
def test_each_command_has_a_manual_page(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "--data" in result.output or command == "demo"


def test_query_csv_matches_the_python_api(vault_dir, tmp_path):
    out = tmp_path / "q.csv"
    result = run(
        "query",
        'gpu_util{gpu="1"}',
        "-d",
        vault_dir,
        "--start",
        str(T0),
        "--end",
        str(T0 + 7_200_000),
        "--step",
        "1h",
        "--agg",
        "mean,max,count",
        "-f",
        "csv",
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    got = pd.read_csv(out)
    assert got["count"].tolist() == [720, 720]
    assert got["max"].tolist() == [49.0, 49.0]
    assert list(got.columns) == ["timestamp", "metric", "gpu", "mean", "max", "count"]


def test_relative_times_and_json_output(vault_dir):
    result = run("query", "gpu_util", "-d", vault_dir, "--start=-1d", "-f", "json")
    assert result.exit_code == 0
    assert json.loads(result.output) == []  # the data is from 2026-01-01, long before -1d


def test_stats_json_and_series_and_sql(vault_dir):
    stats = json.loads(run("stats", "-d", vault_dir, "--json").output)
    assert stats["series"] == 2 and stats["tiers"]["raw"]["rows"] == 2880
    series = run("series", "-d", vault_dir, "-f", "csv").output
    assert series.splitlines()[0] == "series_id,metric,kind,gpu"
    sql = run("sql", "SELECT count(*) AS n FROM raw", "-d", vault_dir, "-f", "csv").output
    assert sql.split() == ["n", "2880"]


def test_import_csv_then_query(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text(f"metric,timestamp,value,host\nload,{T0},1.5,a\nload,{T0 + 1000},2.5,a\n")
    vault = str(tmp_path / "new")
    assert run("import", str(csv), "-d", vault).exit_code == 0
    with Vault.open(vault) as v:
        assert v.query("load", T0, T0 + 5000)["value"].tolist() == [1.5, 2.5]


def test_errors_are_one_clear_line_and_exit_2(vault_dir, tmp_path):
    cmd = [sys.executable, "-m", "metricvault.cli", "query", "gpu util", "-d", vault_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "SelectorError" in proc.stderr and "Traceback" not in proc.stderr
    missing = [sys.executable, "-m", "metricvault.cli", "stats", "-d", str(tmp_path / "nope")]
    proc = subprocess.run(missing, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no vault at" in proc.stderr
    assert not (tmp_path / "nope").exists()


def test_set_overrides_settings(vault_dir):
    result = run("config", "--set", "retention_raw=90d")
    assert "90d" in result.output
    bad = runner.invoke(app, ["stats", "-d", vault_dir, "--set", "no_such=1"])
    assert bad.exit_code != 0


def test_demo_never_replaces_a_vault_it_did_not_make(vault_dir, tmp_path):
    result = runner.invoke(
        app, ["demo", "-d", vault_dir, "--days", "0.01", "--report", str(tmp_path / "r.html")]
    )
    assert result.exit_code != 0
    assert "was not made by 'metricvault demo'" in str(result.exception) + result.output
    with Vault.open(vault_dir) as v:
        assert v.stats()["tiers"]["raw"]["rows"] == 2880  # untouched
