"""InfluxDB 1.6 backend benchmark: the same workload into the embedded store and into InfluxDB.

The workload and queries are the store benchmark's (``bench/storage.py``): the simulated cluster
(``metricvault.sim``) and Q1-Q3 from ``bench/queries.py``, called through the same ``query``
API on both backends. The simulator's clock is moved so the data ends an hour ago: InfluxDB
refuses points older than the raw retention policy (30 d). Measured in one run:

- write samples/s: time inside ``write`` (durable on return for both);
- ``maintain`` time (embedded: flush, compact, roll up; InfluxDB: the continuous query's SELECT
  INTO per measurement plus counter increases);
- bytes/sample on disk: embedded tiers from ``stats()`` and the whole vault directory; InfluxDB
  shard directories per retention policy after its cache is snapshotted and shards are fully
  compacted (the benchmark's influxd config sets both cold durations to 1 s and waits until
  sizes settle), plus the whole data + WAL + meta directories;
- Q1/Q2/Q3 latency: one first run, then the median of ``--runs`` (InfluxDB: after its shards
  settled, so background compactions do not run during the queries).

Run from the repository root::

    .venv/bin/python bench/influx.py --quick          # 2 nodes x 8 GPUs x 1 day
    .venv/bin/python bench/influx.py --nodes 4 --days 2

Needs Debian's ``influxdb`` package (``/usr/bin/influxd``); starts it on free loopback ports
with a temporary data directory and stops it by PID. Progress goes to stderr, the markdown
report to stdout.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):  # run as a script from a checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import os
import platform
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from bench.datasets import Summary, Workload
from bench.peers import dir_bytes, free_port
from bench.queries import Timing, query_cases, time_runs
from bench.report import markdown_table

INFLUXD = "/usr/bin/influxd"
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
SETTLE_POLL_S, SETTLE_STABLE_POLLS, SETTLE_TIMEOUT_S = 1.0, 4, 180.0
CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  index-version = "inmem"
  query-log-enabled = false
  cache-snapshot-write-cold-duration = "1s"
  compact-full-write-cold-duration = "1s"
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
[continuous_queries]
  enabled = true
  run-interval = "1s"
  log-enabled = false
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=13, help="simulated nodes (default 13)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--days", type=float, default=7, help="simulated days (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="small size: 2 nodes x 1 day")
    parser.add_argument("--runs", type=int, default=5, help="timed query runs after the first")
    parser.add_argument("--workdir", default=None, help="where temporary stores go (default TMP)")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.days = 2, 1
    if args.days > 29:
        parser.error("--days must stay inside InfluxDB's 30-day raw retention policy")
    return args


def workload(args: argparse.Namespace) -> Workload:
    """``bench.datasets.simulated`` with the clock moved to end an hour ago."""
    from metricvault import sim

    end = int(time.time() * 1000) // HOUR_MS * HOUR_MS - HOUR_MS
    start = (end - int(args.days * DAY_MS)) // DAY_MS * DAY_MS
    spec = sim.ClusterSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        days=args.days,
        seed=args.seed,
        start_ms=start,
    )
    return Workload(
        key="sim",
        title=(
            f"simulated {args.nodes} nodes x {args.gpus_per_node} GPUs x {args.days:g} d at 5 s "
            f"(seed {args.seed})"
        ),
        util_metric="DCGM_FI_DEV_GPU_UTIL",
        gpu_labels=("Hostname", "gpu"),
        chunks=lambda: iter(sim.generate(spec)),
        mfu_metric="mfu",
        experiment_label="job",
    )


# --------------------------------------------------------------------------- influxd
class Influxd:
    """``influxd`` on free loopback ports with its data under ``root``; stopped by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True)
        config = root / "influxdb.conf"
        config.write_text(CONFIG.format(root=root, http_port=self.port, rpc_port=free_port()))
        self.log_path = root / "influxd.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [INFLUXD, "-config", str(config)], stdout=out, stderr=subprocess.STDOUT
            )
        self._wait_ping(30.0)

    def _wait_ping(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"influxd exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ping", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"influxd did not answer /ping within {timeout_s:.0f} s")

    def uri(self, database: str) -> str:
        return f"influxdb://127.0.0.1:{self.port}/{database}"

    def policy_bytes(self, database: str) -> dict[str, int]:
        base = self.root / "data" / database
        return {p.name: dir_bytes(p) for p in sorted(base.iterdir()) if p.is_dir()}

    def settle(self, database: str) -> float:
        """Wait (bounded) until the shard files stop changing: cache snapshotted, compacted."""
        started = time.monotonic()
        last, stable = None, 0
        while time.monotonic() - started < SETTLE_TIMEOUT_S and stable < SETTLE_STABLE_POLLS:
            time.sleep(SETTLE_POLL_S)
            now = (self.policy_bytes(database), dir_bytes(self.root / "wal"))
            stable = stable + 1 if now == last else 0
            last = now
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def allocated_bytes(path: Path) -> int:
    """Disk blocks actually used under ``path`` (InfluxDB preallocates sparse files)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


# --------------------------------------------------------------------------- runs
@dataclass
class Result:
    backend: str
    samples: int = 0
    write_s: float = 0.0
    maintain_s: float = 0.0
    raw_bytes: int | None = None
    rollup_bytes: int | None = None
    rollup_rows: int | None = None
    total_bytes: int | None = None
    timings: dict[str, Timing] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def write_all(vault: Any, work: Workload, summary: Summary | None) -> tuple[int, float]:
    written, seconds = 0, 0.0
    for chunk in work.chunks():
        if summary is not None:
            summary.observe(chunk)
        started = time.perf_counter()
        written += int(vault.write(chunk))
        seconds += time.perf_counter() - started
    return written, seconds


def run_embedded(work: Workload, summary: Summary, root: Path, runs: int) -> Result:
    from metricvault.public import Vault

    result = Result("metricvault embedded")
    path = root / "embedded"
    with Vault.open(str(path)) as vault:
        result.samples, result.write_s = write_all(vault, work, summary)
        started = time.perf_counter()
        vault.maintain(now_ms=summary.max_ts + HOUR_MS)
        result.maintain_s = time.perf_counter() - started
        tiers = vault.stats()["tiers"]
        result.raw_bytes = tiers["raw"]["bytes"]
        result.rollup_bytes = tiers["1m"]["bytes"]
        result.rollup_rows = tiers["1m"]["rows"]
        for case in query_cases(summary):
            result.timings[case.key] = time_runs(partial(case.run_vault, vault), runs)
    result.total_bytes = dir_bytes(path)
    result.notes.append("1h tier (not in InfluxDB) adds " + f"{tiers['1h']['bytes']:,} bytes")
    return result


def run_influx(work: Workload, summary: Summary, root: Path, runs: int) -> Result:
    from metricvault.config import Settings
    from metricvault.public_influx import InfluxVault
    from metricvault.store.backends.influxdb import setup

    result = Result("InfluxDB 1.6")
    server = Influxd(root / "influxd")
    db = "gpu_metrics_db"
    try:
        setup(server.uri(db), Settings())
        with InfluxVault.open(server.uri(db), Settings()) as vault:
            result.samples, result.write_s = write_all(vault, work, None)
            started = time.perf_counter()
            vault.maintain()
            result.maintain_s = time.perf_counter() - started
            result.rollup_rows = vault.stats()["tiers"]["1m"]["rows"]
            waited = server.settle(db)  # compactions would skew query timings and sizes
            for case in query_cases(summary):
                result.timings[case.key] = time_runs(partial(case.run_vault, vault), runs)
        sizes = server.policy_bytes(db)
        result.raw_bytes = sizes.get("rp_raw_30d")
        result.rollup_bytes = sizes.get("rp_longterm_3y")
        series_file = server.root / "data" / db / "_series"
        result.total_bytes = (
            sum(dir_bytes(server.root / d) for d in ("data", "wal", "meta"))
            - dir_bytes(series_file)
            + allocated_bytes(series_file)
        )
        result.notes.append(
            f"shards settled after {waited:.0f} s (cache snapshot + full compaction); the "
            f"series file `_series/` counts its {allocated_bytes(series_file):,} allocated bytes, "
            f"not its {dir_bytes(series_file):,} preallocated (sparse) ones"
        )
    finally:
        server.stop()
    return result


# --------------------------------------------------------------------------- report
def _per(value: int | None, count: int | None) -> str:
    return "n/a" if value is None or not count else f"{value / count:.3f}"


def table(summary: Summary, results: list[Result]) -> str:
    n = summary.samples
    rows = [
        ("samples written", *(f"{r.samples:,}" for r in results)),
        ("write samples/s", *(f"{r.samples / r.write_s:,.0f}" for r in results)),
        ("maintain s", *(f"{r.maintain_s:.1f}" for r in results)),
        ("raw bytes/sample", *(_per(r.raw_bytes, n) for r in results)),
        ("1m rollups bytes/row", *(_per(r.rollup_bytes, r.rollup_rows) for r in results)),
        ("whole store bytes/sample", *(_per(r.total_bytes, n) for r in results)),
    ]
    for case in query_cases(summary):
        cells = []
        for r in results:
            t = r.timings[case.key]
            cells.append(f"{t.first_ms:.1f} / {t.median_ms:.1f} ({t.rows} rows)")
        rows.append((f"{case.key} first / median ms", *cells))
    return markdown_table(("", *(r.backend for r in results)), rows)


def header(args: argparse.Namespace, summary: Summary) -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    version = subprocess.run([INFLUXD, "version"], capture_output=True, text=True).stdout
    command = " ".join([".venv/bin/python bench/influx.py", *sys.argv[1:]])
    return (
        f"- command: `{command}`\n"
        f"- run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: "
        f"{os.cpu_count()} CPUs, {memory:.0f} GiB RAM, Python {platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.1f}; {version.strip()}\n"
        f"- data: {summary.workload.title}: {summary.samples:,} samples in "
        f"{len(summary.series)} series, moved to end an hour before the run\n"
        f"- query latency: one first run, then the median of {args.runs} runs\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(INFLUXD).exists():
        log(f"{INFLUXD} is missing: apt-get update && apt-get install -y influxdb")
        return 2
    work = workload(args)
    summary = Summary(work)
    root = Path(tempfile.mkdtemp(prefix="metricvault-bench-influx-", dir=args.workdir))
    try:
        log(f"{work.title}: embedded store ...")
        embedded = run_embedded(work, summary, root, args.runs)
        log(f"  write {embedded.write_s:.1f} s, maintain {embedded.maintain_s:.1f} s")
        log("InfluxDB 1.6 ...")
        influx = run_influx(work, summary, root, args.runs)
        log(f"  write {influx.write_s:.1f} s, maintain {influx.maintain_s:.1f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    notes = [f"- {r.backend}: {note}" for r in (embedded, influx) for note in r.notes]
    report = [header(args, summary), table(summary, [embedded, influx]), "", *notes]
    sys.stdout.write("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
