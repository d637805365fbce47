"""Comparing runs as researchers do: step-aligned history, compare with params and GPUs,
experiment filters, the training API's series names, the demo report (from issue 11)."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.archive.compare import compare, curves, figure, params_table
from metricvault.archive.experiments import select
from metricvault.archive.opened import SnapshotVault
from metricvault.archive.snapshot import export_snapshot
from metricvault.cli.main import app
from metricvault.collect.training import SeriesNamesNotice, track
from metricvault.errors import InputError, NotFoundError
from metricvault.sim import ClusterSpec, generate
from tests.clocks import Clocks

DOCS = Path(__file__).resolve().parents[2] / "docs" / "archive.md"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
ID = "short-run"
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("no_nvml")


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(start_after_ms=1000, step_ms=1000)  # 1 s per reading, after the run's start


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault.open_local(str(tmp_path / "vault"))
    yield v
    v.close()


def _six_second_run(vault: Vault, clocks: Clocks) -> None:
    """A run of six steps one second apart (the wall clock advances 1 s per log call)."""
    with track(ID, **clocks.kw, data=vault, git=False) as run:
        for step in range(6):
            clocks[0] += 1.0
            run.log(step, loss=4.0 - step * 0.5, lr=1e-3 * (step + 1))


def _rank_samples(vault: Vault) -> None:
    """Two ranks whose step series differ: a join on timestamp alone would mix them."""
    vault.experiments.create("ranks", '{experiment="ranks"}', start=T0, end=T0 + 10_000)
    r0, r1 = {"experiment": "ranks", "rank": "0"}, {"experiment": "ranks", "rank": "1"}
    vault.write(
        [
            ("train_step", r0, T0 + 1000, 0.0),
            ("train_step", r0, T0 + 2000, 1.0),
            ("train_loss", r0, T0 + 1000, 3.0),
            ("train_loss", r0, T0 + 2000, 2.0),
            ("train_step", r1, T0 + 2000, 5.0),
            ("train_loss", r1, T0 + 2000, 9.0),
            ("train_loss", r1, T0 + 3000, 7.0),  # no step at this timestamp: not placed
            ("grad_norm", r0, T0 + 2000, 0.5),
        ]
    )


# ---------------------------------------------------------------------------- history
def test_history_joins_each_metric_to_the_step_series_exactly(vault: Vault) -> None:
    _rank_samples(vault)
    frame = vault.history("ranks", metrics=["train_loss", "grad_norm"])
    assert frame.index.name == "step"
    assert frame.index.tolist() == [0, 1, 5]
    assert list(frame.columns) == ["train_loss", "grad_norm"]
    assert frame["train_loss"].tolist() == [3.0, 2.0, 9.0]
    assert frame["grad_norm"].iloc[1] == 0.5
    assert frame["grad_norm"].iloc[[0, 2]].isna().all()


def test_history_averages_ranks_at_one_step_and_says_what_is_missing(
    vault: Vault,
) -> None:
    vault.experiments.create("ddp", '{experiment="ddp"}', start=T0, end=T0 + 10_000)
    vault.write(
        [
            (metric, {"experiment": "ddp", "rank": str(rank)}, T0 + 1000 + rank, value)
            for rank in range(2)
            for metric, value in (("train_step", 3.0), ("train_loss", 2.0 + rank))
        ]
    )
    assert vault.history("ddp", metrics=["train_loss"])["train_loss"].tolist() == [2.5]
    with pytest.raises(NotFoundError, match="no 'nope' samples"):
        vault.history("ddp", metrics=["nope"])
    vault.experiments.create("nosteps", '{experiment="nosteps"}', start=T0, end=T0 + 10_000)
    vault.write([("train_loss", {"experiment": "nosteps"}, T0 + 1, 1.0)])
    with pytest.raises(NotFoundError, match="no 'train_step' series"):
        vault.history("nosteps", metrics=["train_loss"])


def test_history_of_an_opened_snapshot_equals_the_vaults(vault: Vault, tmp_path: Path) -> None:
    _rank_samples(vault)
    want = vault.history("ranks", metrics=["train_loss", "grad_norm"])
    raw = export_snapshot(vault, "ranks", tmp_path / "raw")
    with SnapshotVault(str(raw.path)) as snap:  # what Vault.open gives for a .parquet file
        pd.testing.assert_frame_equal(snap.history("ranks", metrics=want.columns), want)
        with pytest.raises(NotFoundError, match="holds experiment 'ranks'"):
            snap.history("other", metrics=["train_loss"])
    rollup = export_snapshot(vault, "ranks", tmp_path / "1m", tier="1m")
    with SnapshotVault(str(rollup.path)) as snap, pytest.raises(InputError, match="raw"):
        snap.history("ranks", metrics=["train_loss"])


def test_a_six_second_run_compares_at_raw_resolution(vault: Vault, clocks: Clocks) -> None:
    _six_second_run(vault, clocks)
    by_step = curves(vault, [ID], "train_loss", align="step")
    assert by_step["x"].tolist() == [0, 1, 2, 3, 4, 5]
    assert by_step["value"].tolist() == [4.0, 3.5, 3.0, 2.5, 2.0, 1.5]
    elapsed = curves(vault, [ID], "learning_rate", align="elapsed")  # step="auto"
    assert len(elapsed) == 6
    fig = figure(vault, [ID], ["train_loss"], align="step")
    (line,) = fig.axes[0].get_lines()
    assert len(line.get_xdata()) == 6 and line.get_marker() not in ("None", "", None)


def test_compare_on_the_command_line_aligns_a_short_run_by_step(
    vault: Vault, clocks: Clocks, tmp_path: Path
) -> None:
    _six_second_run(vault, clocks)
    vault.close()
    png = tmp_path / "short.png"
    done = runner.invoke(
        app,
        ["experiment", "compare", ID, "-d", str(tmp_path / "vault"), "--plot", str(png),
         "-m", "train_loss", "--align", "step"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert png.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------- compare
SPEC = ClusterSpec(nodes=2, gpus_per_node=2, days=0.25, seed=11)


@pytest.fixture(scope="module")
def sim_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Vault, list[str]]]:
    from metricvault.demo import register_jobs

    v = Vault.open_local(str(tmp_path_factory.mktemp("sim") / "v"))
    for chunk in generate(SPEC):
        v.write(chunk)
    v.maintain(now_ms=SPEC.start_ms + 2 * 86_400_000)
    ids = register_jobs(v, SPEC)
    v.experiments.update(ids[1], params={**v.experiments.get(ids[1]).params, "gpus": 4, "lr": 3e-4})
    yield v, ids
    v.close()


def test_compare_lists_the_gpus_a_run_was_given(sim_vault) -> None:
    vault, ids = sim_vault
    table = compare(vault, ids).set_index("experiment")
    assert table.loc[ids[0], "gpu_list"] == "node01: 0-1"
    assert table.loc[ids[1], "gpu_list"] == "node02: 0-1"
    assert table.loc[ids[0], "gpu_model"] == SPEC.model_name


def test_compare_shows_params_and_marks_differences(sim_vault) -> None:
    vault, ids = sim_vault
    params = params_table(vault, ids).set_index("param")
    assert params.loc["gpus", ids[0]] == "2" and params.loc["gpus", ids[1]] == "4"
    assert params.loc["lr", ids[0]] == "" and params.loc["lr", ids[1]] == "0.0003"
    differs = params["differs"].to_dict()
    assert differs["gpus"] and differs["lr"] and not differs["flops_per_token"]
    shown = runner.invoke(app, ["experiment", "compare", *ids, "-d", str(vault.location.uri)])
    assert shown.exit_code == 0, shown.output
    marked = {re.findall(r"[a-z_]+", line)[0] for line in shown.output.splitlines() if "≠" in line}
    assert {"lr", "gpus", "gpu_list"} <= marked and "flops_per_token" not in marked, shown.output
    assert "node01: 0-1" in shown.output


# ---------------------------------------------------------------------------- list filters
def _three_experiments(vault: Vault) -> None:
    vault.experiments.create(
        "old", "{job='a'}".replace("'", '"'), start="2026-01-05", tags=["paper"],
        params={"lr": 3e-4},
    )  # fmt: skip
    vault.experiments.create(
        "r3", '{job="r3"}', start="2026-03-02", tags=["paper", "70b"], params={"lr": 3e-4}
    )
    vault.experiments.create(
        "r4", '{job="r4"}', start="2026-03-03", tags=["paper"], params={"lr": 1e-4}
    )


def test_experiments_select_by_tag_param_and_since(vault: Vault) -> None:
    _three_experiments(vault)
    every = vault.experiments.list()
    assert [e.id for e in select(every, tags=["paper"])] == ["old", "r3", "r4"]
    assert [e.id for e in select(every, tags=["paper", "70b"])] == ["r3"]
    assert [e.id for e in select(every, params={"lr": "3e-4"})] == ["old", "r3"]
    assert [e.id for e in select(every, since="2026-03-01")] == ["r3", "r4"]
    with pytest.raises(InputError, match="KEY=VALUE"):
        select(every, params={"": "x"})


def _doc_command(prefix: str) -> list[str]:
    """The one command line in docs/archive.md starting with ``prefix``, as argv."""
    lines = [line for line in DOCS.read_text().splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"docs/archive.md should show `{prefix}` once"
    return shlex.split(lines[0].split(" #")[0])[1:]


def test_experiment_list_filters_as_the_docs_show(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    _three_experiments(vault)
    monkeypatch.setenv("METRICVAULT_DATA", str(vault.location.uri))
    args = _doc_command("metricvault experiment list --tag")
    done = runner.invoke(app, [*args, "-f", "csv"])
    assert done.exit_code == 0, done.output
    assert pd.read_csv(io.StringIO(done.output))["id"].tolist() == ["r3"]


def test_failed_create_does_not_say_it_recorded_a_commit(
    vault: Vault, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "code"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.email=a@b.c", "-c", "user.name=A", "commit", "-q",
                                   "--allow-empty", "-m", "x"]):  # fmt: skip
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    monkeypatch.chdir(repo)
    data = str(vault.location.uri)
    for selector in ("up{", "up"):  # a bad selector; then an id that exists
        vault.experiments.create("taken", "up") if selector == "up" else None
        done = runner.invoke(app, ["experiment", "create", "taken", "-d", data, "-l", selector])
        assert done.exit_code != 0
        assert "recorded git commit" not in done.output, done.output
    ok = runner.invoke(app, ["experiment", "create", "fresh", "-d", data, "-l", "up"])
    assert ok.exit_code == 0 and "recorded git commit" in ok.output


# ---------------------------------------------------------------------------- track names
def test_track_says_once_which_series_the_names_are_stored_as(vault: Vault, clocks: Clocks) -> None:
    assert "train_loss" in (track.__doc__ or "") and "learning_rate" in (track.__doc__ or "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with track(ID, **clocks.kw, data=vault, git=False) as run:
            run.log(0, loss=2.0, lr=1e-3, grad_norm=1.0, accuracy=0.5)
            run.log(1, loss=1.9, lr=1e-3)
    notices = [str(w.message) for w in caught if issubclass(w.category, SeriesNamesNotice)]
    assert len(notices) == 1, notices
    assert "loss -> train_loss" in notices[0] and "lr -> learning_rate" in notices[0]
    assert "accuracy -> train_accuracy" in notices[0] and "grad_norm" not in notices[0]
    assert caught[0].filename == __file__  # points at the user's run.log call


def test_mfu_above_one_warns_once_and_is_kept(vault: Vault, clocks: Clocks) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with track(
            ID, **clocks.kw, data=vault, flops_per_token=6e12, gpu="H100-SXM", git=False
        ) as run:
            for step in range(3):
                clocks[0] += 1.0
                run.log(step, tokens=1000)  # 1000 tok/s x 6e12 / 989.4e12 = 6.06
    above = [str(w.message) for w in caught if "above 1" in str(w.message)]
    assert len(above) == 1, [str(w.message) for w in caught]
    assert "flops_per_token=6e+12" in above[0] and "H100-SXM" in above[0]
    mfu = vault.query(f'mfu{{experiment="{ID}"}}', "-1d", "+1d")["value"]
    # the first log has no previous call to measure throughput from: no MFU for it
    assert mfu.tolist() == pytest.approx([1000 * 6e12 / 989.4e12] * 2)


# ---------------------------------------------------------------------------- demo report
def test_demo_report_shows_runs_as_the_cli_does(sim_vault, tmp_path: Path) -> None:
    from metricvault.demo import _jobs_table
    from metricvault.demo_archive import ArchiveOutcome
    from metricvault.report import write_report

    vault, ids = sim_vault
    vault.experiments.update(ids[0], git_sha="3f2c9e1" + "0" * 33)
    jobs = compare(vault, ids)
    snap = export_snapshot(vault, ids[0], tmp_path / "snap", tier="1h")
    archived = ArchiveOutcome(snap, tag=f"metrics/{ids[0]}", commit="c" * 40, restored=True)
    out = tmp_path / "report.html"
    write_report(vault, SPEC, ids, jobs, vault.stats(), out, archived=archived, generated_ms=T0)
    page = out.read_text()
    cli_cells = list(_jobs_table(jobs).columns[3].cells)  # the "GPU-h" column
    for header in ("GPU-h", "util %", "kWh", "final loss"):
        assert f"<th>{header}</th>" in page
    assert all(f"<td>{cell}</td>" in page for cell in cli_cells)
    assert "Training loss against training step" in page
    assert "3f2c9e1" in page and "flops_per_token" in page
    starts = [vault.experiments.get(i).start_ms for i in ids]
    assert all(pd.Timestamp(s, unit="ms").strftime("%Y-%m-%d %H:%M") in page for s in starts)
    assert f"metrics/{ids[0]}" in page and snap.content_hash in page
    assert "generated 2026-01-01 00:00:00 UTC" in page
    assert re.search(r"img\{[^}]*width:100%", page)


def test_node_band_does_not_hide_the_mean(sim_vault) -> None:
    from metricvault.report import node_band

    vault, _ = sim_vault
    fig = node_band(vault, SPEC, "DCGM_FI_DEV_GPU_UTIL")
    ax = fig.axes[0]
    lines, bands = ax.get_lines(), ax.collections
    assert len(lines) == len(bands) == SPEC.nodes
    for line, band in zip(lines, bands, strict=True):
        assert band.get_zorder() < line.get_zorder()
        assert band.get_alpha() is not None and band.get_alpha() <= 0.2
        face = band.get_facecolor()[0][:3]
        assert np.allclose(face, __import__("matplotlib").colors.to_rgb(line.get_color()))
    assert fig.get_size_inches()[0] >= 12


def test_a_short_demo_writes_every_report_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.html"
    done = runner.invoke(
        app, ["demo", "-d", str(tmp_path / "d"), "--days", "0.1", "--report", str(report)]
    )
    assert done.exit_code == 0, done.output
    page = report.read_text()
    for section in ("Runs: commit, params, when", "Archive", "generated ", "GPU-h"):
        assert section in page
    assert "sha256:" in page and ("metrics/llama-70b-r3" in page or "not versioned" in page)
    assert page.count("data:image/png;base64,") == 4


def test_history_after_raw_retention_says_where_the_samples_are(vault: Vault) -> None:
    _rank_samples(vault)
    vault.maintain(now_ms=T0 + 400 * 86_400_000)  # raw (30 d) is gone, rollups stay
    with pytest.raises(NotFoundError, match=r"retention_raw=30d.*archive restore ranks"):
        vault.history("ranks", metrics=["train_loss"])
