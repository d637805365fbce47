"""Store benchmark: metricvault side by side with gzip CSV, Parquet and VictoriaMetrics.

For each dataset (the simulated cluster and the real Alibaba GPU data) it measures, in one run:
bytes/sample on disk (metricvault tiers raw/1m/1h, CSV+gzip and Parquet of the long table,
VictoriaMetrics after force-merge), write throughput (``Vault.write``; VictoriaMetrics import for
reference) and query latency of Q1-Q3 (first run and median), and prints PASS/MISS per target.

Run from the repository root::

    .venv/bin/python bench/storage.py --quick           # 2 nodes x 1 day + real data, ~2 min
    .venv/bin/python bench/storage.py                   # 13 nodes x 8 GPUs x 7 d, ~150M samples
    .venv/bin/python bench/storage.py --nodes 4 --days 2 --datasets sim --markdown results.md
    .venv/bin/python bench/storage.py --scenario seed-6-months          # 13 nodes x 1 day
    .venv/bin/python bench/storage.py --scenario seed-6-months --quick  # 2 nodes x 1 day

``--scenario seed-6-months`` measures what the seed's vault costs (100 GPUs x 15 DCGM series at
5 s for six months: the newest 30 days raw, all six months as 1m and 1h rows): it writes
``--days`` simulated days (default 1, from 2026-01-01), maintains them, scales each tier's bytes
per series and day to 1,500 series and the days that tier keeps, and sets VictoriaMetrics's
bytes for the same samples beside the raw tier.

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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata

from rich.console import Console

from bench.datasets import Summary, Workload, WorkloadUnavailable, alibaba, simulated
from bench.peers import (
    VM_INSTALL_HINT,
    VictoriaMetrics,
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
    parser.add_argument(
        "--days", type=float, default=None, help="simulated days (default 7; 1 with --scenario)"
    )
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
    parser.add_argument(
        "--scenario",
        choices=[SCENARIO],
        help=f"{SCENARIO}: bytes of the seed's 6-month vault, from --days measured days "
        "(default 1; --quick: 2 nodes)",
    )
    args = parser.parse_args(argv)
    if args.days is None:
        args.days = 1.0 if args.scenario else 7.0
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
    if args.scenario:
        return main_scenario(args)
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


# --- the seed's six-month scenario ------------------------------------------------------------

SCENARIO = "seed-6-months"
SEED_GPUS, SEED_DCGM_SERIES = 100, 15  # 100 GPUs x 15 DCGM series at 5 s
SEED_RAW_DAYS, SEED_ROLLUP_DAYS = 30, 182  # newest 30 days raw; 26 weeks of 1m and 1h rows
SEED_TARGET_BYTES = 3_000_000_000
SCENARIO_TIERS = (("raw", SEED_RAW_DAYS), ("1m", SEED_ROLLUP_DAYS), ("1h", SEED_ROLLUP_DAYS))


@dataclass
class ScenarioRun:
    """What one measured sample of days costs per tier, and how it scales to the scenario."""

    nodes: int
    gpus: int
    days: float
    first_day: str
    series: int = 0
    samples: int = 0
    tier_bytes: dict[str, int] = field(default_factory=dict)
    tier_rows: dict[str, int] = field(default_factory=dict)
    before_bytes: dict[str, int] = field(default_factory=dict)  # format-1 writer, same rows
    vm_data_bytes: int | None = None
    vm_total_bytes: int | None = None
    vm_note: str = "not measured"

    def per_series_day(self, stored: int) -> float:
        return stored / max(self.series, 1) / self.days

    def scaled(self, stored: int, days_kept: int) -> float:
        """Bytes for the scenario: per series and day, times 100 x 15 series, times days."""
        return self.per_series_day(stored) * SEED_GPUS * SEED_DCGM_SERIES * days_kept


def run_scenario(args: argparse.Namespace, workdir: Path) -> ScenarioRun:
    """Write ``--days`` simulated days into a fresh vault, maintain it (raw kept, 1m and 1h
    rows built), measure each tier's files; the same samples into VictoriaMetrics."""
    from metricvault.sim import ClusterSpec, generate
    from metricvault.store import files as fmt
    from metricvault.store.rollup import ROLLUP_COLUMNS
    from metricvault.store.vault import Vault

    spec = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days)
    first_day = datetime.fromtimestamp(spec.start_ms / 1000, UTC).strftime("%Y-%m-%d")
    run = ScenarioRun(args.nodes, args.nodes * args.gpus_per_node, args.days, first_day)
    vault = Vault.open_local(str(workdir / "metricvault"))
    try:
        log.print(f"  metricvault: writing {run.gpus} GPUs x {args.days:g} d ...")
        run.samples = sum(int(vault.write(chunk)) for chunk in generate(spec))
        vault.maintain(now_ms=spec.end_ms + 3_600_000)
        run.series = len(vault.index)
        snap = vault.catalog_version()
        for tier, _days in SCENARIO_TIERS:
            files = snap.tier_files(tier)
            run.tier_bytes[tier] = sum(f.bytes for f in files)
            run.tier_rows[tier] = sum(f.rows for f in files)
            if tier == "raw":
                continue
            rows = vault.reader.read(files, None, 0, 2**62, tier, use_cache=False)
            rows = rows.select(list(ROLLUP_COLUMNS))
            run.before_bytes[tier] = len(fmt.write_parquet(rows, fmt.ROLLUP_FLOATS, 1))
    finally:
        vault.close()
    if args.no_vm:
        run.vm_note = "VictoriaMetrics skipped (--no-vm)"
        return run
    binary = find_victoria_metrics()
    if binary is None:
        run.vm_note = VM_INSTALL_HINT
        return run
    log.print("  VictoriaMetrics: import, force_flush, force_merge ...")
    try:
        with VictoriaMetrics(binary, workdir) as vm:
            for chunk in generate(spec):
                vm.ingest(chunk)
            vm.force_flush()
            vm.force_merge_and_wait()
            sizes = vm.sizes()
        run.vm_data_bytes, run.vm_total_bytes = sizes.data_bytes, sizes.total_bytes
    except VictoriaMetricsError as exc:
        run.vm_note = f"VictoriaMetrics failed: {exc}"
    return run


