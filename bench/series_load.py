"""What a fresh process pays in series before its first answer: open + first query (and a
gateway's first write of known series) on a vault of many series across many metrics, with
the series index loaded per shard (now) against loaded whole on open (before: what every
process did until the index loaded lazily, measured here by asking it for every shard right
after opening), beside VictoriaMetrics restarted on the same series.

    python bench/series_load.py --quick    # 40k series, ~1 min
    python bench/series_load.py            # 200k series over 400 metrics (docs/benchmarks.md)

Each measurement is a fresh Python process (its peak RSS is its own), the median of
``--repeat`` runs. Two vault states: the series files as 8 flushes left them (each holding
series of every shard) and after ``metricvault maintain`` merged them into one. The machine's
load average is printed beside the table: absolute times on a shared box are noise, compare
the ratios within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T0 = 1_767_225_600_000  # 2026-01-01
STEP_MS = 15_000


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _metric(m: int) -> str:
    return f"bench_metric_{m:04d}"


def _table(metrics: range, per_metric: int, hosts: range, ts: int) -> Any:
    import pyarrow as pa

    names, host, inst = [], [], []
    for m in metrics:
        for h in hosts:
            names.append(_metric(m))
            host.append(f"node{h:05d}")
            inst.append(f"{h % 8}")
    n = len(names)
    return pa.table(
        {
            "metric": pa.array(names),
            "host": pa.array(host),
            "gpu": pa.array(inst),
            "timestamp": pa.array([ts] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "value": pa.array([float(i % 100) for i in range(n)]),
        }
    )


def build(path: Path, series: int, metrics: int, files: int) -> None:
    from metricvault import Vault

    per_metric = series // metrics
    with Vault.open_local(str(path)) as vault:
        for f in range(files):  # each flush: a slice of every metric's hosts (every shard)
            hosts = range(f * per_metric // files, (f + 1) * per_metric // files)
            for ts in (T0, T0 + STEP_MS):
                vault.write(_table(range(metrics), per_metric, hosts, ts))
            vault.flush()


def _peak_rss_kb() -> int:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it is not inherited from the parent
    across fork + exec, and the parent here holds the whole vault it built)."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))


def child(path: str, mode: str, metric: str) -> None:
    """One measurement in this process: prints a JSON line."""
    started = time.perf_counter()
    from metricvault import Vault

    rss0 = _peak_rss_kb()
    t_import = time.perf_counter()
    vault = Vault.open_local(path)
    if mode == "eager":
        vault.index.need_all()  # every series file read whole on open, as before
    t_open = time.perf_counter()
    if "write" in sys.argv:  # a gateway: known series of one metric arrive
        n = vault.write([(metric, {"host": f"node{h:05d}", "gpu": f"{h % 8}"}, T0 + 30_000, 1.0)
                         for h in range(100)])  # fmt: skip
        assert n == 100
    else:
        got = vault.query(metric, T0, T0 + 60_000, output="arrow")
        assert got.num_rows > 0, "the query found nothing"
    t_first = time.perf_counter()
    rss = _peak_rss_kb()
    loaded = len(vault.index._by_id)
    files_read = vault.index.files_read
    vault.close()
    print(
        json.dumps(
            {
                "open_s": t_open - t_import,
                "first_s": t_first - t_open,
                "ready_s": t_first - t_import,
                "rss_mb": rss / 1024,
                "rss_delta_mb": (rss - rss0) / 1024,
                "series_loaded": loaded,
                "files_read": files_read,
                "import_s": t_import - started,
            }
        )
    )


def measure(path: Path, mode: str, metric: str, repeat: int, write: bool) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        cmd = [sys.executable, __file__, "--child", str(path), mode, metric]
        if write:
            cmd.append("write")
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def victoria(path: Path, series: int, metrics: int, metric: str, repeat: int) -> dict[str, float]:
    """VictoriaMetrics with the same series: restart, then its first query of one metric."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.peers import VictoriaMetrics, find_victoria_metrics

    binary = find_victoria_metrics()
    if binary is None:
        return {}
    import pyarrow as pa

    vm = VictoriaMetrics(binary, path)
    per_metric = series // metrics
    with vm:
        for ts in (T0, T0 + STEP_MS):
            table = _table(range(metrics), per_metric, range(per_metric), ts)
            table = table.set_column(3, "timestamp", table["timestamp"].cast(pa.int64()))
            vm.ingest(table)
        vm.force_flush()
        assert vm.series_count() >= series * 0.99, vm.series_count()
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        vm.start(timeout_s=120)
        t_open = time.perf_counter()
        got = vm.range(metric, T0, T0 + 60_000, STEP_MS)
        t_first = time.perf_counter()
        assert got > 0
        assert vm.process is not None
        status = Path(f"/proc/{vm.process.pid}/status").read_text()
        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        vm.stop()
        runs.append({"open_s": t_open - started, "first_s": t_first - t_open,
                     "ready_s": t_first - started, "rss_mb": hwm / 1024})  # fmt: skip
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40k series over 80 metrics")
    ap.add_argument("--series", type=int, default=200_000)
    ap.add_argument("--metrics", type=int, default=400)
    ap.add_argument("--files", type=int, default=8, help="flushes (series files) to build with")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-vm", action="store_true", help="skip VictoriaMetrics")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child[:3])
        return
    if args.quick:
        args.series, args.metrics = 40_000, 80
    metric = _metric(args.metrics // 2)
    with tempfile.TemporaryDirectory(prefix="series-load-") as tmp:
        root = Path(tmp) / "vault"
        t = time.perf_counter()
        build(root, args.series, args.metrics, args.files)
        print(f"built {args.series:,} series over {args.metrics} metrics in {args.files} "
              f"flushes in {time.perf_counter() - t:.0f} s; {_load()}")  # fmt: skip
        rows = []
        for state in ("flushed", "merged"):
            if state == "merged":
                from metricvault import Vault

                with Vault.open_local(str(root)) as vault:
                    vault.maintain(now_ms=T0 + 3_600_000)
                    n_files = len(vault.catalog_version().series_files)
            else:
                n_files = args.files
            for what, write in (("open + first query", False), ("open + first write", True)):
                for mode in ("eager", "lazy"):
                    r = measure(root, mode, metric, args.repeat, write)
                    rows.append((state, n_files, what, mode, r))
        vm = {} if args.no_vm else victoria(Path(tmp), args.series, args.metrics, metric,
                                            args.repeat)  # fmt: skip
    print(f"\none metric of {args.metrics} ({args.series // args.metrics} series); {_load()}")
    head = "| series files | what | index | ready s | of which open s | peak RSS MB | series read | files read |"  # noqa: E501
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for state, n_files, what, mode, r in rows:
        label = "whole on open (before)" if mode == "eager" else "per shard (now)"
        print(f"| {n_files} ({state}) | {what} | {label} | {r['ready_s']:.2f} | "
              f"{r['open_s']:.2f} | {r['rss_mb']:.0f} | {r['series_loaded']:,.0f} | "
              f"{r['files_read']:.0f} |")  # fmt: skip
    for state in ("flushed", "merged"):
        for what in ("open + first query", "open + first write"):
            eager = next(r for s, _, w, m, r in rows if (s, w, m) == (state, what, "eager"))
            lazy = next(r for s, _, w, m, r in rows if (s, w, m) == (state, what, "lazy"))
            print(f"{state}, {what}: ready {eager['ready_s'] / lazy['ready_s']:.1f}x faster, "
                  f"RSS {eager['rss_mb'] - lazy['rss_mb']:.0f} MB less")  # fmt: skip
    if vm:
        print(f"\nVictoriaMetrics restarted on the same series: ready {vm['ready_s']:.2f} s "
              f"(start to healthy {vm['open_s']:.2f} s, first query {vm['first_s']:.3f} s), "
              f"peak RSS {vm['rss_mb']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
