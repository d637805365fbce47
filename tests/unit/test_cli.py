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
from metricvault.errors import InputError

T0 = 1_767_225_600_000
runner = CliRunner()


@pytest.fixture
def vault_dir(tmp_path):
    path = tmp_path / "v"
    with Vault.open_local(str(path)) as v:
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
    assert json.loads(result.stdout) == []  # the data is from 2026-01-01, long before -1d


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
    with Vault.open_local(vault) as v:
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
    with Vault.open_local(vault_dir) as v:
        assert v.stats()["tiers"]["raw"]["rows"] == 2880  # untouched


# --------------------------------------------------------------------------- issue 4: experiments
@pytest.mark.parametrize(
    "command",
    [
        ("experiment", "create"),
        ("experiment", "list"),
        ("experiment", "show"),
        ("experiment", "update"),
        ("experiment", "end"),
        ("experiment", "compare"),
        ("archive", "export"),
        ("archive", "restore"),
        ("archive", "open"),
        ("archive", "verify"),
        ("archive", "list"),
    ],
)
def test_experiment_and_archive_commands_have_manual_pages(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_experiment_lifecycle_on_the_command_line(vault_dir, tmp_path):
    created = run(
        "experiment",
        "create",
        "run-1",
        "-d",
        vault_dir,
        "-l",
        'gpu_util{gpu="0"}',
        "-l",
        'gpu_util{gpu="1"}',
        "--start",
        str(T0),
        "--param",
        "lr=3e-4",
        "--param",
        "opt=adamw",
        "--tag",
        "paper",
        "--owner",
        "ana",
        "--no-git",
    )
    assert created.exit_code == 0, created.output
    shown = json.loads(run("experiment", "show", "run-1", "-d", vault_dir, "--json").output)
    assert shown["params"] == {"lr": 3e-4, "opt": "adamw"} and shown["end"] is None
    assert shown["selector"] == 'gpu_util{gpu="0"} or gpu_util{gpu="1"}'
    assert run("experiment", "update", "run-1", "-d", vault_dir, "--notes", "ok").exit_code == 0
    ended = run("experiment", "end", "run-1", "-d", vault_dir, "--at", str(T0 + 7_200_000))
    assert ended.exit_code == 0 and "02:00:00" in ended.output
    listed = run("experiment", "list", "-d", vault_dir, "-f", "csv").output
    rows = list(csv_rows(listed))
    assert rows[0]["id"] == "run-1" and rows[0]["hours"] == "2.0" and rows[0]["owner"] == "ana"
    out = tmp_path / "cmp.csv"
    run(
        "experiment",
        "create",
        "run-2",
        "-d",
        vault_dir,
        "-l",
        'gpu_util{gpu="1"}',
        "--start",
        str(T0),
        "--end",
        str(T0 + 3_600_000),
        "--no-git",
    )
    plot = tmp_path / "cmp.png"
    compared = run(
        "experiment",
        "compare",
        "run-1",
        "run-2",
        "-d",
        vault_dir,
        "-f",
        "csv",
        "-o",
        str(out),
        "--plot",
        str(plot),
        "-m",
        "gpu_util",
    )
    assert compared.exit_code == 0, compared.output
    table = pd.read_csv(out)
    assert table["experiment"].tolist() == ["run-1", "run-2"]
    assert table["duration_h"].tolist() == [2.0, 1.0]
    assert plot.stat().st_size > 1000


def csv_rows(text):
    import csv
    import io

    return csv.DictReader(io.StringIO(text))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("experiment", "create", "../x", "-l", "up"), "looks like a path"),
        (("experiment", "create", "x"), "--selector"),
        (("experiment", "create", "x", "-l", "up{"), "cannot parse"),
        (("experiment", "show", "nope"), "no experiment 'nope'"),
        (("experiment", "update", "nope", "--notes", "x"), "no experiment 'nope'"),
        (("archive", "export", "nope"), "no experiment 'nope'"),
        (("archive", "open", "missing.parquet"), "no snapshot file"),
    ],
)
def test_experiment_errors_are_clear(vault_dir, args, message):
    result = runner.invoke(
        app,
        [*args, "-d", vault_dir] if args[0] == "experiment" or args[1] == "export" else list(args),
    )
    assert result.exit_code != 0
    text = result.output + str(result.exception or "")
    assert message in text, text


