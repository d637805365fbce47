"""``metricvault demo``: a simulated GPU cluster, backfilled, maintained, summarised and plotted.

The data comes from :mod:`metricvault.sim` — a simulator, not a measurement — and every series
carries ``simulated="true"``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from metricvault.durations import DAY_MS, now_ms
from metricvault.sim import ClusterSpec, JobSpec, generate, total_samples
from metricvault.sim.workload import hostname
from metricvault.store.vault import Vault

MJ_PER_KWH = 3.6e9


@dataclass(frozen=True)
class JobSummary:
    name: str
    gpus: int
    hours: float
    gpu_hours: float
    mean_mfu: float
    mean_util: float
    energy_kwh: float
    final_loss: float


def run_demo(
    data: str, nodes: int, days: float, seed: int, report: Path, fresh: bool, console: Console
) -> None:
    path = Path(data)
    if fresh and path.exists():
        _remove_vault(path)
    start = (now_ms() - int(days * DAY_MS)) // DAY_MS * DAY_MS
    spec = ClusterSpec(nodes=nodes, gpus_per_node=8, days=days, seed=seed, start_ms=start)
    console.print(
        f"[bold]metricvault demo[/]: simulating {nodes} nodes x 8 GPUs x {days:g} days at 5 s "
        f'(seed {seed}; every series is labelled simulated="true") into {path}'
    )
    began = time.monotonic()
    with Vault.open(str(path)) as vault:
        if fresh:
            (path / DEMO_MARKER).write_text("made by 'metricvault demo'; it may replace it\n")
        written = _backfill(vault, spec, console)
        console.print("maintaining: flush, compact, roll up to 1m and 1h, retention ...")
        vault.maintain(progress=True)
        stats = vault.stats()
        jobs = [summarise_job(vault, spec, job) for job in spec.resolved_jobs()]
        from metricvault.report import write_report

        write_report(vault, spec, jobs, stats, report)
    console.print(_storage_table(stats, written))
    console.print(_jobs_table(jobs))
    console.print(
        f"done in {time.monotonic() - began:.0f}s. Report: [bold]{report}[/]. "
        "Try (after `source .venv/bin/activate`):\n"
        f"  metricvault stats -d {path}\n"
        f"  metricvault query 'mfu' -d {path} --start=-{days:g}d --step 1d --agg mean,max\n"
        f'  metricvault sql "SELECT count(*) FROM raw" -d {path}'
    )


DEMO_MARKER = "demo-vault.txt"


def _remove_vault(path: Path) -> None:
    """Delete a vault only if an earlier demo made it: never a user's real data."""
    if not (path / DEMO_MARKER).exists():
        raise SystemExit(
            f"{path} exists and was not made by 'metricvault demo'; refusing to replace it. "
            "Pass another --data directory, or --no-fresh to add the demo data to it"
        )
    shutil.rmtree(path)


def _backfill(vault: Vault, spec: ClusterSpec, console: Console) -> int:
    total = total_samples(spec)
    columns = (
        TextColumn("backfilling"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeRemainingColumn(),
    )
    written = 0
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("backfill", total=total)
        for chunk in generate(spec):
            written += vault.write(chunk)
            bar.update(task, completed=written)
    return written


def _hosts(job: JobSpec) -> str:
    return "|".join(hostname(n) for n in job.nodes)


def summarise_job(vault: Vault, spec: ClusterSpec, job: JobSpec) -> JobSummary:
    """GPU-hours, mean MFU and utilisation, energy and final loss of one job, from queries."""
    start = spec.start_ms + job.start_offset_s * 1000
    end = start + job.duration_s * 1000
    gpus = len(job.nodes) * spec.gpus_per_node
    hosts = f'{{Hostname=~"{_hosts(job)}"}}'
    mfu = vault.query(f'mfu{{job="{job.name}"}}', start, end, step="all", aggs=("mean",))
    util = vault.query(
        "DCGM_FI_DEV_GPU_UTIL" + hosts, start, end, step="all", aggs=("sum", "count")
    )
    energy = vault.query(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" + hosts, start, end, step="all", aggs=("increase",)
    )
    loss = vault.query(f'train_loss{{job="{job.name}"}}', start, end, step="all", aggs=("last",))
    hours = job.duration_s / 3600
    return JobSummary(
        name=job.name,
        gpus=gpus,
        hours=hours,
        gpu_hours=hours * gpus,
        mean_mfu=_first(mfu, "mean"),
        mean_util=float(util["sum"].sum() / util["count"].sum()) if len(util) else float("nan"),
        energy_kwh=float(energy["increase"].sum()) / MJ_PER_KWH,
        final_loss=_first(loss, "last"),
    )


def _first(frame: Any, column: str) -> float:
    return float(frame[column].iloc[0]) if len(frame) else float("nan")


def _storage_table(stats: dict[str, Any], written: int) -> Table:
    table = Table(title=f"storage: {stats['series']} series, {written:,} samples written")
    for col in ("tier", "rows", "bytes", "bytes/row", "bytes per raw sample"):
        table.add_column(col, justify="right")
    for tier, t in stats["tiers"].items():
        per_sample = t["bytes"] / written if written else 0
        table.add_row(
            tier,
            f"{t['rows']:,}",
            f"{t['bytes']:,}",
            f"{t['bytes_per_row'] or 0:.2f}",
            f"{per_sample:.3f}",
        )
    return table


def _jobs_table(jobs: list[JobSummary]) -> Table:
    table = Table(title="training jobs, side by side (from vault queries)")
    table.add_column("job", no_wrap=True)
    for col in ("GPUs", "hours", "GPU-h", "MFU", "util %", "kWh", "final loss"):
        table.add_column(col, justify="right")
    for j in jobs:
        table.add_row(
            j.name,
            str(j.gpus),
            f"{j.hours:.1f}",
            f"{j.gpu_hours:,.0f}",
            f"{j.mean_mfu:.3f}",
            f"{j.mean_util:.1f}",
            f"{j.energy_kwh:,.1f}",
            f"{j.final_loss:.3f}",
        )
    return table
