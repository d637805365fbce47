"""Issue 4: the experiment registry, deterministic snapshots, and snapshots opened with the
query API (answers equal the vault's)."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault import Vault
from metricvault.archive.compare import compare, curves, plot, restrict
from metricvault.archive.opened import SnapshotVault
from metricvault.archive.snapshot import export_snapshot
from metricvault.archive.snapshot_format import (
    RAW_SCHEMA,
    ROLLUP_SCHEMA,
    content_hash,
    read_metadata,
)
from metricvault.errors import (
    ConflictError,
    InputError,
    NotFoundError,
    ReadOnlyError,
    SelectorError,
    TimeRangeError,
)
from metricvault.experiment import Experiment
from metricvault.sim import ClusterSpec, generate

SPEC = ClusterSpec(nodes=2, gpus_per_node=2, days=0.5, seed=11)
HOUR = 3_600_000
R3_START = SPEC.start_ms + 2 * HOUR  # aligned to every step below: buckets coincide
R3_END = SPEC.start_ms + 6 * HOUR
R3_SELECTOR = '{job="llama-70b-r3"} or {Hostname="node01"}'


def _fill(path: Path, spec: ClusterSpec = SPEC) -> Vault:
    vault = Vault.open_local(str(path))
    for chunk in generate(spec):
        vault.write(chunk)
    return vault


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory):
    v = _fill(tmp_path_factory.mktemp("vault") / "v")
    v.maintain(now_ms=SPEC.start_ms + 2 * 86_400_000)
    v.experiments.create(
        "r3", R3_SELECTOR, start=R3_START, end=R3_END, git_sha="ab" * 20, params={"lr": 1.5e-4}
    )
    v.experiments.create(
        "r4", '{job="llama-70b-r4"} or {Hostname="node02"}', start=R3_START, end=R3_END
    )
    yield v
    v.close()


@pytest.fixture(scope="module")
def snapshots(vault, tmp_path_factory):
    out = tmp_path_factory.mktemp("snap")
    return {
        tier: export_snapshot(vault, "r3", out / tier, tier=tier) for tier in ("raw", "1m", "1h")
    }


# --------------------------------------------------------------------------- registry
def test_experiment_round_trip(tmp_path):
    with Vault.open_local(str(tmp_path / "v")) as v:
        created = v.experiments.create(
            "llama-7b.lr3e-4_a",
            '{job="x"}',
            start="2026-01-01",
            tags=["paper", "ablation"],
            owner="ana",
            notes="first try",
            params={"lr": 3e-4, "layers": [1, 2]},
        )
        assert created.end_ms is None and created.name == "llama-7b.lr3e-4_a"
        assert v.experiments.get("llama-7b.lr3e-4_a") == created
        updated = v.experiments.update("llama-7b.lr3e-4_a", notes="second", tags=["x"])
        assert updated.notes == "second" and updated.tags == ("x",)
        ended = v.experiments.end("llama-7b.lr3e-4_a", at="2026-01-02")
        assert ended.end_ms == 1_767_312_000_000
        assert [e.id for e in v.experiments.list()] == ["llama-7b.lr3e-4_a"]
        record = json.loads(ended.to_json())
        assert record["start"] == "2026-01-01T00:00:00.000Z" and record["params"]["layers"] == [
            1,
            2,
        ]
        assert Experiment.from_record(record) == ended
        rows = v.sql("SELECT id, owner, tags FROM experiments")
        assert rows.to_dict("records") == [{"id": "llama-7b.lr3e-4_a", "owner": "ana", "tags": "x"}]


@pytest.mark.parametrize(
    ("bad_id", "message"),
    [
        ("", "empty"),
        ("a" * 129, "129 characters"),
        ("../etc", "looks like a path"),
        ("runs/r3", "looks like a path"),
        ("runs\\r3", "looks like a path"),
        (".hidden", "looks like a path"),
        ("~r3", "looks like a path"),
        ("a..b", "looks like a path"),
        ("r3 final", "not a safe slug"),
        ("r3.lock", "not a safe slug"),
        ("r3.", "not a safe slug"),
        ("-r3", "not a safe slug"),
        ("r3:1", "not a safe slug"),
        ("ré3", "not a safe slug"),
    ],
)
def test_unsafe_experiment_ids_are_refused(tmp_path, bad_id, message):
    with Vault.open(str(tmp_path / "v")) as v:
        with pytest.raises(InputError, match=message):
            v.experiments.create(bad_id, "up")
        assert v.experiments.ids() == []


def test_128_character_id_is_accepted(tmp_path):
    with Vault.open(str(tmp_path / "v")) as v:
        assert v.experiments.create("a" * 128, "up").id == "a" * 128


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"selector": "up{"}, SelectorError, "cannot parse"),
        ({"selector": '{job=~".*"}'}, SelectorError, "matches every series"),
        ({"end": "2025-01-01", "start": "2026-01-01"}, InputError, "before it starts"),
        ({"git_sha": "not-a-sha"}, InputError, "hexadecimal"),
        ({"tags": ["a,b"]}, InputError, "without commas"),
        ({"params": {"x": float("nan")}}, InputError, "params must be JSON"),
        ({"start": "yesterday-ish"}, InputError, "yesterday-ish"),
    ],
)
def test_invalid_experiment_fields_are_refused(tmp_path, fields, error, message):
    with Vault.open(str(tmp_path / "v")) as v:
        selector = fields.pop("selector", "up")
        with pytest.raises(error, match=message):
            v.experiments.create("r1", selector, **fields)
        assert "r1" not in v.experiments


def test_duplicate_unknown_and_uneditable(tmp_path):
    with Vault.open(str(tmp_path / "v")) as v:
        v.experiments.create("r1", "up")
        with pytest.raises(ConflictError, match="already exists"):
            v.experiments.create("r1", "down")
        assert v.experiments.get("r1").selector == "up"
        with pytest.raises(NotFoundError, match="did you mean r1"):
            v.experiments.get("r1x")
        with pytest.raises(InputError, match="cannot update id"):
            v.experiments.update("r1", id="r9")
        with pytest.raises(InputError, match="before it starts"):
            v.experiments.update("r1", end="1999-01-01")
        assert v.experiments.get("r1").end_ms is None


# --------------------------------------------------------------------------- export
def test_snapshot_schema_and_metadata(vault, snapshots):
    info = snapshots["raw"]
    table = pq.read_table(info.path)
    assert table.schema.remove_metadata() == RAW_SCHEMA
    assert pq.read_table(snapshots["1m"].path).schema.remove_metadata() == ROLLUP_SCHEMA
    assert set(table["experiment_id"].to_pylist()) == {"r3"}
    assert set(table["git_sha"].to_pylist()) == {"ab" * 20}
    meta = read_metadata(info.path)
    assert meta["schema_version"] == "1" and meta["tier"] == "raw"
    assert json.loads(meta["experiment"])["params"] == {"lr": 1.5e-4}
    assert int(meta["rows"]) == table.num_rows == info.rows
    span = json.loads(meta["time_range"])
    assert span["start_ms"] == R3_START and span["end_ms"] == R3_END
    ts = table["timestamp"].cast(pa.int64()).to_numpy()
    assert span["first_ms"] == ts.min() >= R3_START and span["last_ms"] == ts.max() < R3_END
    assert meta["content_hash"] == content_hash(info.path) == info.content_hash
    assert pq.ParquetFile(info.path).metadata.row_group(0).column(0).compression == "ZSTD"


def test_snapshot_rows_are_the_vaults_samples(vault, snapshots):
    frame = pq.read_table(snapshots["raw"].path).to_pandas()
    keys = list(zip(frame["metric"], frame["labels"], strict=True))
    assert keys == sorted(keys), "rows are ordered by metric, labels, then time"
    expected = vault.query(R3_SELECTOR, R3_START, R3_END)
    assert len(frame) == len(expected)
    for (metric, labels), rows in frame.groupby(["metric", "labels"], sort=False):
        sel = metric + "{" + ",".join(f'{k}="{v}"' for k, v in json.loads(labels).items()) + "}"
        want = vault.query(sel, R3_START, R3_END)
        assert rows["timestamp"].is_monotonic_increasing
        np.testing.assert_array_equal(rows["timestamp"].to_numpy(), want["timestamp"].to_numpy())
        np.testing.assert_array_equal(rows["value"].to_numpy(), want["value"].to_numpy())


def test_rollup_snapshot_rows_are_the_vaults_rollups(vault, snapshots):
    frame = pq.read_table(snapshots["1m"].path).to_pandas()
    aggs = ("count", "sum", "min", "max", "last", "increase")
    want = vault.query(R3_SELECTOR, R3_START, R3_END, step="1m", aggs=aggs)
    assert len(frame) == len(want)
    got = frame.sort_values(["metric", "labels", "timestamp"])[list(aggs)].reset_index(drop=True)
    want = want.sort_values(["metric", *[c for c in want if c not in aggs and c != "metric"]])
    assert got["count"].sum() == want["count"].sum() == snapshots["raw"].rows
    assert np.isclose(got["sum"].sum(), want["sum"].sum())


def test_export_is_byte_identical_whatever_the_storage_layout(tmp_path):
    """Same data -> same bytes: before compaction (data fresh from the buffer) and after."""
    start, end = SPEC.start_ms + HOUR, SPEC.start_ms + 3 * HOUR
    with _fill(tmp_path / "a") as a:
        a.experiments.create("r3", R3_SELECTOR, start=start, end=end)
        first = export_snapshot(a, "r3", tmp_path / "out1")
        a.maintain(now_ms=SPEC.start_ms + 2 * 86_400_000)
        second = export_snapshot(a, "r3", tmp_path / "out2")
    assert _sha(first.path) == _sha(second.path)
    with _fill(tmp_path / "b") as b:
        row = b.query('mfu{job="llama-70b-r3"}', start, end).iloc[10]
        labels = {k: v for k, v in row.items() if k not in ("timestamp", "metric", "value")}
        b.write([("mfu", labels, row["timestamp"].value // 1_000_000, row["value"] + 0.5)])
        # the same record as vault a's (created_ms differs otherwise): only the data differs
        (tmp_path / "b" / "experiments").mkdir()
        shutil.copy(tmp_path / "a" / "experiments" / "r3.json", tmp_path / "b" / "experiments")
        changed = export_snapshot(b, "r3", tmp_path / "out3")
    assert changed.content_hash != first.content_hash
    assert _sha(changed.path) != _sha(first.path)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_export_metric_filter(vault, tmp_path):
    info = export_snapshot(vault, "r3", tmp_path, metrics=["mfu", "train_loss"])
    assert set(pq.read_table(info.path)["metric"].to_pylist()) == {"mfu", "train_loss"}
    assert info.metrics == ("mfu", "train_loss")
    with pytest.raises(NotFoundError, match="no series of metric"):
        export_snapshot(vault, "r3", tmp_path / "x", metrics=["nope"])
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_export_refusals_leave_no_file(vault, tmp_path):
    with pytest.raises(NotFoundError, match="no experiment 'r9'"):
        export_snapshot(vault, "r9", tmp_path)
    with pytest.raises(InputError, match="unknown tier"):
        export_snapshot(vault, "r3", tmp_path, tier="5m")
    vault.experiments.create("empty", '{job="nobody"}', start=R3_START, end=R3_END)
    with pytest.raises(NotFoundError, match="matches no series"):
        export_snapshot(vault, "empty", tmp_path)
    vault.experiments.create("before", R3_SELECTOR, start="2020-01-01", end="2020-01-02")
    with pytest.raises(NotFoundError, match="no raw data"):
        export_snapshot(vault, "before", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_raw_export_after_raw_retention_is_refused(tmp_path):
    spec = ClusterSpec(nodes=1, gpus_per_node=1, days=0.25, seed=3)
    with _fill(tmp_path / "v", spec) as v:
        v.maintain(now_ms=spec.start_ms + 40 * 86_400_000)  # raw (30 d) has expired
        v.experiments.create(
            "old", '{Hostname="node01"}', start=spec.start_ms, end=spec.start_ms + 3 * HOUR
        )
        with pytest.raises(TimeRangeError, match="--tier 1m"):
            export_snapshot(v, "old", tmp_path / "out")
        assert export_snapshot(v, "old", tmp_path / "out", tier="1m").rows > 0


# --------------------------------------------------------------------------- opened snapshots
QUERIES = [
    ('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "1h", ("mean", "max", "count")),
    ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="node01"}', "1h", ("increase", "last")),
    ('train_loss{job="llama-70b-r3"}', "all", ("last", "min", "mean")),
    ('DCGM_FI_DEV_POWER_USAGE{gpu="1", Hostname="node01"}', "2h", ("sum", "min")),
]


@pytest.mark.parametrize("tier", ["raw", "1m", "1h"])
@pytest.mark.parametrize(("selector", "step", "aggs"), QUERIES)
def test_opened_snapshot_answers_like_the_vault(vault, snapshots, tier, selector, step, aggs):
    want = vault.query(selector, R3_START, R3_END, step=step, aggs=aggs)
    with Vault.open(str(snapshots[tier].path)) as snap:
        assert isinstance(snap, SnapshotVault)  # Vault.open dispatches a .parquet path
        got = snap.query(selector, R3_START, R3_END, step=step, aggs=aggs)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12)


def test_opened_raw_snapshot_returns_the_raw_samples(vault, snapshots):
    sel = 'mfu{job="llama-70b-r3"}'
    with SnapshotVault(snapshots["raw"].path) as snap:
        pd.testing.assert_frame_equal(snap.query(sel), vault.query(sel, R3_START, R3_END))
        assert len(snap.series()) == snapshots["raw"].series
        assert snap.sql("SELECT count(*) AS n FROM snapshot")["n"][0] == snapshots["raw"].rows
        assert snap.sql("SELECT git_sha FROM experiments")["git_sha"][0] == "ab" * 20
        assert snap.stats()["content_hash"] == snapshots["raw"].content_hash
        with pytest.raises(ReadOnlyError, match="frozen"):
            snap.write([("up", {}, R3_START, 1.0)])


def test_opened_rollup_snapshot_refusals(snapshots, tmp_path):
    with SnapshotVault(snapshots["1h"].path) as snap:
        with pytest.raises(InputError, match="pass a step"):
            snap.query("mfu")
        with pytest.raises(InputError, match="multiple of 1h"):
            snap.query("mfu", step="1m")
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), plain)
    with pytest.raises(InputError, match="not a metricvault snapshot"):
        SnapshotVault(plain)
    with pytest.raises(NotFoundError):
        SnapshotVault(tmp_path / "missing.parquet")


# --------------------------------------------------------------------------- compare
def test_restrict_narrows_each_alternative_to_one_metric():
    assert restrict('{job="a"} or up{b="c"}', "mfu") == '{__name__="mfu", job="a"}'
    assert (
        restrict('{job="a"} or {b="c"}', "x") == '{__name__="x", job="a"} or {__name__="x", b="c"}'
    )


def test_compare_figures_come_from_the_data(vault):
    table = compare(vault, ["r3", "r4"]).set_index("experiment")
    r3 = table.loc["r3"]
    assert r3["duration_h"] == 4 and r3["gpus"] == 2 and r3["gpu_hours"] == 8
    util = vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', R3_START, R3_END)
    assert r3["gpu_util_mean"] == pytest.approx(util["value"].mean())
    assert r3["gpu_util_max"] == util["value"].max()
    energy = vault.query(
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="node01"}', R3_START - 60_000, R3_END
    )
    increase = sum(
        (
            g["value"]
            .diff()
            .clip(lower=0)
            .fillna(0)[g["timestamp"] >= pd.Timestamp(R3_START, unit="ms", tz="UTC")]
        ).sum()
        for _, g in energy.groupby("gpu")
    )
    assert r3["energy_kwh"] == pytest.approx(increase / 3.6e9)
    loss = vault.query('train_loss{job="llama-70b-r3"}', R3_START, R3_END)
    assert r3["final_loss"] == loss["value"].iloc[-1]


def test_curves_align_by_elapsed_step_and_time(vault, tmp_path):
    elapsed = curves(vault, ["r3"], "mfu", align="elapsed", step="1h")
    assert elapsed["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    by_step = curves(vault, ["r3"], "train_loss", align="step", step="1h")
    assert by_step["x"].is_monotonic_increasing
    png = plot(vault, ["r3", "r4"], ["mfu", "train_loss"], tmp_path / "c.png", align="step")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = plot(vault, ["r3", "r4"], ["mfu"], tmp_path / "c.html")
    assert "data:image/png;base64," in page.read_text()
    with pytest.raises(InputError, match=r"\.png or \.html"):
        plot(vault, ["r3"], ["mfu"], tmp_path / "c.pdf")
    with pytest.raises(NotFoundError, match="no 'nope' data"):
        curves(vault, ["r3"], "nope")


def test_export_bytes_do_not_depend_on_how_it_is_chunked(vault, tmp_path):
    """Small fetches (each series cut into time slices) give the same file as big ones."""
    whole = export_snapshot(vault, "r3", tmp_path / "whole")
    sliced = export_snapshot(vault, "r3", tmp_path / "sliced", chunk_rows=1000)
    assert _sha(sliced.path) == _sha(whole.path)
    rollups = export_snapshot(vault, "r3", tmp_path / "whole-1m", tier="1m")
    sliced_rollups = export_snapshot(vault, "r3", tmp_path / "sliced-1m", tier="1m", chunk_rows=100)
    assert _sha(sliced_rollups.path) == _sha(rollups.path)
    with pytest.raises(InputError, match="chunk_rows must be at least 1"):
        export_snapshot(vault, "r3", tmp_path / "none", chunk_rows=0)


def test_snapshot_format_reads_without_loading_the_export_or_the_vault():
    """The format reads a snapshot without the export (nor the store's Vault) being loaded;
    ``archive.snapshot`` offers only the documented ``export_snapshot`` (README.md)."""
    import subprocess
    import sys

    from metricvault.archive import snapshot, snapshot_export

    assert snapshot.__all__ == ["export_snapshot"]
    assert snapshot.export_snapshot is snapshot_export.export_snapshot
    probe = (
        "import sys; import metricvault.archive.snapshot_format; "
        "print(sorted(m for m in ('metricvault.archive.snapshot_export', "
        "'metricvault.store.vault') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


def test_time_slices_cover_the_window_at_bucket_boundaries():
    from metricvault.archive.snapshot_export import _time_slices

    slices = _time_slices(1_000, 1_000_000, rows=10_000_000, align=60_000)
    assert slices[0][0] == 1_000 and slices[-1][1] == 1_000_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    assert all(lo % 60_000 == 0 for lo, _ in slices[1:])


def test_a_catalog_version_is_not_called_a_snapshot(tmp_path):
    """``Vault.catalog_version()`` is the vault's current catalog version (which files make it
    up); ``Vault.snapshot()``, its documented old name (docs/storage-format.md), answers the
    same. Experiment snapshot files keep the word."""
    with Vault.open_local(str(tmp_path / "v")) as v:
        empty = v.catalog_version()
        v.write([("gpu_util", {"gpu": "0"}, SPEC.start_ms, 1.0)])
        v.maintain(now_ms=SPEC.start_ms + HOUR)
        flushed = v.catalog_version()
        assert flushed.version > empty.version and flushed.files and not empty.files
        assert v.snapshot() == flushed  # the documented old name
