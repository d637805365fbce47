"""``metricvault demo``: a simulated GPU cluster, backfilled, maintained, summarised and plotted.

The data comes from :mod:`metricvault.sim` — a simulator, not a measurement — and every series
carries ``simulated="true"``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from metricvault.archive.compare import compare, display_table
from metricvault.demo_archive import archive_first_job
from metricvault.durations import ms_to_datetime, now_ms
from metricvault.progressbar import console_progress
from metricvault.sim import ClusterSpec, generate, total_samples
from metricvault.sim.workload import hostname
from metricvault.store.vault import Vault


def demo_spec(nodes: int, days: float, seed: int, end_ms: int | None = None) -> ClusterSpec:
    """The demo's cluster: ``days`` of data ending now (or at ``end_ms``), so dashboards'
    default ranges ("last 6 hours") and the docs' checks find data; with the seed and an
    explicit end the samples are the same on every run."""
    end = now_ms() if end_ms is None else end_ms
    return ClusterSpec.ending_at(end, days, nodes=nodes, gpus_per_node=8, seed=seed)


def run_demo(
    data: str,
    nodes: int,
    days: float,
    seed: int,
    report: Path,
    fresh: bool,
    console: Console,
    end_ms: int | None = None,
) -> None:
    path = Path(data)
    if fresh and path.exists():
        _remove_vault(path)
    spec = demo_spec(nodes, days, seed, end_ms)
    window = f"{_utc(spec.start_ms)} to {_utc(spec.end_ms)} UTC"
    console.print(
        f"[bold]metricvault demo[/]: simulating {nodes} nodes x 8 GPUs x {days:g} days at 5 s, "
        f'{window} (seed {seed}; every series is labelled simulated="true") into {path}'
    )
    began = time.monotonic()
    with Vault.open_local(str(path)) as vault:
        if fresh:
            (path / DEMO_MARKER).write_text("made by 'metricvault demo'; it may replace it\n")
        written = _backfill(vault, spec, console)
        console.print("maintaining: flush, compact, roll up to 1m and 1h, retention ...")
        with console_progress() as progress:
            vault.maintain(progress=progress)
        stats = vault.stats()
        ids = register_jobs(vault, spec)
        jobs = compare(vault, ids)
        archived = archive_first_job(vault, ids[0], path, fresh, console)
        from metricvault.report import write_report

        took = time.monotonic() - began
        write_report(vault, spec, ids, jobs, stats, report, archived=archived, took_s=took)
    console.print(_storage_table(stats, written))
    console.print(_jobs_table(jobs))
    console.print(
        f"done in {time.monotonic() - began:.0f}s. Report: [bold]{report}[/]. "
        "Try (after `source .venv/bin/activate`):\n"
        f"  metricvault stats -d {path}\n"
        f"  metricvault experiment compare {' '.join(ids)} -d {path} --plot compare.png "
        "--align step\n"
        f"  metricvault query 'mfu' -d {path} --start=-{days:g}d --step 1d --agg mean,max\n"
        f'  metricvault sql "SELECT count(*) FROM raw" -d {path}\n'
        f"{archived.hint}"
        f"Browse it in the web UI (read-only; docs/ui.md):\n  metricvault ui -d {path}\n"
    )


DEMO_MARKER = "demo-vault.txt"


def _utc(ms: int) -> str:
    return f"{ms_to_datetime(ms):%Y-%m-%d %H:%M}"


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


def register_jobs(vault: Vault, spec: ClusterSpec) -> list[str]:
    """One experiment per simulated job: its training series and its nodes' GPUs, with the
    commit of the metricvault checkout that simulated it (when it runs from one)."""
    ids = []
    git = _simulator_commit()
    for job in spec.resolved_jobs():
        start = spec.start_ms + job.start_offset_s * 1000
        hosts = "|".join(hostname(n) for n in job.nodes)
        fields = {
            "start": start,
            "end": start + job.duration_s * 1000,
            "tags": ("simulated", "demo"),
            "notes": "simulated by metricvault demo (metricvault.sim), not a measurement",
            "params": {
                "flops_per_token": job.flops_per_token,
                "gpus": len(job.nodes) * spec.gpus_per_node,
                "tokens_per_second_per_gpu": job.tokens_per_second_per_gpu,
                "seed": spec.seed,
            },
            **git,
        }
        selector = f'{{job="{job.name}"}} or {{Hostname=~"{hosts}"}}'
        if job.name in vault.experiments:
            vault.experiments.update(job.name, selector=selector, **fields)
        else:
            vault.experiments.create(job.name, selector, **fields)
        ids.append(job.name)
    return ids


def _simulator_commit() -> dict[str, str]:
    """The git commit of the code that simulated the data; nothing outside a checkout."""
    from metricvault.errors import ArchiveError
    from metricvault.gitinfo import head, repo_root

    try:
        sha, origin, _ = head(repo_root(Path(__file__).parent))
    except ArchiveError:
        return {}
    return {"git_sha": sha, "git_repo": origin}


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


def _jobs_table(jobs: pd.DataFrame) -> Table:
    table = Table(title="training jobs side by side (metricvault experiment compare)")
    shown = display_table(jobs)
    for col in shown.columns:
        numeric = col != "experiment"
        table.add_column(col, justify="right" if numeric else "left", no_wrap=not numeric)
    for row in shown.itertuples(index=False):
        table.add_row(*row)
    return table
