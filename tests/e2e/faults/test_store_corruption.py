"""Issue 10: a damaged or full store — corrupt buffer batches, truncated series files, bit
flips in data files, and a full disk — gets a clear error or a repair, never a wrong answer.

Everything here is real: a real SQLite buffer row holding garbage, real files truncated or
with a byte flipped inside a Parquet data page, a real tmpfs filled to the last block, and
``metricvault`` commands and ``metricvault serve`` as subprocesses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault.errors import CorruptionError
from metricvault.store.check import check
from metricvault.store.vault import Vault

from ..conftest import GatewayProcess, S3Server, http_get, metric_sum, parse_exposition
from .disks import fill, tmpfs

pytestmark = pytest.mark.e2e

CLI_TIMEOUT_S = 60
DAY_MS = 86_400_000
T0 = (int(time.time() * 1000) // DAY_MS - 3) * DAY_MS  # a day start within raw retention
LOAD_PATH = Path(__file__).resolve().parents[2] / "gateway_load.py"
_spec = importlib.util.spec_from_file_location("gateway_load", LOAD_PATH)
assert _spec is not None and _spec.loader is not None
load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load)


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    env["COLUMNS"] = "200"  # rich wraps at 80 columns otherwise, splitting the paths we look for
    result = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"metricvault {' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


def frame(metric: str, series: dict[str, float], n: int, t0: int = T0) -> pd.DataFrame:
    """``n`` samples 5 s apart per ``series`` label value, noisy floats around a level."""
    rng = np.random.default_rng(len(series) * 1000 + n)
    rows = []
    for name, level in series.items():
        values = level + rng.normal(0, 1, n)
        for i in range(n):
            rows.append((t0 + i * 5000, metric, name, float(values[i])))
    return pd.DataFrame(rows, columns=["timestamp", "metric", "gpu", "value"])


def stats(vault_dir: Path) -> dict[str, Any]:
    return json.loads(cli("stats", "--json", "--data", str(vault_dir)).stdout)


def query_values(vault_dir: Path, selector: str) -> pd.DataFrame:
    with Vault.open_local(str(vault_dir), create=False) as vault:
        return vault.query(selector, T0, T0 + 86_400_000)


def catalog_versions(vault_dir: Path) -> list[str]:
    return sorted(p.name for p in (vault_dir / "catalog").glob("v*.json"))


# ------------------------------------------------------------------ corrupt buffer batch
def test_corrupt_buffer_batch_is_quarantined_and_counted(tmp_path: Path, gateway: Any) -> None:
    vault_dir = tmp_path / "vault"
    vault = Vault.open_local(str(vault_dir))
    vault.write(frame("gpu_util", {"0": 50.0}, 100))
    garbage = os.urandom(3000)
    with sqlite3.connect(vault_dir / "state" / "buffer.sqlite") as db:
        db.execute("INSERT INTO batches (samples, payload) VALUES (?, ?)", (77, garbage))
    vault.write(frame("gpu_util", {"1": 60.0}, 100))
    vault.buffer.close()  # like a crash: nothing flushed

    stats(vault_dir)  # used to fail in close()'s flush, as did every other command
    cli("maintain", "--data", str(vault_dir))
    info = stats(vault_dir)
    assert info["buffer"]["quarantined_batches"] == 1
    assert "1 corrupt buffer batch(es)" in cli("stats", "--data", str(vault_dir)).stdout
    quarantined = list((vault_dir / "state" / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == garbage
    assert info["tiers"]["raw"]["rows"] == 200  # both good batches, before and after it
    got = query_values(vault_dir, "gpu_util")
    assert sorted(got.groupby("gpu").size().to_dict().items()) == [("0", 100), ("1", 100)]

    # a gateway started on a buffer with a corrupt batch serves, flushes and counts it
    with sqlite3.connect(vault_dir / "state" / "buffer.sqlite") as db:
        db.execute("INSERT INTO batches (samples, payload) VALUES (?, ?)", (5, b"\x00" * 40))
    gw = gateway(data_dir=vault_dir)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        scraped = parse_exposition(http_get(f"{gw.url}/metrics")[1].decode())
        if metric_sum(scraped, "metricvault_buffer_quarantined_batches") == 2:
            break
        time.sleep(0.2)
    assert metric_sum(scraped, "metricvault_buffer_quarantined_batches") == 2, gw.log_tail()
    assert len(list((vault_dir / "state" / "quarantine").iterdir())) == 2


# ------------------------------------------------------------------ truncated series file
def test_truncated_series_file_names_it_and_check_repair_rebuilds(
    tmp_path: Path,
) -> None:
    vault_dir = tmp_path / "vault"
    # two writers (gateway workers) both see gpu 0 first; the second has not flushed yet, so
    # its buffer still holds gpu 0's labels when the first writer's series file is damaged
    vault = Vault.open_local(str(vault_dir))
    other = Vault.open_local(str(vault_dir), buffer_name="buffer-other")
    other.write(frame("gpu_util", {"0": 50.0}, 50, t0=T0 + 3_600_000))
    other.buffer.close()
    vault.write(frame("gpu_util", {"0": 50.0, "1": 60.0}, 50))
    vault.close()
    broken = vault.snapshot().series_files[0].path
    data = Path(broken).read_bytes()
    Path(broken).write_bytes(data[: len(data) // 2])

    failed = cli("stats", "--data", str(vault_dir), check=False)
    assert failed.returncode != 0
    assert Path(broken).name in failed.stderr and "metricvault check --repair" in failed.stderr

    before = catalog_versions(vault_dir)
    plan = cli("check", "--data", str(vault_dir), check=False)
    assert plan.returncode == 1, plan.stdout + plan.stderr
    assert Path(broken).name in plan.stdout
    assert "1 series recovered" in plan.stdout and "1 series lost" in plan.stdout, plan.stdout
    assert catalog_versions(vault_dir) == before  # without --repair nothing changes

    repaired = cli("check", "--repair", "--data", str(vault_dir), check=False)
    assert repaired.returncode == 1 and "repaired" in repaired.stdout, repaired.stdout
    assert len(catalog_versions(vault_dir)) == len(before) + 1
    assert cli("check", "--data", str(vault_dir)).returncode == 0
    assert stats(vault_dir)["series"] == 1
    cli("maintain", "--data", str(vault_dir))  # flushes the other writer's buffer too
    assert len(query_values(vault_dir, 'gpu_util{gpu="0"}')) == 100
    # the lost series' samples are still in the data files: written again, it is whole again
    with Vault.open_local(str(vault_dir)) as vault:
        vault.write(frame("gpu_util", {"1": 60.0}, 1, t0=T0 + 7_200_000))
    assert len(query_values(vault_dir, 'gpu_util{gpu="1"}')) == 51


# ------------------------------------------------------------------ damaged catalog versions
@pytest.mark.parametrize(
    ("damage", "why"),
    [(b"", "empty"), (b'{"version": 3, "files": [', "truncated"), (b"\x00" * 64, "zeroed")],
    ids=["empty", "truncated", "zeroed"],
)
def test_check_fails_on_an_unreadable_newest_catalog_version_and_repair_leaves_it(
    tmp_path: Path, damage: bytes, why: str
) -> None:
    vault_dir = tmp_path / "vault"
    with Vault.open_local(str(vault_dir)) as vault:
        for gpu in ("0", "1"):
            vault.write(frame("gpu_util", {gpu: 50.0}, 10))
            vault.flush()
    newest = vault_dir / "catalog" / catalog_versions(vault_dir)[-1]
    newest.write_bytes(damage)
    before = catalog_versions(vault_dir)
    for args in (("check",), ("check", "--repair")):
        result = cli(*args, "--data", str(vault_dir), check=False)
        assert result.returncode == 1, f"{why}: {result.stdout}{result.stderr}"
        assert f"PROBLEM {newest}" in result.stdout, result.stdout
        assert "unreadable" in result.stdout and "restore the file from a backup" in result.stdout
        assert "ok:" not in result.stdout
        assert catalog_versions(vault_dir) == before  # a catalog file is a person's call
        assert newest.read_bytes() == damage


def test_check_only_warns_of_an_unreadable_older_catalog_version(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    with Vault.open_local(str(vault_dir)) as vault:
        for gpu in ("0", "1"):
            vault.write(frame("gpu_util", {gpu: 50.0}, 10))
            vault.flush()
    older = vault_dir / "catalog" / catalog_versions(vault_dir)[0]
    older.write_bytes(b"")
    result = cli("check", "--data", str(vault_dir))
    assert f"warning: older catalog version {older} is unreadable" in result.stdout
    assert "PROBLEM" not in result.stdout and "ok:" in result.stdout


# ------------------------------------------------------------------ bit flips
def flip_inside_data_page(data: bytes, column: str) -> bytes:
    """Flip one bit in the middle of ``column``'s first data page (past its page header)."""
    meta = pq.read_metadata(pa.BufferReader(data)).row_group(0)
    chunk = next(
        meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column
    )
    at = chunk.data_page_offset + chunk.total_compressed_size // 2
    flipped = bytearray(data)
    flipped[at] ^= 0x10
    return bytes(flipped)