def scenario_report(run: ScenarioRun, command: str) -> str:
    """The markdown tables: per tier measured, per series-day, scaled; total vs target."""
    load = os.getloadavg()
    lines = [
        f"# {SCENARIO}: 100 GPUs x 15 DCGM series at 5 s, newest {SEED_RAW_DAYS} d raw, "
        f"{SEED_ROLLUP_DAYS} d of 1m and 1h rows\n",
        f"- command: `{command}`",
        f"- measured: simulated {run.nodes} nodes x {run.gpus // max(run.nodes, 1)} GPUs, "
        f"{run.days:g} day(s) from {run.first_day} (seed 0): {run.samples:,} samples, "
        f"{run.series:,} series; scaled per series and day to "
        f"{SEED_GPUS} x {SEED_DCGM_SERIES} = {SEED_GPUS * SEED_DCGM_SERIES:,} series",
        f"- load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)",
        "",
        "| tier | rows | measured bytes | B/row | B/raw sample | before (format 1) B/row "
        "| days kept | scenario GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = 0.0
    for tier, days_kept in SCENARIO_TIERS:
        stored, rows = run.tier_bytes.get(tier, 0), max(run.tier_rows.get(tier, 0), 1)
        scaled = run.scaled(stored, days_kept)
        total += scaled
        before = run.before_bytes.get(tier)
        before_text = f"{before / rows:.2f}" if before is not None else "same"
        lines.append(
            f"| {tier} | {rows:,} | {stored:,} | {stored / rows:.2f} | "
            f"{stored / max(run.samples, 1):.3f} | {before_text} | {days_kept} | "
            f"{scaled / 1e9:.2f} |"
        )
    before_total = sum(
        run.scaled(run.before_bytes.get(tier, run.tier_bytes.get(tier, 0)), days_kept)
        for tier, days_kept in SCENARIO_TIERS
    )
    verdict = "PASS" if total <= SEED_TARGET_BYTES else "MISS"
    lines.append(f"| **total** | | | | | | | **{total / 1e9:.2f}** |")
    lines += [
        "",
        f"- total {total / 1e9:.2f} GB vs target {SEED_TARGET_BYTES / 1e9:.0f} GB: **{verdict}**"
        f"; with the rollups in format 1 (before): {before_total / 1e9:.2f} GB",
    ]
    raw = run.tier_bytes.get("raw", 0)
    if run.vm_data_bytes is None:
        lines.append(f"- VictoriaMetrics: {run.vm_note}")
    else:
        vm_scaled = run.scaled(run.vm_data_bytes, SEED_RAW_DAYS)
        ratio = raw / max(run.vm_data_bytes, 1)
        target = "PASS" if ratio <= 0.9 else "MISS"
        lines += [
            f"- VictoriaMetrics on the same samples (force_flush + force_merge, data/): "
            f"{run.vm_data_bytes / max(run.samples, 1):.3f} B/sample "
            f"(with indexdb {run.vm_total_bytes or 0:,} B); {SEED_RAW_DAYS} d raw "
            f"{vm_scaled / 1e9:.2f} GB",
            f"- metricvault raw / VictoriaMetrics: {ratio:.3f} (target <= 0.9: **{target}**)",
        ]
    return "\n".join(lines) + "\n"


def main_scenario(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="metricvault-scenario-", dir=args.workdir))
    try:
        run = run_scenario(args, root)
    finally:
        if args.keep:
            log.print(f"stores kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = scenario_report(run, " ".join(["bench/storage.py", *sys.argv[1:]]))
    if args.markdown:
        Path(args.markdown).write_text(text)
        log.print(f"markdown report written to {args.markdown}")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
