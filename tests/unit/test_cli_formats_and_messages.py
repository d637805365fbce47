"""The command line's output formats and messages, and the Python API's input checks.

Output formats follow the file name, piped tables are whole, a query that matches nothing says
why, hot commands start without typer/rich/pandas, settings are checked when loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.cli.light import parsers
from metricvault.cli.main import app
from metricvault.errors import InputError

T0 = 1_767_225_600_000
UUID = "GPU-5f3c1b2a-9d8e-4f7a-b6c5-a1b2c3d4e5f6-0123456789abcdef"
runner = CliRunner()


@pytest.fixture(scope="module")
def vault_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("issue11") / "v"
    with Vault.open_local(str(path)) as v:
        v.write(
            [
                ("gpu_util", {"gpu": str(g), "UUID": f"{UUID}-{g}"}, T0 + i * 5000, float(i))
                for g in range(2)
                for i in range(720)
            ]
        )
        v.write([("gpu_temp", {"gpu": "0"}, T0, 40.0)])
    return str(path)


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real entry point, stdout a pipe (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def span(*extra: str) -> list[str]:
    return ["--start", str(T0), "--end", str(T0 + 3_600_000), *extra]


# ------------------------------------------------------------------ -o picks the format
def test_output_format_follows_the_file_extension(vault_dir, tmp_path):
    parquet, as_json = tmp_path / "q.parquet", tmp_path / "q.json"
    for out in (parquet, as_json):
        done = cli("query", "gpu_util", "-d", vault_dir, *span("--step", "1h"), "-o", str(out))
        assert done.returncode == 0, done.stderr
    assert pq.read_table(parquet).num_rows == 2
    assert [r["gpu"] for r in json.loads(as_json.read_text())] == ["0", "1"]


def test_a_format_that_contradicts_the_extension_is_refused(vault_dir, tmp_path):
    out = tmp_path / "q.parquet"
    done = cli("query", "gpu_util", "-d", vault_dir, *span(), "-f", "csv", "-o", str(out))
    assert done.returncode == 2
    assert "-f csv contradicts" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
    unknown = cli("series", "-d", vault_dir, "-o", str(tmp_path / "s.dat"))
    assert unknown.returncode == 2 and "cannot tell the format" in unknown.stderr


def test_dash_is_stdout(vault_dir, tmp_path):
    args = ["series", "-d", vault_dir, "-f", "csv", "-o", "-"]
    done = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "series_id,metric,kind,UUID,gpu"
    assert not (tmp_path / "-").exists()


# ------------------------------------------------------------------ piped tables are whole
def test_piped_table_is_tab_separated_full_width(vault_dir):
    done = cli("series", "gpu_util", "-d", vault_dir)
    lines = done.stdout.splitlines()
    assert lines[0].split("\t") == ["series_id", "metric", "kind", "UUID", "gpu"]
    assert [line.split("\t")[3] for line in lines[1:]] == [f"{UUID}-0", f"{UUID}-1"]


def test_piped_experiment_compare_keeps_every_column(vault_dir, tmp_path):
    copy = tmp_path / "v"
    subprocess.run(["cp", "-a", vault_dir, str(copy)], check=True)
    for run_id in ("run-with-a-long-name-1", "run-with-a-long-name-2"):
        made = cli(
            "experiment", "create", run_id, "-l", '{gpu="0"}', "--start", str(T0),
            "--end", str(T0 + 3_600_000), "-d", str(copy), "--no-git",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    done = cli("experiment", "compare", "run-with-a-long-name-1", "run-with-a-long-name-2",
               "-d", str(copy))  # fmt: skip
    assert done.returncode == 0, done.stderr
    first_table = done.stdout.split("\n\n")[0].splitlines()[:3]
    rows = [line.split("\t") for line in first_table]
    assert rows[0][0] == "experiment" and len({len(r) for r in rows}) == 1
    assert [r[0] for r in rows[1:]] == ["run-with-a-long-name-1", "run-with-a-long-name-2"]


# ------------------------------------------------------------------ --version, -h, -f json
def test_version_and_short_help():
    from metricvault import __version__

    assert cli("--version").stdout.strip() == f"metricvault {__version__}"
    assert runner.invoke(app, ["--version"]).stdout.strip() == f"metricvault {__version__}"
    for args in (["-h"], ["query", "-h"], ["experiment", "compare", "-h"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.output, args
    assert "--start" in cli("query", "-h").stdout  # the hot path hands -h to the manual


def test_stats_speaks_format_json_and_keeps_json(vault_dir):
    one = json.loads(cli("stats", "-d", vault_dir, "-f", "json").stdout)
    two = json.loads(cli("stats", "-d", vault_dir, "--json").stdout)
    assert one["series"] == two["series"] == 3
    typer_side = json.loads(runner.invoke(app, ["stats", "-d", vault_dir, "-f", "json"]).stdout)
    assert typer_side["series"] == 3


# ------------------------------------------------------------------ no match says why
def test_no_match_suggests_near_metric_names(vault_dir):
    done = cli("query", "gpu_utl", "-d", vault_dir, *span())
    assert done.returncode == 0
    assert "no series match gpu_utl" in done.stderr and "gpu_util" in done.stderr
    assert done.stdout == ""  # not an empty table
    labels = cli("query", 'gpu_temp{gpu="7"}', "-d", vault_dir, *span())
    assert "gpu_temp exists; its labels: gpu (0)" in labels.stderr


def test_no_samples_in_range_says_where_the_data_is(vault_dir):
    done = cli("query", "gpu_util", "-d", vault_dir, "--start=-1d")
    assert "2 series match gpu_util but none has samples in the range" in done.stderr
    assert "2026-01-01T00:00:00Z" in done.stderr


# ------------------------------------------------------------------ start-up cost
@pytest.mark.parametrize(
    "args",
    [["stats"], ["series"], ["query", "gpu_util", "--start", str(T0), "--step", "1h"]],
)
def test_hot_commands_import_neither_typer_rich_nor_pandas(vault_dir, args):
    code = (
        "import atexit, sys\n"
        "heavy = ('typer', 'rich', 'click', 'pydantic', 'pandas')\n"
        "atexit.register(lambda: print('LOADED', [m for m in heavy if sys.modules.get(m)],"
        " file=sys.stderr))\n"
        f"sys.argv = ['metricvault', *{[*args, '-d', vault_dir]!r}]\n"
        "from metricvault.cli import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED []" in done.stderr


def test_fast_path_takes_the_same_options_as_the_manual():
    import typer.main

    group = typer.main.get_command(app)
    for name, parser in parsers().items():
        command = group.commands[name]  # type: ignore[attr-defined]
        manual = {o for p in command.params for o in p.opts if o.startswith("-")}
        fast = {o for a in parser._actions for o in a.option_strings}
        assert fast == manual - {"--help", "-h"}, name


# ------------------------------------------------------------------ Python API errors
def test_polars_output_without_polars_names_the_extra(vault_dir):
    code = (
        "import sys; sys.modules['polars'] = None\n"
        "from metricvault import Vault\n"
        f"Vault.open({vault_dir!r}).query('gpu_util', {T0}, {T0 + 60_000}, output='polars')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "MissingDependencyError" in done.stderr
    assert "pip install 'metricvault[polars]'" in done.stderr


@pytest.mark.parametrize(
    "data",
    [pd.Series([1.0, 2.0]), "gpu_util 1", {"metric": "m"}, 42, None],
    ids=["pandas-series", "str", "dict", "int", "none"],
)
def test_writing_a_wrong_type_is_a_clear_error(tmp_path, data):
    with (
        Vault.open_local(str(tmp_path / "w"), create=True) as v,
        pytest.raises(InputError, match="write cannot take") as info,
    ):
        v.write(data)
    assert "metric, timestamp, value" in info.value.message


# ------------------------------------------------------------------ settings checked on load
def test_bad_override_selector_fails_when_settings_load(tmp_path, vault_dir):
    from metricvault.config import Settings
    from metricvault.errors import ConfigError

    toml = tmp_path / "bad.toml"
    toml.write_text(
        "[[retention_overrides]]\nselector = '{experiment=\"x\"'\ntier = 'raw'\n"
        "retention = 'forever'\n"
    )
    with pytest.raises(ConfigError, match=r"retention_overrides\.selector"):
        Settings.load(config_file=toml)
    done = cli("stats", "-d", vault_dir, "-c", str(toml))  # not only inside maintenance
    assert done.returncode == 2 and "retention_overrides" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_metricvault_variable_is_warned_about(vault_dir):
    done = cli("stats", "-d", vault_dir, METRICVAULT_RETENTON_RAW="90d")
    assert done.returncode == 0
    assert "METRICVAULT_RETENTON_RAW" in done.stderr
    assert "METRICVAULT_RETENTION_RAW" in done.stderr  # the near miss is named
    quiet = cli("stats", "-d", vault_dir, METRICVAULT_GATEWAY_TOKEN="x")  # used by track()
    assert "METRICVAULT_GATEWAY_TOKEN" not in quiet.stderr


# ------------------------------------------------------------------ import streams
def test_import_parses_mixed_iso_and_epoch_ms_timestamps(tmp_path):
    csv = tmp_path / "mixed.csv"
    csv.write_text(
        "metric,timestamp,value,host\n"
        f"load,{T0},1.0,007\n"
        "load,2026-01-01T00:00:01Z,2.0,007\n"
        "load,2026-01-01 00:00:02,3.0,007\n"
        "load,2026-01-01T01:00:03+01:00,4.0,007\n"
    )
    done = cli("import", str(csv), "-d", str(tmp_path / "v"))
    assert done.returncode == 0, done.stderr
    with Vault.open_local(str(tmp_path / "v")) as v:
        got = v.query("load", T0, T0 + 10_000, output="arrow")
    assert got["value"].to_pylist() == [1.0, 2.0, 3.0, 4.0]
    assert [t.timestamp() * 1000 for t in got["timestamp"].to_pylist()] == [
        T0, T0 + 1000, T0 + 2000, T0 + 3000,
    ]  # fmt: skip
    assert got["host"].to_pylist() == ["007"] * 4  # labels stay text


def test_import_reads_in_bounded_batches_and_names_a_bad_time(tmp_path, monkeypatch):
    from metricvault.store import importer

    rows = "".join(f"m,{T0 + i * 1000},{i}.0,a\n" for i in range(20_000))
    csv = tmp_path / "big.csv"
    csv.write_text("metric,timestamp,value,host\n" + rows + "m,yesterday,1.0,a\n")
    monkeypatch.setattr(importer, "CSV_BLOCK_BYTES", 64 * 1024)
    seen: list[int] = []
    with Vault.open_local(str(tmp_path / "v"), create=True) as v:
        original = v.write

        def counting_write(table: Any) -> int:
            seen.append(table.num_rows)
            return original(table)

        monkeypatch.setattr(v, "write", counting_write)
        with pytest.raises(InputError, match="'yesterday' is neither epoch milliseconds"):
            importer.import_file(v, csv)
        # issue 10/11: bad input changes nothing, even when the bad row is the file's last
        assert seen == [] and v.query("m", T0, T0 + 30_000_000, output="arrow").num_rows == 0
        csv.write_text("metric,timestamp,value,host\n" + rows)
        assert importer.import_file(v, csv) == 20_000
        assert len(seen) > 5 and max(seen) < 5_000  # never the whole file at once
        assert v.query("m", T0, T0 + 30_000_000, output="arrow").num_rows == sum(seen) == 20_000


def test_config_shows_toml_table_brackets_piped_and_on_a_terminal(monkeypatch) -> None:
    import io
    import sys

    from metricvault.cli.output import print_table

    piped = CliRunner().invoke(app, ["config"])
    assert piped.exit_code == 0, piped.output
    assert "[[retention_overrides]] selector=" in piped.stdout  # rich markup ate it as "[]"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setenv("COLUMNS", "200")
    print_table(("setting", "meaning"), [("auth", "as [[auth_bearer_tokens]] sha256='x'")])
    assert "[[auth_bearer_tokens]]" in screen.getvalue()
