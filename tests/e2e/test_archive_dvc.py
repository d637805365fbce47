"""Issue 4 end to end, with real git and DVC: export -> dvc add/push -> commit + tag -> delete
the file and the DVC cache -> restore by tag -> byte-identical, same answers; against a local
directory remote and an S3-compatible server (moto) on 127.0.0.1. Every refusal has its test."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault import Vault
from metricvault.archive.opened import SnapshotVault
from metricvault.archive.repository import list_snapshots, publish, restore, verify
from metricvault.archive.snapshot import export_snapshot
from metricvault.errors import ArchiveError, ConflictError, NotFoundError
from metricvault.sim import ClusterSpec, generate

pytestmark = pytest.mark.e2e

SPEC = ClusterSpec(nodes=2, gpus_per_node=2, days=0.25, seed=5)
HOUR = 3_600_000
START, END = SPEC.start_ms + HOUR, SPEC.start_ms + 5 * HOUR
DVC = Path(sys.executable).with_name("dvc")
QUERIES = [
    ('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "1h", ("mean", "max")),
    ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="node01"}', "1h", ("increase",)),
    ('train_loss{job="llama-70b-r3"}', "all", ("last",)),
]


@pytest.fixture(scope="module")
def vault(tmp_path_factory):
    if not DVC.exists():
        pytest.fail(f"{DVC} not found: install the test extras (pip install -e '.[test]')")
    v = Vault.open_local(str(tmp_path_factory.mktemp("vault") / "v"))
    for chunk in generate(SPEC):
        v.write(chunk)
    v.maintain(now_ms=SPEC.start_ms + 2 * 86_400_000)
    v.experiments.create(
        "r3", '{job="llama-70b-r3"} or {Hostname="node01"}', start=START, end=END, git_sha="c" * 40
    )
    v.experiments.create("r4", '{job="llama-70b-r4"}', start=START, end=END)
    yield v
    v.close()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(
        [str(DVC), *args], cwd=repo, check=True, capture_output=True, text=True, env=env
    ).stdout


def make_repo(path: Path, *, with_dvc: bool = True, remote: str | None = None) -> Path:
    """A paper's git repository, with DVC set up (and a default remote) unless told not to.

    A repository with DVC is a copy of one made once per worker (two DVC starts cost more CPU
    than most tests here): ``dvc remote add`` writes a relative path into ``.dvc/config``
    relative to ``.dvc/``, so the template's remote, given at the same place relative to the
    repository, is the copy's own."""
    if with_dvc:
        relative = os.path.relpath(remote, path) if remote else None
        template = _dvc_repo_template(path.parents[1] / "dvc-repo-templates", relative)
        shutil.copytree(template, path, symlinks=True, ignore=shutil.ignore_patterns("tmp"))
        return path
    return _make_repo(path, with_dvc=False)


def _dvc_repo_template(root: Path, remote: str | None) -> Path:
    template = root / (remote or "no-remote").replace("/", "_").replace(".", "_") / "paper"
    if not template.exists():
        _make_repo(template, with_dvc=True, remote=remote)
    return template


def _make_repo(path: Path, *, with_dvc: bool, remote: str | None = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "researcher@example.org")
    git(path, "config", "user.name", "Researcher")
    (path / "README.md").write_text("paper\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "paper")
    if with_dvc:
        dvc(path, "init", "-q")
        if remote:
            dvc(path, "remote", "add", "-d", "store", remote)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "dvc")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def answers(source: Vault | SnapshotVault) -> list[pd.DataFrame]:
    return [source.query(sel, START, END, step=step, aggs=aggs) for sel, step, aggs in QUERIES]


def round_trip(vault: Vault, repo: Path) -> None:
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    digest = sha256(info.path)
    done = publish(info)
    assert done.created and done.tag == "metrics/r3"
    assert git(repo, "rev-parse", "metrics/r3^{commit}").strip() == done.commit
    assert "artifacts/metrics/r3.parquet.dvc" in git(repo, "show", "--name-only", done.commit)
    assert git(repo, "status", "--porcelain") == ""
    # forget everything local: the file and DVC's cache
    info.path.unlink()
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    restored = restore("r3", repo)
    assert restored == info.path and sha256(restored) == digest
    with SnapshotVault(str(restored)) as snap:  # what Vault.open gives for a .parquet file
        for got, want in zip(answers(snap), answers(vault), strict=True):
            pd.testing.assert_frame_equal(got, want)
    assert [c.status for c in verify(repo)] == ["ok"]


