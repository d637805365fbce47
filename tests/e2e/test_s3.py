"""End-to-end: a vault on S3 (a real moto server over HTTP), from write to maintenance.

Every expected answer is computed here from the samples the test wrote (pandas/numpy), never
taken from the store, so a wrong rollup, a lost file or a duplicated flush shows up as a
mismatch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from metricvault import Vault
from metricvault.errors import ConfigError, NotFoundError, StorageError
from metricvault.store.catalog import DataFile, SeriesFile

from .conftest import S3Server, free_port

pytestmark = pytest.mark.e2e

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
PREFIX = "some/prefix"
AGGS = ("mean", "max", "count", "increase")
LABELS = ["gpu", "host"]


# ---------------------------------------------------------------- test data and oracles
def make_samples(start: int, end: int, every: int, seed: int = 7) -> pd.DataFrame:
    """Four series sampled every ``every`` ms in ``[start, end)``: integer, one-decimal and
    full-precision gauges, and a counter ``x_total`` that resets once (to 0) mid-range."""
    ts = np.arange(start, end, every, dtype=np.int64)
    i = (ts - T0) // every
    rng = np.random.default_rng(seed + int(start // every))
    increments = rng.integers(0, 10, len(ts)).astype(np.float64)
    counter = 1_000 + np.cumsum(increments)
    reset_at = T0 + 13 * HOUR + 7 * every  # day 1, 13:00:35 (at 5 s)
    after = ts >= reset_at
    if after.any() and (~after).any():
        counter[after] = np.cumsum(increments[after]) - increments[after][0]
    frames = [
        ("gpu_util", "0", (i * 7 % 101).astype(np.float64)),
        ("gpu_util", "1", np.round(50 + 40 * np.sin(i / 500.0), 1)),
        ("power_watts", "0", 300 + 100 * rng.random(len(ts))),
        ("x_total", None, counter),
    ]
    return pd.concat(
        [
            pd.DataFrame(
                {"metric": m, "host": "node01", "gpu": g, "timestamp": ts, "value": v},
            )
            for m, g, v in frames
        ],
        ignore_index=True,
    )


def to_arrow(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def with_increase_terms(df: pd.DataFrame) -> pd.DataFrame:
    """Per sample, its contribution to ``increase``: the rise from the previous sample of its
    series, or its whole value after a reset; 0 for the first sample; NaN for gauges."""
    df = df.sort_values(["metric", "gpu", "host", "timestamp"], na_position="first").copy()
    keys = [df["metric"], df["gpu"].fillna(""), df["host"]]
    prev = df.groupby(keys)["value"].shift(1)
    prev_ts = df.groupby(keys)["timestamp"].shift(1)
    rise = np.where(df["value"] >= prev, df["value"] - prev, df["value"])
    term = np.where(prev.isna() | (df["timestamp"] - prev_ts > HOUR), 0.0, rise)
    df["term"] = np.where(df["metric"].str.endswith("_total"), term, np.nan)
    return df


def expected_steps(df: pd.DataFrame, start: int, end: int, step: int) -> pd.DataFrame:
    """Per-series, per-bucket aggregates over samples in the step-aligned cover of
    ``[start, end)`` (the query's buckets are multiples of the step since the epoch)."""
    lo, hi = start // step * step, -(-end // step) * step
    part = with_increase_terms(df)
    part = part[(part["timestamp"] >= lo) & (part["timestamp"] < hi)].copy()
    part["bucket"] = part["timestamp"] // step * step
    part["gpu"] = part["gpu"].fillna("")
    grouped = part.groupby(["metric", "gpu", "host", "bucket"])
    out = grouped.agg(
        mean=("value", "mean"),
        max=("value", "max"),
        count=("value", "size"),
        increase=("term", lambda t: t.sum() if t.notna().any() else np.nan),
    ).reset_index()
    return out.rename(columns={"bucket": "ts"})


def normalise_answer(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["ts"] = out["timestamp"].map(lambda t: int(t.value // 1_000_000))
    out["gpu"] = out["gpu"].fillna("") if "gpu" in out else ""
    return out.drop(columns=["timestamp"]).sort_values(["metric", "gpu", "host", "ts"])


def assert_steps_equal(answer: pd.DataFrame, expected: pd.DataFrame) -> None:
    got = normalise_answer(answer).reset_index(drop=True)
    want = expected.sort_values(["metric", "gpu", "host", "ts"]).reset_index(drop=True)
    assert len(got) == len(want), f"{len(got)} buckets answered, {len(want)} expected"
    for col in ("metric", "gpu", "host", "ts", "count"):
        assert got[col].tolist() == want[col].tolist(), f"column {col} differs"
    for col in ("mean", "max", "increase"):
        np.testing.assert_allclose(
            got[col].astype(float), want[col].astype(float), rtol=1e-12, equal_nan=True
        )


def assert_raw_equal(answer: pd.DataFrame, df: pd.DataFrame, start: int, end: int) -> None:
    """Raw samples come back complete and bit-exact."""
    want = df[(df["timestamp"] >= start) & (df["timestamp"] < end)].copy()
    want["ts"] = want["timestamp"]
    want["gpu"] = want["gpu"].fillna("")
    want = want.sort_values(["metric", "gpu", "host", "ts"]).reset_index(drop=True)
    got = normalise_answer(answer).reset_index(drop=True)
    assert len(got) == len(want), f"{len(got)} samples answered, {len(want)} written"
    for col in ("metric", "gpu", "host", "ts"):
        assert got[col].tolist() == want[col].tolist(), f"column {col} differs"
    assert got["value"].to_numpy().tobytes() == want["value"].to_numpy().tobytes()


# ---------------------------------------------------------------- bucket helpers
def bucket_keys(server: S3Server, bucket: str) -> dict[str, int]:
    """Every object (key -> size) in the bucket, directory markers left out."""
    keys: dict[str, int] = {}
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    for page in pages:
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/"):
                keys[obj["Key"]] = obj["Size"]
    return keys


def parquet_keys(server: S3Server, bucket: str) -> set[str]:
    return {k for k in bucket_keys(server, bucket) if k.endswith(".parquet")}


def catalog_keys(server: S3Server, bucket: str) -> list[str]:
    return sorted(k for k in bucket_keys(server, bucket) if k.startswith(f"{PREFIX}/catalog/v"))


def referenced_keys(vault: Vault, bucket: str) -> set[str]:
    """Object keys of every data and series file the current snapshot references."""
    snap = vault.snapshot()
    paths = [f.path for f in snap.files] + [s.path for s in snap.series_files]
    return {p.removeprefix(f"{bucket}/") for p in paths}


def open_vault(server: S3Server, bucket: str, state: Path, **settings: Any) -> Vault:
    return Vault.open_local(
        f"s3://{bucket}/{PREFIX}", s3_endpoint=server.endpoint, state_dir=str(state), **settings
    )


# ---------------------------------------------------------------- a loaded vault, shared
@dataclass
class Loaded:
    bucket: str
    vault: Vault
    samples: pd.DataFrame
    report: dict[str, Any]


@pytest.fixture(scope="module")
def loaded(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """4 series x 2 days at 5 s (138 240 samples) written, flushed and maintained on S3."""
    bucket = f"mv-loaded-{os.getpid()}"
    s3_server.client().create_bucket(Bucket=bucket)
    state = tmp_path_factory.mktemp("loaded") / "state"
    vault = open_vault(s3_server, bucket, state)
    samples = make_samples(T0, T0 + 2 * DAY, 5 * SECOND)
    assert vault.write(to_arrow(samples)) == len(samples)
    report = vault.maintain(now_ms=T0 + 2 * DAY + HOUR)
    yield Loaded(bucket, vault, samples, report)
    vault.close()


def test_maintain_flushes_and_rolls_up_everything(loaded: Loaded) -> None:
    assert loaded.report["flushed_samples"] == len(loaded.samples)
    assert loaded.report["rollup_pending_hours"] == 0
    stats = loaded.vault.stats(now=T0 + 2 * DAY + HOUR)
    assert stats["series"] == 4
    assert stats["tiers"]["raw"]["rows"] == len(loaded.samples)
    assert stats["tiers"]["1m"]["rows"] == 4 * 2 * 24 * 60
    assert stats["tiers"]["1h"]["rows"] == 4 * 2 * 24
    assert stats["buffer"]["samples"] == 0


@pytest.mark.parametrize(
    ("start", "end"),
    [(T0, T0 + 2 * DAY), (T0 + 12 * HOUR + 3 * SECOND, T0 + 14 * HOUR + 17 * SECOND)],
    ids=["all", "around-reset"],
)
def test_raw_query_returns_every_sample_bit_exact(loaded: Loaded, start: int, end: int) -> None:
    answer = loaded.vault.query('{host="node01"}', start, end)
    assert_raw_equal(answer, loaded.samples, start, end)


@pytest.mark.parametrize(
    ("selector", "start", "end", "step"),
    [
        ('{host="node01"}', T0, T0 + 2 * DAY, "1h"),
        ("x_total", T0 + 10 * HOUR, T0 + 30 * HOUR, "1h"),
        ('gpu_util{gpu="1"}', T0 + 23 * HOUR, T0 + 25 * HOUR, "1m"),
        ('{host="node01"}', T0 + 5 * HOUR, T0 + 41 * HOUR, "3h"),
    ],
    ids=["2d-1h", "counter-reset-1h", "midnight-1m", "3h"],
)
def test_step_query_matches_aggregates_computed_from_samples(
    loaded: Loaded, selector: str, start: int, end: int, step: str
) -> None:
    answer = loaded.vault.query(selector, start, end, step=step, aggs=AGGS)
    step_ms = {"1m": MINUTE, "1h": HOUR, "3h": 3 * HOUR}[step]
    metric = selector.split("{")[0]
    samples = loaded.samples
    if metric:
        samples = samples[samples["metric"] == metric]
    if 'gpu="1"' in selector:
        samples = samples[samples["gpu"] == "1"]
    assert_steps_equal(answer, expected_steps(samples, start, end, step_ms))


def test_counter_increase_over_the_reset_counts_the_new_value(loaded: Loaded) -> None:
    answer = loaded.vault.query("x_total", T0, T0 + 2 * DAY, step="all", aggs=("increase",))
    counter = with_increase_terms(loaded.samples[loaded.samples["metric"] == "x_total"])
    values = counter["value"].to_numpy()
    assert (np.diff(values) < 0).sum() == 1, "the data should hold exactly one reset"
    drop = int(np.argmax(np.diff(values) < 0)) + 1
    corrected = (values[drop - 1] - values[0]) + values[-1]  # rise before + value after
    assert corrected > values[-1] - values[0]
    assert answer["increase"].tolist() == [pytest.approx(corrected, rel=1e-12)]
    assert corrected == pytest.approx(counter["term"].sum(), rel=1e-12)


def test_objects_are_in_the_bucket(s3_server: S3Server, loaded: Loaded) -> None:
    keys = bucket_keys(s3_server, loaded.bucket)
    assert all(k.startswith(f"{PREFIX}/") for k in keys), sorted(keys)[:5]
    rel = {k.removeprefix(f"{PREFIX}/"): size for k, size in keys.items()}
    assert any(k.startswith("catalog/v") and k.endswith(".json") for k in rel)
    for tier in ("raw", "1m", "1h"):
        for day in ("2026-01-01", "2026-01-02"):
            where = f"data/{tier}/day={day}/"
            assert any(k.startswith(where) and k.endswith(".parquet") for k in rel), where
    assert any(k.startswith("series/") and k.endswith(".parquet") for k in rel)
    # Every file the catalog references is there with the size it recorded ...
    snap = loaded.vault.snapshot()
    files: list[DataFile | SeriesFile] = [*snap.files, *snap.series_files]
    for f in files:
        key = f.path.removeprefix(f"{loaded.bucket}/")
        assert keys.get(key) == f.bytes, f"{key}: catalog says {f.bytes} bytes"
    # ... and the ingest buffer stays local, never in the bucket.
    assert not any("sqlite" in k or "lock" in k for k in keys)
    assert (loaded.vault.location.state_dir / "buffer.sqlite").exists()


def test_sql_runs_over_files_on_s3(loaded: Loaded) -> None:
    n = len(loaded.samples)
    assert loaded.vault.sql("select count(*) from raw").iloc[0, 0] == n
    rollup = loaded.vault.sql("select sum(count) as n from rollup_1h")
    assert rollup["n"].iloc[0] == n
    per_metric = loaded.vault.sql(
        "select s.metric, count(*) as n, max(r.value) as top from raw r "
        "join series s using (series_id) group by 1 order by 1"
    )
    want = loaded.samples.groupby("metric")["value"].agg(["size", "max"])
    assert per_metric["metric"].tolist() == want.index.tolist()
    assert per_metric["n"].tolist() == want["size"].tolist()
    assert per_metric["top"].tolist() == want["max"].tolist()


def test_second_reader_with_its_own_state_dir_sees_the_same(
    s3_server: S3Server, loaded: Loaded, tmp_path: Path
) -> None:
    other = open_vault(s3_server, loaded.bucket, tmp_path / "reader-state")
    try:
        assert other.location.state_dir != loaded.vault.location.state_dir
        assert other.snapshot() == loaded.vault.snapshot()
        pd.testing.assert_frame_equal(other.series(), loaded.vault.series())
        for step in (None, "1h", "1m"):
            kwargs: dict[str, Any] = {} if step is None else {"step": step, "aggs": AGGS}
            mine = loaded.vault.query('{host="node01"}', T0, T0 + 2 * DAY, **kwargs)
            theirs = other.query('{host="node01"}', T0, T0 + 2 * DAY, **kwargs)
            pd.testing.assert_frame_equal(theirs, mine)
        assert other.sql("select count(*) from raw").iloc[0, 0] == len(loaded.samples)
    finally:
        other.close()


def test_reader_picks_up_a_writers_later_commit(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    writer = open_vault(s3_server, s3_bucket, tmp_path / "writer")
    reader = open_vault(s3_server, s3_bucket, tmp_path / "reader")
    try:
        first = make_samples(T0, T0 + HOUR, 5 * SECOND)
        writer.write(to_arrow(first))
        writer.flush()
        reader.refresh()
        assert_raw_equal(reader.query('{host="node01"}', T0, T0 + DAY), first, T0, T0 + DAY)
        later = make_samples(T0 + HOUR, T0 + 2 * HOUR, 5 * SECOND)
        later["host"] = "node02"  # new series: the reader learns them on refresh()
        writer.write(to_arrow(later))
        writer.flush()
        reader.refresh()
        answer = reader.query('{host="node02"}', T0, T0 + DAY)
        assert_raw_equal(answer, later, T0, T0 + DAY)
    finally:
        reader.close()
        writer.close()


def test_vault_at_the_bucket_root(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    samples = make_samples(T0, T0 + HOUR, 5 * SECOND)
    uri = f"s3://{s3_bucket}"
    with Vault.open_local(uri, s3_endpoint=s3_server.endpoint, state_dir=str(tmp_path)) as vault:
        vault.write(to_arrow(samples))
        vault.flush()
        assert_raw_equal(vault.query('{host="node01"}', T0, T0 + DAY), samples, T0, T0 + DAY)
    keys = bucket_keys(s3_server, s3_bucket)
    assert {k.split("/")[0] for k in keys} == {"catalog", "data", "series"}


# ---------------------------------------------------------------- durability
CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    import pyarrow as pa
    from metricvault import Vault

    uri, endpoint, state, data, crash = sys.argv[1:]
    vault = Vault.open_local(uri, s3_endpoint=endpoint, state_dir=state)
    table = pa.ipc.open_file(data).read_all()
    acknowledged = vault.write(table)
    print(acknowledged, flush=True)
    real_commit = vault.catalog.commit  # the flush's commit is the one adding files
    if crash == "before_commit":  # data files are on S3, the catalog never hears of them
        vault.catalog.commit = lambda change: os._exit(17) if change.add else real_commit(change)
    elif crash == "after_commit":  # committed, but the buffer still holds the batch
        def commit_then_die(change):
            snapshot = real_commit(change)
            if change.add:
                os._exit(17)
            return snapshot
        vault.catalog.commit = commit_then_die
    if crash != "after_write":
        vault.flush()
    os._exit(17)  # no close(), no flush, no atexit: as abrupt as kill -9 for our purposes
    """
)


@pytest.mark.parametrize("crash", ["after_write", "before_commit", "after_commit"])
def test_acknowledged_samples_survive_a_crash(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, crash: str
) -> None:
    samples = make_samples(T0, T0 + 6 * HOUR, 5 * SECOND)
    data = tmp_path / "batch.arrow"
    table = to_arrow(samples)
    with pa.ipc.new_file(data, table.schema) as sink:
        sink.write_table(table)
    state = tmp_path / "state"
    args = [f"s3://{s3_bucket}/{PREFIX}", s3_server.endpoint, str(state), str(data), crash]
    run = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert run.returncode == 17, run.stderr[-3000:]
    assert int(run.stdout.split()[0]) == len(samples)

    keys = bucket_keys(s3_server, s3_bucket)
    has_catalog = any("/catalog/" in k for k in keys)
    has_data = any("/data/raw/" in k for k in keys)
    # before_commit: the vault's first catalog version (which only holds its id) is committed
    # before any file is written, so the crashed upload is named with that id (issue 10)
    assert (has_catalog, has_data) == {
        "after_write": (False, False),
        "before_commit": (True, True),
        "after_commit": (True, True),
    }[crash]

    vault = open_vault(s3_server, s3_bucket, state, orphan_grace="1ms")
    try:
        assert vault.flush() == (0 if crash == "after_commit" else len(samples))
        answer = vault.query('{host="node01"}', T0, T0 + DAY)
        assert_raw_equal(answer, samples, T0, T0 + DAY)
        vault.maintain(now_ms=T0 + DAY)
        assert vault.sql("select count(*) from raw").iloc[0, 0] == len(samples)
        # The crashed flush's unreferenced upload is an orphan, removed by maintain.
        assert parquet_keys(s3_server, s3_bucket) == referenced_keys(vault, s3_bucket)
    finally:
        vault.close()


def test_vault_copied_to_another_prefix_opens_and_answers(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    samples = make_samples(T0, T0 + DAY, 30 * SECOND)
    with open_vault(s3_server, s3_bucket, tmp_path / "original") as vault:
        vault.write(to_arrow(samples.iloc[: len(samples) // 2]))
        vault.flush()
        vault.write(to_arrow(samples.iloc[len(samples) // 2 :]))
        vault.maintain(now_ms=T0 + 2 * DAY)  # compaction and rollups: files were replaced
        want = vault.query('{host="node01"}', T0, T0 + DAY, step="1h", aggs=AGGS)
    client = s3_server.client()
    copy_prefix = "backups/2026/vault"
    for key in bucket_keys(s3_server, s3_bucket):
        target = copy_prefix + key.removeprefix(PREFIX)
        client.copy_object(Bucket=s3_bucket, Key=target, CopySource=f"{s3_bucket}/{key}")
        client.delete_object(Bucket=s3_bucket, Key=key)  # the original prefix is gone
    copy = Vault.open_local(
        f"s3://{s3_bucket}/{copy_prefix}",
        s3_endpoint=s3_server.endpoint,
        state_dir=str(tmp_path / "copy-state"),
        orphan_grace="1ms",
        keep_snapshots=1,
    )
    try:
        answer = copy.query('{host="node01"}', T0, T0 + DAY, step="1h", aggs=AGGS)
        pd.testing.assert_frame_equal(answer, want)
        assert_raw_equal(copy.query('{host="node01"}', T0, T0 + DAY), samples, T0, T0 + DAY)
        time.sleep(0.01)
        copy.maintain(now_ms=T0 + 2 * DAY)
        keys = parquet_keys(s3_server, s3_bucket)
        assert all(k.startswith(copy_prefix + "/") for k in keys)
        assert referenced_keys(copy, s3_bucket) == keys, "maintain on the copy lost files"
        assert_raw_equal(copy.query('{host="node01"}', T0, T0 + DAY), samples, T0, T0 + DAY)
    finally:
        copy.close()


# ---------------------------------------------------------------- errors
def test_missing_bucket_is_not_found(s3_server: S3Server, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(NotFoundError) as info:
        open_vault(s3_server, "no-such-bucket-here", state)
    message = str(info.value)
    assert "'no-such-bucket-here'" in message
    assert "does not exist" in message
    assert s3_server.endpoint in message
    assert info.value.status == 404
    assert not state.exists(), "a failed open left local state behind"


@pytest.mark.parametrize("uri", ["s3://", "s3:///only/a/prefix"])
def test_uri_without_bucket_is_a_config_error(
    s3_server: S3Server, tmp_path: Path, uri: str
) -> None:
    with pytest.raises(ConfigError, match="names no bucket"):
        Vault.open_local(uri, s3_endpoint=s3_server.endpoint, state_dir=str(tmp_path / "state"))


def test_endpoint_without_scheme_is_a_config_error(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="s3_endpoint"):
        Vault.open_local(
            f"s3://{s3_bucket}/{PREFIX}",
            s3_endpoint=f"localhost:{s3_server.port}",
            state_dir=str(tmp_path / "state"),
        )


def test_unreachable_endpoint_is_a_storage_error(s3_bucket: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StorageError, match=f"cannot reach S3 bucket '{s3_bucket}'") as info:
        Vault.open_local(f"s3://{s3_bucket}/{PREFIX}", s3_endpoint=dead, state_dir=str(tmp_path))
    assert info.value.status == 503


# ---------------------------------------------------------------- compaction and expiry
def test_compaction_and_expiry_remove_old_files_only_after_the_grace(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    every = 10 * SECOND
    day1 = make_samples(T0, T0 + DAY, every)
    morning = day1["timestamp"] < T0 + 12 * HOUR
    first, second = day1[morning], day1[~morning]
    late = make_samples(T0 + DAY, T0 + DAY + 6 * HOUR, every, seed=8)
    late = late[late["metric"] != "x_total"]  # keep the counter's history simple
    everything = pd.concat([day1, late], ignore_index=True)

    def check(vault: Vault, df: pd.DataFrame, end: int) -> None:
        answer = vault.query('{host="node01"}', T0, end, step="1h", aggs=AGGS)
        assert_steps_equal(answer, expected_steps(df, T0, end, HOUR))
        assert_raw_equal(vault.query('{host="node01"}', T0, end), df, T0, end)

    # Phase A: two flushes make two raw files for day 1; maintain merges them.
    vault = open_vault(s3_server, s3_bucket, state, keep_snapshots=1, orphan_grace="1h")
    vault.write(to_arrow(first))
    vault.flush()
    vault.write(to_arrow(second))
    vault.flush()
    raw_before = {k for k in parquet_keys(s3_server, s3_bucket) if "/data/raw/day=2026-01-01/" in k}
    assert len(raw_before) == 2
    report = vault.maintain(now_ms=T0 + DAY + HOUR)
    assert report["compacted_partitions"] == 1
    assert len(catalog_keys(s3_server, s3_bucket)) == 1  # keep_snapshots=1
    referenced = referenced_keys(vault, s3_bucket)
    assert not raw_before & referenced, "compaction kept the small files in the catalog"
    assert raw_before <= parquet_keys(s3_server, s3_bucket), "deleted before orphan_grace"
    check(vault, day1, T0 + DAY)

    # Phase B: duplicate delivery of day-1 samples plus new data on day 2, flushed: the
    # day-1 partition has two files again, and queries stitch rollups with fresh raw data.
    vault.write(to_arrow(first.iloc[:500]))
    vault.write(to_arrow(late))
    vault.flush()
    assert vault.snapshot().dirty_hours, "new data should leave hours to roll up"
    check(vault, everything, T0 + 2 * DAY)
    orphans_a = parquet_keys(s3_server, s3_bucket) - referenced_keys(vault, s3_bucket)
    report = vault.maintain(now_ms=T0 + DAY + 7 * HOUR)
    assert report["compacted_partitions"] == 1
    assert report["rollup_pending_hours"] == 0
    assert report["expired"]["files"] == 0
    assert len(catalog_keys(s3_server, s3_bucket)) == 1
    orphans = parquet_keys(s3_server, s3_bucket) - referenced_keys(vault, s3_bucket)
    assert orphans_a < orphans, "rollup and compaction replace files; the old ones linger"
    check(vault, everything, T0 + 2 * DAY)
    vault.close()

    # Phase C: once the grace has passed, maintain deletes every unreferenced file.
    time.sleep(1.2)
    vault = open_vault(s3_server, s3_bucket, state, keep_snapshots=1, orphan_grace="1s")
    try:
        report = vault.maintain(now_ms=T0 + DAY + 7 * HOUR)
        assert report["expired"]["files"] == len(orphans)
        assert parquet_keys(s3_server, s3_bucket) == referenced_keys(vault, s3_bucket)
        check(vault, everything, T0 + 2 * DAY)
        assert vault.sql("select count(*) from raw").iloc[0, 0] == len(everything)
    finally:
        vault.close()
    reader = open_vault(s3_server, s3_bucket, tmp_path / "fresh-reader")
    try:
        check(reader, everything, T0 + 2 * DAY)
    finally:
        reader.close()


def test_raw_retention_on_s3_keeps_answers_from_rollups(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    samples = make_samples(T0, T0 + 2 * DAY, MINUTE)
    vault = open_vault(
        s3_server,
        s3_bucket,
        tmp_path / "state",
        retention_raw="1d",
        keep_snapshots=1,
        orphan_grace="1ms",
    )
    try:
        vault.write(to_arrow(samples))
        report = vault.maintain(now_ms=T0 + 2 * DAY + HOUR)
        assert report["retention"]["raw"] == 1
        snap = vault.snapshot()
        assert snap.raw_horizon_ms == T0 + DAY
        assert {f.day for f in snap.tier_files("raw")} == {"2026-01-02"}
        keys = parquet_keys(s3_server, s3_bucket)
        assert not any("/data/raw/day=2026-01-01/" in k for k in keys)
        assert any("/data/raw/day=2026-01-02/" in k for k in keys)
        assert vault.query('{host="node01"}', T0, T0 + DAY).empty
        assert_raw_equal(
            vault.query('{host="node01"}', T0 + DAY, T0 + 2 * DAY), samples, T0 + DAY, T0 + 2 * DAY
        )
        for step, step_ms in (("1h", HOUR), ("1m", MINUTE)):
            answer = vault.query('{host="node01"}', T0, T0 + 2 * DAY, step=step, aggs=AGGS)
            assert_steps_equal(answer, expected_steps(samples, T0, T0 + 2 * DAY, step_ms))
    finally:
        vault.close()


# ---------------------------------------------------------------- two writers, one vault
def host_samples(host: str, start: int, end: int, every: int = 30 * SECOND) -> pd.DataFrame:
    df = make_samples(start, end, every)
    df["host"] = host
    return df


def raw_count(server: S3Server, bucket: str, state: Path) -> int:
    """Samples in the raw tier as a fresh reader (own state dir) sees them."""
    with open_vault(server, bucket, state) as reader:
        return int(reader.sql("select count(*) from raw").iloc[0, 0])


def first_catalog_write_runs(location: Any, monkeypatch: pytest.MonkeyPatch, other: Any) -> None:
    """Run ``other()`` just before ``location``'s next catalog version is written: another
    writer commits the version number this one read as free, deterministically."""
    real = location.write_bytes_exclusive
    raced: list[str] = []

    def other_first(path: str, data: bytes) -> bool:
        if not raced and "/catalog/" in path:
            raced.append(path)
            other()
        return bool(real(path, data))

    monkeypatch.setattr(location, "write_bytes_exclusive", other_first)


def test_a_flush_that_loses_the_commit_race_commits_on_top_of_the_winner(
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = host_samples("writer-a", T0, T0 + HOUR)
    mine = host_samples("writer-a", T0 + HOUR, T0 + 2 * HOUR)
    theirs = host_samples("writer-b", T0, T0 + 2 * HOUR)
    with open_vault(s3_server, s3_bucket, tmp_path / "a") as a:
        a.write(to_arrow(first))
        a.flush()
        with open_vault(s3_server, s3_bucket, tmp_path / "b") as b:
            b.write(to_arrow(theirs))
            a.write(to_arrow(mine))
            version = a.snapshot().version
            first_catalog_write_runs(a.location, monkeypatch, b.flush)
            with caplog.at_level("WARNING", logger="metricvault"):
                assert a.flush() == len(mine)
            assert "committed by another writer first" in caplog.text
            snap = a.snapshot()
            # b won version+1 and kept it; a's flush became version+2, above it
            assert snap.version == version + 2
            won = b.catalog._load(version + 1)
            assert won is not None and set(won.buffers) == {a.buffer.buffer_id, b.buffer.buffer_id}
            assert won.buffers[a.buffer.buffer_id] < snap.buffers[a.buffer.buffer_id]
            ids = [f.file_id for f in snap.files]
            assert len(set(ids)) == len(ids), "the rebased flush reused the winner's file ids"
            assert a.buffered()[0] == 0 and b.buffered()[0] == 0
    total = len(first) + len(mine) + len(theirs)
    assert raw_count(s3_server, s3_bucket, tmp_path / "reader") == total
    with open_vault(s3_server, s3_bucket, tmp_path / "reader") as reader:
        both = pd.concat([first, mine], ignore_index=True)
        assert_raw_equal(reader.query('{host="writer-a"}', T0, T0 + DAY), both, T0, T0 + DAY)
        assert_raw_equal(reader.query('{host="writer-b"}', T0, T0 + DAY), theirs, T0, T0 + DAY)


def test_maintenance_whose_inputs_another_writer_replaced_is_refused_and_nothing_is_doubled(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metricvault.errors import CommitConflictError
    from metricvault.store.maintenance import compact

    now = T0 + 3 * DAY  # day 1 is closed: its files are merged whole
    morning, evening = (
        host_samples("w", T0, T0 + 12 * HOUR),
        host_samples("w", T0 + 12 * HOUR, T0 + DAY),
    )
    # a's claim on the day lapses at once: a stands for a maintainer slower than its lease,
    # so b takes the day over; the catalog, not the claim, must refuse a's late commit
    with open_vault(s3_server, s3_bucket, tmp_path / "a", maintain_claim_ttl="1ms") as a:
        for part in (morning, evening):
            a.write(to_arrow(part))
            a.flush()
        with open_vault(s3_server, s3_bucket, tmp_path / "b") as b:
            first_catalog_write_runs(a.location, monkeypatch, lambda: compact(b, now))
            with pytest.raises(CommitConflictError, match="another writer replaced 2 file"):
                compact(a, now)
            assert len(b.snapshot().tier_files("raw")) == 1  # b's merge stands, alone
    assert raw_count(s3_server, s3_bucket, tmp_path / "reader") == len(morning) + len(evening)


def test_two_writers_and_a_maintainer_on_one_vault_keep_every_acknowledged_sample(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    import threading

    from metricvault.errors import CommitConflictError

    batches, per_batch = 12, 20 * MINUTE
    writers = [open_vault(s3_server, s3_bucket, tmp_path / f"w{i}") for i in range(2)]
    maintainer = open_vault(s3_server, s3_bucket, tmp_path / "maintainer")
    acknowledged = [0, 0]
    done = threading.Event()
    conflicts: list[str] = []
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for n in range(batches):
                start = T0 + n * per_batch
                batch = host_samples(f"writer-{i}", start, start + per_batch)
                acknowledged[i] += writers[i].write(to_arrow(batch))
                writers[i].flush()
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    def maintain() -> None:
        while not done.is_set():
            try:
                maintainer.maintain(now_ms=T0 + DAY)
            except CommitConflictError as exc:  # the loop's next round redoes the work
                conflicts.append(str(exc))
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    upkeep = threading.Thread(target=maintain)
    try:
        for t in [*threads, upkeep]:
            t.start()
        for t in threads:
            t.join(timeout=300)
        done.set()
        upkeep.join(timeout=300)
        assert not errors, errors
        for _ in range(5):  # a last round, as the maintain loop would run it
            try:
                maintainer.maintain(now_ms=T0 + DAY)
                break
            except CommitConflictError:
                continue
    finally:
        done.set()
        for v in [*writers, maintainer]:
            v.close()
    expected = batches * len(host_samples("x", T0, T0 + per_batch))
    assert acknowledged == [expected, expected]
    with open_vault(s3_server, s3_bucket, tmp_path / "reader") as reader:
        per_host = reader.sql(
            "select s.labels, count(*) as n from raw r join series s using (series_id) "
            "group by 1 order by 1"
        )
        counts = {h: 0 for h in ("writer-0", "writer-1")}
        for labels, n in zip(per_host["labels"], per_host["n"], strict=True):
            host = "writer-0" if "writer-0" in labels else "writer-1"
            counts[host] += int(n)
        assert counts == {"writer-0": expected, "writer-1": expected}
