"""A vault survives being moved, copied, crashed and maintained under a reader.

Everything here is real: directories moved with ``mv`` and copied with ``cp -a``, a symlink, a
writer process killed with SIGKILL between writing a data file and committing it, a catalog
file truncated on disk. The only stand-in is ``os.fsync`` wrapped by a recorder, because the
order of those system calls is exactly what is being checked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from metricvault.store.catalog import DataFile, SeriesFile
from metricvault.store.query import ContextReader
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000
DAY = 24 * HOUR
STEP = 10_000
CHILD_TIMEOUT_S = 60


def rows(start: int, n: int, seed: int = 0) -> list[tuple[str, dict[str, str], int, float]]:
    return [
        (
            "gpu_util",
            {"gpu": str(g), "Hostname": "node01"},
            start + i * STEP,
            float((i * 7 + g + seed) % 101),
        )
        for g in range(3)
        for i in range(n)
    ]


def build_vault(path: Path, **settings: Any) -> None:
    """Two flushes into one day, then maintenance: compaction and rollups replace files, so
    the vault has a history (replaced files, several catalog versions)."""
    with Vault.open_local(str(path), **settings) as vault:
        vault.write(rows(T0, 500))
        vault.flush()
        vault.write(rows(T0 + 500 * STEP, 500, seed=3))
        vault.flush()
        vault.maintain(now_ms=T0 + 3 * DAY)
        vault.write(rows(T0 + 2 * DAY, 200, seed=5))
        vault.flush()


def answers(vault: Vault) -> dict[str, pd.DataFrame]:
    return {
        "raw": vault.query("gpu_util", T0, T0 + 3 * DAY),
        "1h": vault.query("gpu_util", T0, T0 + 3 * DAY, step="1h", aggs=("mean", "max", "count")),
    }


def assert_same_answers(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    for key in want:
        pd.testing.assert_frame_equal(got[key], want[key], obj=key)


def parquet_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if p.is_file()}


def referenced(vault: Vault) -> set[Path]:
    snap = vault.snapshot()
    files: list[DataFile | SeriesFile] = [*snap.files, *snap.series_files]
    return {Path(f.path) for f in files}


def catalog_json(path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_bytes()) for p in sorted((path / "catalog").glob("v*.json"))]


# ---------------------------------------------------------------- relative paths
def test_vault_answers_after_mv(tmp_path: Path) -> None:
    before = tmp_path / "vault"
    build_vault(before)
    with Vault.open_local(str(before)) as vault:
        want, stats = answers(vault), vault.stats(now=T0 + 3 * DAY)
    after = tmp_path / "moved" / "vault"
    after.parent.mkdir()
    subprocess.run(["mv", str(before), str(after)], check=True)
    with Vault.open_local(str(after), create=False) as vault:
        assert vault.stats(now=T0 + 3 * DAY)["tiers"] == stats["tiers"]
        assert_same_answers(answers(vault), want)
        assert vault.sql("select count(*) from raw").iloc[0, 0] == 3 * 1200
    for body in catalog_json(after):
        for f in [*body["files"], *body["series_files"]]:
            assert not f["path"].startswith("/"), f"absolute path in the catalog: {f['path']}"
            assert re.fullmatch(
                r"(data/(raw|1m|1h)/day=[\d-]+|series)/part-[^/]+\.parquet", f["path"]
            )


def test_maintain_on_a_cp_a_copy_deletes_nothing_referenced(tmp_path: Path) -> None:
    original = tmp_path / "vault"
    build_vault(original)
    with Vault.open_local(str(original)) as vault:
        want = answers(vault)
    original_files = {p.relative_to(original): p.stat().st_size for p in parquet_files(original)}
    copy = tmp_path / "backup"
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    # every file in the copy is older than the grace: only "is it ours and replaced" protects it
    with Vault.open_local(str(copy), orphan_grace="1ms", keep_snapshots=1) as vault:
        time.sleep(0.01)
        vault.maintain(now_ms=T0 + 3 * DAY)
        missing = [p for p in referenced(vault) if not p.exists()]
        assert not missing, f"maintain on the copy deleted referenced files: {missing}"
        assert all(p.is_relative_to(copy) for p in referenced(vault))
        assert_same_answers(answers(vault), want)
    original_now = {p.relative_to(original): p.stat().st_size for p in parquet_files(original)}
    assert original_now == original_files, "maintaining the copy touched the original"


def test_maintain_on_a_copy_without_its_catalog_deletes_nothing(tmp_path: Path) -> None:
    original = tmp_path / "vault"
    build_vault(original)
    copy = tmp_path / "partial-copy"  # an rsync that stopped before catalog/ arrived
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    shutil.rmtree(copy / "catalog")
    files = parquet_files(copy)
    with Vault.open_local(str(copy), orphan_grace="1ms", keep_snapshots=1) as vault:
        time.sleep(0.01)
        report = vault.maintain(now_ms=T0 + 3 * DAY)
    assert parquet_files(copy) == files, "maintain deleted files it could not prove are garbage"
    assert report["expired"] == {"snapshots": 0, "files": 0, "unproven": len(files)}


def test_vault_opens_through_a_symlink_after_moving_disks(tmp_path: Path) -> None:
    first_disk = tmp_path / "disk1" / "vault"
    build_vault(first_disk)
    with Vault.open_local(str(first_disk)) as vault:
        want = answers(vault)
    second_disk = tmp_path / "disk2" / "vault"
    second_disk.parent.mkdir()
    subprocess.run(["cp", "-a", str(first_disk), str(second_disk)], check=True)
    shutil.rmtree(first_disk)
    link = tmp_path / "metrics"
    link.symlink_to(second_disk)
    with Vault.open_local(str(link), create=False) as vault:
        assert_same_answers(answers(vault), want)
        vault.write(rows(T0 + DAY, 10))
        vault.maintain(now_ms=T0 + 3 * DAY)
        assert vault.query("gpu_util", T0 + DAY, T0 + DAY + HOUR).shape[0] == 30


LEGACY_KEYS = (
    "version",
    "committed_ms",
    "next_file_id",
    "files",
    "series_files",
    "buffers",
    "dirty_hours",
    "raw_horizon_ms",
    "metric_kinds",
)


def make_legacy(vault_dir: Path, old_root: str) -> None:
    """Rewrite every catalog version as metricvault 0.x wrote it: format 1, absolute paths
    under the directory the vault had then (which no longer exists)."""
    for path in sorted((vault_dir / "catalog").glob("v*.json")):
        body = json.loads(path.read_bytes())
        legacy = {k: body[k] for k in LEGACY_KEYS}
        for f in [*legacy["files"], *legacy["series_files"]]:
            tail = re.search(r"((data|series)/.*\.parquet)$", f["path"])
            assert tail is not None
            f["path"] = f"{old_root}/{tail.group(1)}"
        legacy["format"] = 1
        path.write_bytes(json.dumps(legacy, separators=(",", ":")).encode())


def test_legacy_absolute_catalog_is_migrated_on_open(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    build_vault(vault_dir)
    with Vault.open_local(str(vault_dir)) as vault:
        want = answers(vault)
        before_versions = [s["version"] for s in catalog_json(vault_dir)]
    make_legacy(vault_dir, "/mnt/old-disk/metrics")
    history = {
        vault_dir / f["path"].removeprefix("/mnt/old-disk/metrics/")
        for body in catalog_json(vault_dir)
        for f in [*body["files"], *body["series_files"]]
    }
    # a file no catalog names, as an older metricvault named it: nothing proves it is garbage
    stray = vault_dir / "data" / "raw" / "day=2026-01-01" / "part-0000000099-0123456789ab.parquet"
    shutil.copy(next(iter(history)), stray)
    on_disk = parquet_files(vault_dir)
    with Vault.open_local(
        str(vault_dir), create=False, orphan_grace="1ms", keep_snapshots=1
    ) as vault:
        assert_same_answers(answers(vault), want)
        newest = catalog_json(vault_dir)[-1]
        assert newest["version"] == before_versions[-1] + 1, "migration commits a new version"
        assert newest["format"] >= 2
        assert all(not f["path"].startswith("/") for f in newest["files"])
        time.sleep(0.01)
        report = vault.maintain(now_ms=T0 + 3 * DAY)
        assert all(p.exists() for p in referenced(vault))
        assert_same_answers(answers(vault), want)
        # only files the legacy snapshots named (the vault's own history) were deleted
        deleted = on_disk - parquet_files(vault_dir)
        assert deleted and deleted <= history
        assert stray.exists() and report["expired"]["unproven"] == 1


# ---------------------------------------------------------------- fsync before commit
def test_data_and_series_files_are_fsynced_before_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_link(src, dst, *args, **kwargs)
        events.append(("link", str(dst)))

    vault_dir = (tmp_path / "vault").resolve()
    with Vault.open_local(str(vault_dir)) as vault:
        vault.write(rows(T0, 100) + rows(T0 + DAY, 100))  # two days: two data files
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "link", link)
        vault.flush()
        monkeypatch.undo()
        snap = vault.snapshot()
    commit_path = str(vault_dir / "catalog" / f"v{snap.version:012d}.json")
    commit_at = events.index(("link", commit_path))
    written = [f.path for f in snap.files] + [s.path for s in snap.series_files]
    assert len(written) == 3
    for path in written:
        synced = [i for i, e in enumerate(events) if e == ("fsync", path)]
        assert synced and synced[0] < commit_at, f"{path} not fsynced before the commit"
        parent = str(Path(path).parent)
        dir_synced = [i for i, e in enumerate(events) if e == ("fsync", parent) and i > synced[0]]
        assert dir_synced and dir_synced[0] < commit_at, f"{parent} not fsynced before the commit"
        # a day directory made by this flush is itself an entry in its parent directory
        grand = [i for i, e in enumerate(events) if e == ("fsync", str(Path(parent).parent))]
        assert grand and grand[0] < commit_at, f"{Path(parent).parent} not fsynced before commit"


PAUSING_WRITER = textwrap.dedent(
    """
    import sys, time
    from metricvault.store.catalog import Catalog
    from metricvault.store.vault import Vault

    path, n, t0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    vault = Vault.open_local(path, flush_max_samples=10**9)
    rows = [("load", {"node": str(s)}, t0 + i * 10_000, float(i))
            for s in range(4) for i in range(n)]
    print("acked", vault.write(rows), flush=True)
    real_commit = Catalog.commit

    def commit(self, change):
        if change.add:  # the flush's data files are written: wait here to be killed
            print("written", flush=True)
            time.sleep(600)
        return real_commit(self, change)

    Catalog.commit = commit
    vault.flush()
    """
)


def test_kill_9_between_file_write_and_commit_loses_nothing(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    n = 900
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSING_WRITER, str(vault_dir), str(n), str(T0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["acked", str(4 * n)]
        assert child.stdout.readline().strip() == "written"
        written = parquet_files(vault_dir / "data")
        assert len(written) == 1 and next(iter(written)).stat().st_size > 0
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=CHILD_TIMEOUT_S) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with Vault.open_local(str(vault_dir), create=False, orphan_grace="1ms") as vault:
        assert vault.buffer.depth()[0] == 4 * n, "acknowledged samples left the buffer"
        assert vault.query("load", T0, T0 + DAY).shape[0] == 4 * n
        time.sleep(0.01)
        report = vault.maintain(now_ms=T0 + 3 * DAY)
        assert vault.query("load", T0, T0 + DAY).shape[0] == 4 * n
        assert vault.stats()["tiers"]["raw"]["rows"] == 4 * n
        # the crashed flush's data and series files carry this vault's identity: provably
        # orphans of ours, deleted; everything the catalog names stays
        assert report["expired"]["files"] == 2
        assert parquet_files(vault_dir) == referenced(vault)


# ---------------------------------------------------------------- grace from replacement
def test_reader_keeps_its_files_across_two_maintenance_rounds(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    two_hours_ago = time.time() - 2 * 3600
    with Vault.open_local(str(vault_dir), keep_snapshots=1, orphan_grace="1h") as vault:
        vault.write(rows(T0, 300))
        vault.flush()
        vault.write(rows(T0 + 300 * STEP, 300, seed=1))
        vault.flush()
        for p in parquet_files(vault_dir):  # written long ago: a long export holds them
            os.utime(p, (two_hours_ago, two_hours_ago))
        reader = vault.sample_reader()
        assert isinstance(reader, ContextReader)  # the embedded store's reader: it holds files
        series_ids = sorted(info.series_id for info in vault.index.all())
        want = reader.raw_samples(series_ids, T0, T0 + DAY)
        held = {Path(f.path) for f in reader.ctx.snapshot.files}
        first = vault.maintain(now_ms=T0 + 3 * DAY)
        assert first["compacted_partitions"] >= 1
        assert not held & referenced(vault), "compaction should have replaced the held files"
        vault.write(rows(T0 + 600 * STEP, 300, seed=2))
        vault.flush()
        second = vault.maintain(now_ms=T0 + 3 * DAY)
        assert second["compacted_partitions"] >= 1
        assert first["expired"]["files"] == second["expired"]["files"] == 0
        got = reader.raw_samples(series_ids, T0, T0 + DAY)
        assert got.equals(want)
    time.sleep(0.01)
    with Vault.open_local(str(vault_dir), keep_snapshots=1, orphan_grace="1ms") as vault:
        third = vault.maintain(now_ms=T0 + 3 * DAY)
        assert third["expired"]["files"] >= len(held)
        assert parquet_files(vault_dir) == referenced(vault)
        assert vault.query("gpu_util", T0, T0 + DAY).shape[0] == 3 * 900


# ---------------------------------------------------------------- catalog fallback
@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_damaged_newest_catalog_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    vault_dir = tmp_path / "vault"
    with Vault.open_local(str(vault_dir)) as vault:
        vault.write(rows(T0, 100))
        vault.flush()
        kept = vault.snapshot()
        vault.write(rows(T0 + DAY, 100))
        vault.flush()
        lost = vault.snapshot()
    newest = vault_dir / "catalog" / f"v{lost.version:012d}.json"
    body = newest.read_bytes()
    damaged = body[: len(body) // 2] if damage == "truncated" else b""
    newest.write_bytes(damaged)
    only_in_lost = {Path(f.path) for f in lost.files} - {Path(f.path) for f in kept.files}
    with caplog.at_level(logging.WARNING, logger="metricvault"):
        vault = Vault.open_local(str(vault_dir), create=False, orphan_grace="1ms")
    with vault:
        assert newest.name in caplog.text and "unreadable" in caplog.text
        assert vault.snapshot().version == kept.version
        assert vault.query("gpu_util", T0, T0 + HOUR).shape[0] == 3 * 100
        vault.write(rows(T0 + 2 * DAY, 10))
        vault.flush()
        assert vault.snapshot().version == lost.version + 1, "a commit reused a damaged version"
        time.sleep(0.01)
        vault.maintain(now_ms=T0 + 3 * DAY)
        assert all(p.exists() for p in only_in_lost), (
            "maintain deleted files the damaged version names"
        )
        assert vault.query("gpu_util", T0 + 2 * DAY, T0 + 3 * DAY).shape[0] == 30
    assert newest.read_bytes() == damaged, "the damaged version was overwritten or removed"