def test_archive_export_and_open_on_the_command_line(vault_dir, tmp_path):
    run(
        "experiment",
        "create",
        "run-1",
        "-d",
        vault_dir,
        "-l",
        "gpu_util",
        "--start",
        str(T0),
        "--end",
        str(T0 + 3_600_000),
        "--no-git",
    )
    exported = run("archive", "export", "run-1", "-d", vault_dir, "-o", str(tmp_path))
    assert exported.exit_code == 0, exported.output
    snap = tmp_path / "run-1.parquet"
    described = run("archive", "open", str(snap))
    assert "content_hash" in described.output and "sha256:" in described.output
    got = run(
        "archive",
        "open",
        str(snap),
        'gpu_util{gpu="0"}',
        "--step",
        "1h",
        "--agg",
        "count,max",
        "-f",
        "json",
    )
    assert json.loads(got.output) == [
        {
            "timestamp": "2026-01-01T00:00:00.000Z",
            "metric": "gpu_util",
            "gpu": "0",
            "count": 720,
            "max": 49.0,
        }
    ]
    assert "ok" in run("archive", "verify", str(snap)).output


def test_experiment_create_records_the_git_head_of_the_current_repository(
    vault_dir, tmp_path, monkeypatch
):
    repo = tmp_path / "code"
    repo.mkdir()
    for args in (
        ["init", "-q"],
        ["config", "user.email", "a@example.org"],
        ["config", "user.name", "A"],
        ["remote", "add", "origin", "https://example.org/lab/train.git"],
        ["commit", "-q", "--allow-empty", "-m", "train"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.chdir(repo)
    (repo / "train.py").write_text("print('dirty')\n")
    subprocess.run(["git", "-C", str(repo), "add", "train.py"], check=True)
    result = run("experiment", "create", "r1", "-d", vault_dir, "-l", "gpu_util")
    assert result.exit_code == 0
    assert "uncommitted changes" in result.output
    with Vault.open(vault_dir) as v:
        exp = v.experiments.get("r1")
    assert exp.git_sha == head and exp.git_repo == "https://example.org/lab/train.git"


# --------------------------------------------------------------------------- issue 12
def _two_runs(vault_dir):
    for run_id, lr in (("run-1", "3e-4"), ("run-2", "1e-4")):
        selector = f'gpu_util{{gpu="{run_id[-1]}"}}'
        made = run(
            "experiment", "create", run_id, "-d", vault_dir, "-l", selector,
            "--start", str(T0), "--end", str(T0 + 3_600_000), "--param", f"lr={lr}", "--no-git",
        )  # fmt: skip
        assert made.exit_code == 0, made.output


def test_experiment_show_f_json_is_the_record_and_json_stays_its_alias(vault_dir):
    _two_runs(vault_dir)
    spelled = run("experiment", "show", "run-1", "-d", vault_dir, "-f", "json")
    assert spelled.exit_code == 0, spelled.output
    record = json.loads(spelled.output)
    assert record["id"] == "run-1" and record["params"] == {"lr": 3e-4}
    assert (
        json.loads(run("experiment", "show", "run-1", "-d", vault_dir, "--json").output) == record
    )
    long = run("experiment", "show", "run-1", "-d", vault_dir, "--format", "json").output
    assert json.loads(long) == record
    table = run("experiment", "show", "run-1", "-d", vault_dir, "-f", "table").output
    assert "selector" in table and not table.lstrip().startswith("{")
    refused = runner.invoke(app, ["experiment", "show", "run-1", "-d", vault_dir, "-f", "csv"])
    assert refused.exit_code != 0 and isinstance(refused.exception, InputError)
    assert "-f table or -f json, not 'csv'" in str(refused.exception)


def test_piped_compare_prints_two_tab_separated_tables(vault_dir):
    """Not on a terminal, the summary and the side-by-side details are each plain TSV (every
    row as wide as its header), separated by one blank line."""
    _two_runs(vault_dir)
    done = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", "experiment", "compare", "run-1", "run-2",
         "-d", vault_dir],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.rstrip("\n").split("\n\n")
    assert len(blocks) == 2, done.stdout
    summary, details = ([line.split("\t") for line in b.splitlines()] for b in blocks)
    assert summary[0][0] == "experiment" and [r[0] for r in summary[1:]] == ["run-1", "run-2"]
    assert details[0] == ["", "field / param", "run-1", "run-2"]
    for table in (summary, details):
        assert len({len(row) for row in table}) == 1, table
    lr = next(row for row in details if row[1] == "lr")
    assert lr == ["≠", "lr", "0.0003", "0.0001"]
    assert not any("─" in line or "┃" in line for line in done.stdout.splitlines())


def test_experiment_commands_have_their_own_module():
    from metricvault.cli import archive, experiments

    assert not hasattr(archive, "experiment_app")  # one home: cli/experiments.py
    names = {c.name for c in experiments.experiment_app.registered_commands}
    assert names == {"create", "update", "end", "show", "list", "compare"}
    assert {c.name for c in archive.archive_app.registered_commands} == {
        "export", "restore", "open", "verify", "list",
    }  # fmt: skip