def test_bit_flip_in_data_file_fails_loudly_and_check_names_it(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    with Vault.open_local(str(vault_dir)) as vault:
        vault.write(frame("gpu_util", {"0": 50.0, "1": 60.0}, 2000))
        vault.write(frame("gpu_util", {"0": 50.0}, 10, t0=T0 + 86_400_000))  # next day's file
    day1 = next(f for f in vault.snapshot().files if f.min_ts == T0)
    Path(day1.path).write_bytes(flip_inside_data_page(Path(day1.path).read_bytes(), "value_f"))
    name = Path(day1.path).name

    failed = cli(
        "query",
        "gpu_util",
        f"--start={T0}",
        f"--end={T0 + 86_400_000}",
        "--data",
        str(vault_dir),
        check=False,
    )
    assert failed.returncode != 0 and name in failed.stderr, failed.stdout + failed.stderr
    assert "checksum" in failed.stderr and "metricvault check" in failed.stderr
    sql = cli("sql", "SELECT sum(value) FROM raw", "--data", str(vault_dir), check=False)
    assert sql.returncode != 0 and "checksum" in sql.stderr, sql.stdout + sql.stderr

    plan = cli("check", "--data", str(vault_dir), check=False)
    assert plan.returncode == 1 and name in plan.stdout, plan.stdout + plan.stderr
    assert "4,000 samples" in plan.stdout and "2 series" in plan.stdout, plan.stdout
    repaired = cli("check", "--repair", "--data", str(vault_dir), check=False)
    assert repaired.returncode == 1 and "repaired" in repaired.stdout, repaired.stdout
    assert cli("check", "--data", str(vault_dir)).returncode == 0
    with Vault.open_local(str(vault_dir), create=False) as vault:
        left = vault.query("gpu_util", T0, T0 + 2 * 86_400_000)
    assert len(left) == 10  # the other day's file; the lost day was named in the plan


def test_damaged_rollup_file_is_recomputed_from_raw_by_repair(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    with Vault.open_local(str(vault_dir)) as vault:
        vault.write(frame("gpu_util", {"0": 50.0, "1": 60.0}, 2000))
        vault.maintain()
        before = vault.query("gpu_util", T0, T0 + DAY_MS, step="1m", aggs=("mean", "max"))
        rollup = next(f for f in vault.snapshot().files if f.tier == "1m")
        damaged = flip_inside_data_page(Path(rollup.path).read_bytes(), "sum_f")
        Path(rollup.path).write_bytes(damaged)
        plan = check(vault.location)
        assert [p.path for p in plan.problems] == [rollup.path]
        assert plan.problems[0].lost.startswith("nothing"), plan.problems[0]
        assert check(vault.location, repair=True).repaired_version is not None
        vault.maintain()
        after = vault.query("gpu_util", T0, T0 + DAY_MS, step="1m", aggs=("mean", "max"))
        assert check(vault.location).ok
    pd.testing.assert_frame_equal(after, before)


def test_bit_flip_in_an_s3_object_fails_loudly_and_check_names_it(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/vault"
    where: dict[str, Any] = {
        "s3_endpoint": s3_server.endpoint,
        "state_dir": str(tmp_path / "state"),
    }
    with Vault.open_local(uri, **where) as vault:
        vault.write(frame("gpu_util", {"0": 50.0, "1": 60.0}, 2000))
    damaged = vault.snapshot().files[0]
    key = damaged.path.split("/", 1)[1]  # in-memory paths are bucket/key
    client = s3_server.client()
    body = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3_bucket, Key=key, Body=flip_inside_data_page(body, "value_f"))

    with Vault.open_local(uri, **where) as vault:
        with pytest.raises(CorruptionError, match="checksum") as failed:
            vault.query("gpu_util", T0, T0 + DAY_MS)
        assert Path(key).name in str(failed.value)
        report = check(vault.location)
    assert [p.path for p in report.problems] == [damaged.path]
    assert "4,000 samples of 2 series" in report.problems[0].what


# ------------------------------------------------------------------ full disk
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs."""
    with tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def test_full_disk_writes_answer_503_and_reads_keep_working(small_disk: Path, gateway: Any) -> None:
    vault_dir = small_disk / "vault"
    # the default 2 workers: their prometheus-client mmap files must not be on the full disk,
    # where a write into a sparse page is SIGBUS (docs/operations.md)
    gw: GatewayProcess = gateway(data_dir=vault_dir, settings=("gateway_workers=2",))
    line = "gpu,gpu=0 util=50 {}\n"
    status, _, body = post(f"{gw.url}/write?precision=ms", line.format(T0).encode(), {})
    assert status == 204, body
    deadline = time.monotonic() + 20
    while stats(vault_dir)["tiers"]["raw"]["rows"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)

    # a second vault on the same disk, written by another writer: the commands' own buffer
    # file (buffer.sqlite) does not exist there yet, and cannot be created once the disk is full
    other_dir = small_disk / "other"
    with Vault.open_local(str(other_dir), buffer_name="writer") as other:
        other.write(frame("gpu_util", {"0": 50.0}, 20))
    # and one whose buffer holds samples not flushed yet (a gateway between two flushes)
    pending_dir = small_disk / "pending"
    with Vault.open_local(str(pending_dir)) as writer:
        writer.write(frame("gpu_util", {"0": 50.0}, 20))
    writer = Vault.open_local(str(pending_dir))
    writer.write(frame("gpu_util", {"0": 50.0}, 5, t0=T0 + 3_600_000))
    writer.buffer.close()  # no flush
    fill(small_disk)
    assert stats(pending_dir)["buffer"]["samples"] == 5
    answered = cli("query", "gpu_util", f"--start={T0}", f"--end={T0 + DAY_MS}", "-f", "csv",
                   "--data", str(pending_dir))  # fmt: skip
    assert len(answered.stdout.splitlines()) == 1 + 20  # the flushed samples, and it says so:
    assert "5 buffered sample(s)" in answered.stderr, answered.stderr
    assert stats(other_dir)["tiers"]["raw"]["rows"] == 20
    assert len(query_values(other_dir, "gpu_util")) == 20
    assert not (other_dir / "state" / "buffer.sqlite").exists()
    for _ in range(3):  # the gateway keeps answering 503, not 500, while the disk is full
        lines = "".join(line.format(T0 + 1000 * (i + 1)) for i in range(2000)).encode()
        status, headers, body = post(f"{gw.url}/write?precision=ms", lines, {})
        assert status == 503 and "retry-after" in headers, (status, body, gw.log_tail())
        assert b"disk" in body.lower(), body
    status, headers, body = post(
        f"{gw.url}/api/v1/write", load.payload(T0 + 10_000, 0, 200), load.HEADERS
    )
    assert status == 503 and "retry-after" in headers, (status, body)

    assert stats(vault_dir)["tiers"]["raw"]["rows"] == 1
    out = cli(
        "query",
        "gpu_util",
        f"--start={T0}",
        f"--end={T0 + 60_000}",
        "-f",
        "csv",
        "--data",
        str(vault_dir),
    )
    assert "50" in out.stdout
    (small_disk / "filler").unlink()
    status, _, body = post(f"{gw.url}/write?precision=ms", line.format(T0 + 5).encode(), {})
    assert status == 204, body
