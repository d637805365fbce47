"""Store benchmark: metricvault side by side with gzip CSV, Parquet and VictoriaMetrics.

For each dataset (the simulated cluster and the real Alibaba GPU data) it measures, in one run:
bytes/sample on disk (metricvault tiers raw/1m/1h, CSV+gzip and Parquet of the long table,
VictoriaMetrics after force-merge), write throughput (``Vault.write``; VictoriaMetrics import for
reference) and query latency of Q1-Q3 (first run and median), and prints PASS/MISS per target.

Run from the repository root::

    .venv/bin/python bench/storage.py --quick           # 2 nodes x 1 day + real data, ~2 min
    .venv/bin/python bench/storage.py                   # 13 nodes x 8 GPUs x 7 d, ~150M samples
    .venv/bin/python bench/storage.py --nodes 4 --days 2 --datasets sim --markdown results.md

It installs nothing. VictoriaMetrics comes from ``apt-get install -y victoria-metrics``; without
it that peer is skipped with a message. Rich tables go to stdout, then the markdown report (or
to ``--markdown FILE``); progress goes to stderr.
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
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata

from rich.console import Console

from bench.datasets import Summary, Workload, WorkloadUnavailable, alibaba, simulated
from bench.peers import (
    VM_INSTALL_HINT,
    VictoriaMetricsError,
    find_victoria_metrics,
    victoria_metrics_version,
)
from bench.phases import load_vault_class, run_vault, run_vm, scan, write_files
from bench.queries import query_cases
from bench.report import DatasetRun, markdown, print_rich

DATASETS = ("sim", "alibaba")
log = Console(stderr=True, highlight=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=13, help="simulated nodes (default 13)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--days", type=float, default=7, help="simulated days (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="small size: 2 nodes x 1 day")
    parser.add_argument(
        "--datasets", default=",".join(DATASETS), help="comma list of sim, alibaba (default both)"
    )
    parser.add_argument("--runs", type=int, default=5, help="timed query runs after the first")
    parser.add_argument("--no-vm", action="store_true", help="skip VictoriaMetrics")
    parser.add_argument("--workdir", default=None, help="where temporary stores go (default TMP)")
    parser.add_argument("--keep", action="store_true", help="keep the stores after the run")
    parser.add_argument("--markdown", metavar="FILE", help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.days = 2, 1
    unknown = set(args.datasets.split(",")) - set(DATASETS)
    if unknown:
        parser.error(f"unknown dataset(s) {sorted(unknown)}; choose from {', '.join(DATASETS)}")
    return args


def workload_for(key: str, args: argparse.Namespace) -> Workload:
    if key == "sim":
        return simulated(args.nodes, args.days, args.gpus_per_node, args.seed)
    return alibaba()


def timed(label: str, action: Callable[[], object]) -> None:
    log.print(f"  {label} ...")
    started = time.perf_counter()
    action()
    log.print(f"  {label}: {time.perf_counter() - started:.1f} s")


def bench_dataset(workload: Workload, args: argparse.Namespace, workdir: Path) -> DatasetRun:
    run = DatasetRun(Summary(workload), cases=[])
    _vault_phase(run, args, workdir)
    run.cases = query_cases(run.summary)
    timed("CSV+gzip and Parquet", lambda: _files_phase(run, workdir))
    _vm_phase(run, args, workdir)
    return run


def _vault_phase(run: DatasetRun, args: argparse.Namespace, workdir: Path) -> None:
    vault_cls, why = load_vault_class()
    if vault_cls is None:
        run.notes.append(why)
        log.print(f"  [yellow]{why}[/]")
        timed("summary pass", lambda: scan(run.summary.workload, run.summary))
        return

    def go() -> None:
        run.vault = run_vault(vault_cls, run.summary.workload, run.summary, workdir, args.runs)

    try:
        timed("metricvault write, maintain, queries", go)
    except Exception as exc:  # a failing store is a result to report, not a reason to stop
        run.vault = None
        run.notes.append(f"metricvault failed: {type(exc).__name__}: {exc}")
        log.print(f"  [red]metricvault failed:[/] {type(exc).__name__}: {exc}")
        run.summary = Summary(run.summary.workload)
        timed("summary pass", lambda: scan(run.summary.workload, run.summary))


def _files_phase(run: DatasetRun, workdir: Path) -> None:
    run.files = write_files(run.summary.workload, run.summary, workdir)


def _vm_phase(run: DatasetRun, args: argparse.Namespace, workdir: Path) -> None:
    if args.no_vm:
        run.notes.append("VictoriaMetrics skipped (--no-vm)")
        return
    binary = find_victoria_metrics()
    if binary is None:
        run.notes.append(VM_INSTALL_HINT)
        log.print(f"  [yellow]{VM_INSTALL_HINT}[/]")
        return

    def go() -> None:
        run.vm = run_vm(binary, run.summary.workload, run.summary, workdir, args.runs)

    try:
        timed("VictoriaMetrics import, flush, merge, queries", go)
    except VictoriaMetricsError as exc:
        run.notes.append(f"VictoriaMetrics failed: {exc}")
        log.print(f"  [red]VictoriaMetrics failed:[/] {exc}", markup=True)


def environment(args: argparse.Namespace) -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(f"{name} {_version(name)}" for name in ("pyarrow", "duckdb", "pandas"))
    vm = victoria_metrics_version() if find_victoria_metrics() else "not installed"
    command = " ".join(["bench/storage.py", *sys.argv[1:]])
    return (
        f"# metricvault store benchmark\n\n"
        f"- command: `{command}`\n"
        f"- run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: "
        f"{os.cpu_count()} CPUs, {memory:.0f} GiB RAM, Python {platform.python_version()}\n"
        f"- load average at start {os.getloadavg()[0]:.1f} (other work here skews timings)\n"
        f"- {versions}; VictoriaMetrics {vm}\n"
        f"- query latency: one first run, then the median of {args.runs} runs\n"
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Console(highlight=False, width=shutil.get_terminal_size((160, 40)).columns)
    report = [environment(args)]
    root = Path(tempfile.mkdtemp(prefix="metricvault-bench-", dir=args.workdir))
    try:
        for key in args.datasets.split(","):
            report.append(_one_dataset(key, args, root / key, out))
    finally:
        if args.keep:
            log.print(f"stores kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = "\n".join(report)
    if args.markdown:
        Path(args.markdown).write_text(text)
        log.print(f"markdown report written to {args.markdown}")
    else:
        sys.stdout.write(text)
    return 0


def _one_dataset(key: str, args: argparse.Namespace, workdir: Path, out: Console) -> str:
    try:
        workload = workload_for(key, args)
    except WorkloadUnavailable as exc:
        log.print(f"[yellow]{key}: skipped[/]: {exc}")
        return f"## {key}\n\nskipped: {exc}\n"
    log.print(f"[bold]{workload.title}[/]")
    workdir.mkdir(parents=True)
    run = bench_dataset(workload, args, workdir)
    print_rich(out, workload.title, run, args.runs)
    return markdown(workload.title, run, args.runs)


if __name__ == "__main__":
    raise SystemExit(main())