def test_round_trip_with_a_local_directory_remote(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "dvc-remote"))
    round_trip(vault, repo)
    listed = list_snapshots(repo)
    assert [(s.experiment, s.tags, s.rows, s.present, s.in_remote) for s in listed] == [
        ("r3", ("metrics/r3",), listed[0].rows, True, True)
    ]


def test_round_trip_with_an_s3_remote(vault, tmp_path, s3_server, s3_bucket):
    repo = make_repo(tmp_path / "paper")
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    done = publish(info, remote_url=f"s3://{s3_bucket}/dvc", remote_endpoint=s3_server.endpoint)
    assert done.remote == "metricvault"
    config = (repo / ".dvc" / "config").read_text()
    assert s3_server.endpoint in config and "secret" not in config.lower()
    keys = s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert [k["Key"].split("/")[-1] for k in keys] == [done.md5[2:]]
    digest = sha256(info.path)
    info.path.unlink()
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    assert sha256(restore("r3", repo)) == digest
    assert [c.status for c in verify(repo)] == ["ok"]


def test_two_exports_are_byte_identical_and_rearchiving_is_a_no_op(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    first = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    publish(first)
    head = git(repo, "rev-parse", "HEAD")
    second = export_snapshot(vault, "r3", tmp_path / "elsewhere")
    assert sha256(second.path) == sha256(first.path)
    again = publish(export_snapshot(vault, "r3", repo / "artifacts" / "metrics"))
    assert not again.created and git(repo, "rev-parse", "HEAD") == head


def test_restore_an_older_tag_after_a_new_version(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    old = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    old_digest = sha256(old.path)
    publish(old)
    new = export_snapshot(vault, "r3", repo / "artifacts" / "metrics", tier="1m")
    publish(new, tag="metrics/r3-1m")
    out = restore("r3@metrics/r3", repo, out=tmp_path / "old.parquet")
    assert sha256(out) == old_digest
    with pytest.raises(ArchiveError, match="exists with other content"):
        restore("r3@metrics/r3", repo)
    assert sha256(restore("r3@metrics/r3", repo, force=True)) == old_digest
    with pytest.raises(NotFoundError, match="no tag metrics/r9"):
        restore("r9", repo)


def test_restore_works_when_the_remote_was_set_up_but_not_committed(vault, tmp_path):
    """`dvc init && dvc remote add -d ...` as docs/archive.md shows, without a git commit: the
    tag's commit must still carry the remote, or `dvc get --rev TAG` finds no storage."""
    repo = make_repo(tmp_path / "paper", with_dvc=False)
    dvc(repo, "init", "-q")
    dvc(repo, "remote", "add", "-d", "store", str(tmp_path / "remote"))
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    digest = sha256(info.path)
    done = publish(info)
    assert ".dvc/config" in git(repo, "show", "--name-only", done.commit)
    info.path.unlink()
    shutil.rmtree(repo / ".dvc" / "cache", ignore_errors=True)
    assert sha256(restore("r3@metrics/r3", repo, out=tmp_path / "old.parquet")) == digest


# --------------------------------------------------------------------------- refusals
def test_refuses_outside_a_git_repository(vault, tmp_path):
    info = export_snapshot(vault, "r3", tmp_path / "plain")
    with pytest.raises(ArchiveError, match="not in a git repository"):
        publish(info)


def test_refuses_without_a_dvc_repository_and_offers_init(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", with_dvc=False)
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    with pytest.raises(ArchiveError, match="pass --init"):
        publish(info)
    assert not (repo / ".dvc").exists()
    done = publish(info, init=True, remote_url=str(tmp_path / "remote"))
    assert done.created
    tracked = git(repo, "ls-files").split()
    assert ".dvc/config" in tracked and "artifacts/metrics/r3.parquet.dvc" in tracked


def test_refuses_without_a_remote(vault, tmp_path):
    repo = make_repo(tmp_path / "paper")
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    with pytest.raises(ArchiveError, match="no DVC remote configured"):
        publish(info)
    with pytest.raises(ArchiveError, match="'nope' is not configured"):
        publish(info, remote="nope")
    assert not (repo / "artifacts" / "metrics" / "r3.parquet.dvc").exists()


def test_refuses_a_dirty_pointer(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    publish(info, tag="metrics/r3-first")
    pointer = repo / "artifacts" / "metrics" / "r3.parquet.dvc"
    pointer.write_text(pointer.read_text() + "# edited by hand\n")
    with pytest.raises(ArchiveError, match="uncommitted changes"):
        publish(info)
    assert "# edited by hand" in pointer.read_text()


def test_refuses_a_snapshot_tracked_by_git(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    git(repo, "add", "-f", "artifacts/metrics/r3.parquet")
    git(repo, "commit", "-q", "-m", "oops")
    with pytest.raises(ArchiveError, match="git rm --cached"):
        publish(info)


def test_refuses_a_snapshot_outside_the_repository(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    info = export_snapshot(vault, "r3", tmp_path / "outside")
    with pytest.raises(ArchiveError, match="outside the git repository"):
        publish(info, repo=repo)


def test_refuses_to_move_a_tag_with_other_content(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    publish(export_snapshot(vault, "r3", repo / "artifacts" / "metrics"))
    tagged = git(repo, "rev-parse", "metrics/r3")
    changed = export_snapshot(vault, "r3", repo / "artifacts" / "metrics", tier="1h")
    with pytest.raises(ConflictError, match="already exists with different content"):
        publish(changed)
    assert git(repo, "rev-parse", "metrics/r3") == tagged


# --------------------------------------------------------------------------- verify
def test_verify_reports_md5_and_content_hash_mismatches(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    info = export_snapshot(vault, "r3", repo / "artifacts" / "metrics")
    publish(info)
    # rewrite one value with the original metadata, and make the pointer agree with the file:
    # only the embedded content hash can tell
    table = pq.read_table(info.path)
    values = table["value"].to_pylist()
    values[5] += 1.0
    meta = {k: v for k, v in pq.read_metadata(info.path).metadata.items() if b"metricvault" in k}
    forged = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values))
    forged = forged.replace_schema_metadata(meta)
    info.path.chmod(0o644)
    pq.write_table(forged, info.path)
    assert [c.status for c in verify(repo)] == ["md5 mismatch"]
    dvc(repo, "add", "-q", "artifacts/metrics/r3.parquet")
    assert [c.status for c in verify(repo)] == ["content hash mismatch"]
    info.path.unlink()
    assert [c.status for c in verify(repo)] == ["absent"]


def test_cli_export_dvc_restore_verify_list(vault, tmp_path):
    repo = make_repo(tmp_path / "paper", remote=str(tmp_path / "remote"))
    mv = [str(Path(sys.executable).with_name("metricvault"))]
    data = ["--data", str(vault.location.root)]
    env = {**os.environ, "COLUMNS": "200"}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*mv, *args], cwd=repo, capture_output=True, text=True, env=env)
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done

    vault.flush()
    out = run("archive", "export", "r4", *data, "--tier", "1m", "--dvc").stdout
    assert "archived: tag metrics/r4" in out
    (repo / "artifacts" / "metrics" / "r4.parquet").unlink()
    run("archive", "restore", "r4")
    assert "ok" in run("archive", "verify").stdout
    listing = run("archive", "list").stdout
    assert "metrics/r4" in listing and "pushed" in listing
    opened = run(
        "archive", "open", "artifacts/metrics/r4.parquet", "mfu", "--step", "all", "--format", "csv"
    ).stdout
    assert opened.splitlines()[0].startswith("timestamp,metric")
    refused = run("archive", "export", "r4", *data, "--dvc", "-o", str(tmp_path), ok=False)
    assert "is not in a git repository" in refused.stderr
    refused = run(
        "archive", "export", "r4", *data, "--dvc", "-o", str(tmp_path), "--repo", ".", ok=False
    )
    assert "outside the git repository" in refused.stderr
    assert not (tmp_path / "r4.parquet").exists(), "refused before exporting"
