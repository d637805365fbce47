"""Many writers on one S3 vault (moto on loopback): gateway throughput, commit races, commit
latency against the vault's size, and what a reader pays to find the newest catalog version.

    python bench/scale.py --quick     # ~2 min: 6 s of load per gateway count, small catalogs
    python bench/scale.py             # the size docs/benchmarks.md publishes (~5 min)

Sections (each compares against a peer measured in the same run; the machine's load average
is printed beside every table, because absolute numbers on a shared 2-core box are noise):

1. ``metricvault serve`` x 1, 2, 4 (one worker each, own state directories) on one vault, each
   fed line protocol by its own client thread: acknowledged samples/s (ratio to 1 gateway),
   catalog commits, lost commit races and their retries per minute (from the gateways' logs).
2. Commit latency against the number of files in the vault: our catalog on moto S3, on local
   disk, and pyiceberg's SQL catalog (SQLite) ``add_files`` on local disk -- the alternative
   docs/decisions/0006-multi-writer-catalog.md weighs (skipped without pyiceberg).
3. Finding the newest version: listing catalog/ (as before) vs catalog/NEWEST (cold) vs
   probing v<N+1> from the cached version (warm), at 10 and 100 kept versions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

HOUR_MS = 3_600_000
CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} not ready in {timeout_s} s")


class Moto:
    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        binary = Path(sys.executable).parent / "moto_server"
        self.log = open(tmp / "moto.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(binary), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        _wait(self.endpoint + "/", self.proc)

    def bucket(self) -> str:
        import boto3

        name = f"scale-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(
            Bucket=name
        )
        return name

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


# ---------------------------------------------------------------- 1. gateways
def gateways(moto: Moto, tmp: Path, count: int, seconds: float) -> dict[str, float]:
    uri = f"s3://{moto.bucket()}/scale"
    env = {**os.environ, **CREDS, "PYTHONUNBUFFERED": "1"}
    procs, ports, logs = [], [], []
    for i in range(count):
        port = _free_port()
        log = tmp / f"gw{count}-{i}.log"
        cmd = [sys.executable, "-m", "metricvault.cli", "serve", "--data", uri]
        cmd += ["--listen", f"127.0.0.1:{port}", "--set", f"s3_endpoint={moto.endpoint}"]
        cmd += ["--set", f"state_dir={tmp / f'gw{count}-{i}'}", "--set", "gateway_workers=1"]
        cmd += ["--set", "gateway_maintain=false", "--set", "flush_interval=1s"]
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        ports.append(port)
        logs.append(log)
    for port, proc in zip(ports, procs, strict=True):
        _wait(f"http://127.0.0.1:{port}/-/ready", proc)
    acked = [0] * count
    stop = threading.Event()
    t0_ms = int(time.time() * 1000) - HOUR_MS

    def drive(i: int) -> None:
        seq = 0
        while not stop.is_set():
            lines = []
            for _ in range(10):  # 10 timestamps x 50 series = 500 samples a request
                ts = t0_ms + seq
                seq += 1
                lines += [f"scale,gw=g{i},s=s{j} v={j}.5 {ts}" for j in range(50)]
            req = urllib.request.Request(
                f"http://127.0.0.1:{ports[i]}/api/v2/write?precision=ms",
                data="\n".join(lines).encode(),
                method="POST",
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    if resp.status == 204:
                        acked[i] += len(lines)
            except OSError:
                time.sleep(0.1)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for proc in procs:  # SIGTERM: each flushes what it buffered (commits counted below)
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=120)
    lost = sum(p.read_text().count("committed by another writer first") for p in logs)
    commits = _versions(moto, uri)
    return {
        "gateways": count,
        "samples_per_s": sum(acked) / elapsed,
        "commits": commits,
        "lost_per_min": lost / (elapsed / 60),
        "lost_share": lost / max(1, lost + commits),
    }


def _versions(moto: Moto, uri: str) -> int:
    from metricvault.config import Settings
    from metricvault.store.catalog import Catalog
    from metricvault.store.layout import open_location

    with tempfile.TemporaryDirectory() as state:
        settings = Settings(s3_endpoint=moto.endpoint, state_dir=state)
        return Catalog(open_location(uri, settings)).current().version


# ---------------------------------------------------------------- 2. commit latency
def _catalog(uri: str, endpoint: str, state: str) -> Any:
    from metricvault.config import Settings
    from metricvault.store.catalog import Catalog
    from metricvault.store.layout import open_location

    return Catalog(open_location(uri, Settings(s3_endpoint=endpoint, state_dir=state)))


def commit_latency(catalog: Any, sizes: list[int], samples: int) -> dict[int, float]:
    """Median ms of a one-file commit when the vault already holds ``size`` files."""
    from metricvault.store.catalog import Change, DataFile

    out: dict[int, float] = {}
    have = 0
    day = "2026-01-01"
    for size in sizes:
        if size > have:  # grow in one commit: the catalog's size, not its history, matters
            grow = [
                DataFile(
                    catalog.loc.path("data", "raw", f"day={day}", f"g{i}.parquet"),
                    "raw",
                    day,
                    1,
                    100,
                    0,
                    1,
                    i + 1,
                )
                for i in range(have, size)
            ]
            catalog.commit(Change(add=grow, file_ids_used=len(grow)))
            have = size
        times = []
        for n in range(samples):
            f = DataFile(
                catalog.loc.path("data", "raw", f"day={day}", f"x{size}-{n}.parquet"),
                "raw",
                day,
                1,
                100,
                0,
                1,
                10**9 + size * 100 + n,
            )
            t0 = time.perf_counter()
            catalog.commit(Change(add=[f]))
            times.append(time.perf_counter() - t0)
            have += 1
        out[size] = statistics.median(times) * 1e3
    return out


def iceberg_latency(root: Path, sizes: list[int], samples: int) -> dict[int, float] | None:
    try:
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    table_data = pa.table({"series_id": pa.array([1], pa.int64()), "ts": pa.array([1], pa.int64())})
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/cat.db", warehouse=f"file://{root}")
    catalog.create_namespace("mv")
    table = catalog.create_table("mv.raw", schema=table_data.schema)
    out: dict[int, float] = {}
    have = 0

    def new_file(name: str) -> str:
        path = root / f"{name}.parquet"
        pq.write_table(table_data, path)
        return str(path)

    for size in sizes:
        if size > have:
            table.add_files([new_file(f"g{i}") for i in range(have, size)])
            have = size
        times = []
        for n in range(samples):
            path = new_file(f"x{size}-{n}")
            t0 = time.perf_counter()
            table.add_files([path])
            times.append(time.perf_counter() - t0)
            have += 1
        out[size] = statistics.median(times) * 1e3
    return out


# ---------------------------------------------------------------- 3. newest version
def newest_version_cost(moto: Moto, tmp: Path, kept: int, runs: int) -> dict[str, float]:
    from metricvault.store.catalog import Change

    uri = f"s3://{moto.bucket()}/reads"
    writer = _catalog(uri, moto.endpoint, str(tmp / "w"))
    for _ in range(kept):
        writer.commit(Change())
    out: dict[str, float] = {}
    for mode in ("list", "pointer", "probe"):
        times = []
        for _ in range(runs):
            reader = _catalog(uri, moto.endpoint, str(tmp / "r"))
            reader.loc.s3.client()  # boto3's client is made once per process: not timed
            if mode == "probe":
                reader.current()  # warm: a reader that has queried before
            t0 = time.perf_counter()
            if mode == "list":
                reader._current_by_listing()
            else:
                reader.current()
            times.append(time.perf_counter() - t0)
        out[mode] = statistics.median(times) * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled down (about 2 minutes)")
    args = parser.parse_args()
    seconds = 10.0 if args.quick else 30.0
    sizes = [0, 100, 300] if args.quick else [0, 100, 1000, 3000]
    samples = 5 if args.quick else 10
    os.environ.update(CREDS)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        moto = Moto(tmp)
        try:
            print(f"## 1. gateways on one S3 vault (moto), {seconds:.0f} s each ({_load()})\n")
            print(
                "| gateways | acked samples/s | vs 1 gateway | commits | lost races/min "
                "| lost / all attempts |"
            )
            print("|---|---|---|---|---|---|")
            base = None
            for count in (1, 2, 4):
                r = gateways(moto, tmp, count, seconds)
                base = base or r["samples_per_s"]
                print(
                    f"| {count} | {r['samples_per_s']:,.0f} | {r['samples_per_s'] / base:.2f}x"
                    f" | {r['commits']:.0f} | {r['lost_per_min']:.1f} "
                    f"| {r['lost_share']:.1%} |"
                )
            print(f"\n## 2. one-file commit, median ms, against files in the vault ({_load()})\n")
            rows = {
                "metricvault catalog, moto S3": commit_latency(
                    _catalog(f"s3://{moto.bucket()}/c", moto.endpoint, str(tmp / "c")),
                    sizes,
                    samples,
                ),
                "metricvault catalog, local disk": commit_latency(
                    _catalog(str(tmp / "local"), "", str(tmp / "lc")), sizes, samples
                ),
            }
            ice = iceberg_latency(tmp, sizes, samples)
            if ice is not None:
                rows["pyiceberg SqlCatalog (SQLite) add_files, local disk"] = ice
            print("| catalog | " + " | ".join(f"{s} files" for s in sizes) + " |")
            print("|---|" + "---|" * len(sizes))
            for name, by_size in rows.items():
                print(f"| {name} | " + " | ".join(f"{by_size[s]:.1f}" for s in sizes) + " |")
            print(f"\n## 3. finding the newest catalog version, median ms ({_load()})\n")
            print("| versions kept | list catalog/ | NEWEST pointer (cold) | probe v<N+1> (warm) |")
            print("|---|---|---|---|")
            for kept in (10, 100):
                r = newest_version_cost(moto, tmp / f"k{kept}", kept, samples)
                print(f"| {kept} | {r['list']:.1f} | {r['pointer']:.1f} | {r['probe']:.1f} |")
        finally:
            moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
