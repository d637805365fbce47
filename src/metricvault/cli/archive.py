"""``metricvault archive ...``: frozen, versioned snapshots of an experiment's metrics.

The experiment commands (``metricvault experiment ...``) live in :mod:`metricvault.cli.experiments`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from metricvault.cli.common import (
    ConfigOpt,
    DataOpt,
    FormatOpt,
    OutOpt,
    SetOpt,
    console,
    emit,
    err,
    load_settings,
)
from metricvault.cli.experiments import _when

archive_app = typer.Typer(
    help="Freeze an experiment's metrics as a deterministic Parquet snapshot, version it with "
    "DVC and a git tag, restore it by tag, query it, verify it.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

RepoOpt = Annotated[Path, typer.Option("--repo", help="The git repository holding the snapshots.")]


# --------------------------------------------------------------------------- archive
@archive_app.command("export")
def archive_export(
    experiment_id: Annotated[str, typer.Argument(help="Experiment id.")],
    tier: Annotated[str, typer.Option(help="raw, 1m or 1h.")] = "raw",
    metrics: Annotated[
        list[str] | None,
        typer.Option("--metrics", help="Only these metric names (repeatable or a,b,c)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Directory (or .parquet file); default: setting archive_dir."
        ),
    ] = None,
    use_dvc: Annotated[
        bool, typer.Option("--dvc", help="dvc add + dvc push, git commit and tag.")
    ] = False,
    init: Annotated[bool, typer.Option("--init", help="With --dvc: dvc init if needed.")] = False,
    remote: Annotated[str | None, typer.Option(help="DVC remote (default: the repo's).")] = None,
    remote_url: Annotated[
        str | None,
        typer.Option(help="With --dvc: add this directory or s3:// URL as the default remote."),
    ] = None,
    remote_endpoint: Annotated[
        str | None, typer.Option(help="endpointurl of an S3-compatible --remote-url.")
    ] = None,
    tag: Annotated[
        str | None, typer.Option("--tag", help="Git tag (default metrics/<experiment-id>).")
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option("--repo", help="With --dvc: the git repository (default: the output's)."),
    ] = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Write the experiment's metrics as one deterministic Parquet file (same data, same bytes).

    With --dvc the file is then added to DVC, pushed to the remote, its pointer committed and
    the commit tagged `metrics/<experiment-id>` — run it inside the git repository of the
    paper or project. Example: `metricvault archive export llama-70b-r3 --tier 1m --dvc`
    """
    from metricvault.archive.snapshot_export import export_snapshot

    names = [m.strip() for item in metrics or [] for m in item.split(",") if m.strip()]
    settings = load_settings(data, config, set_)
    out = out or Path(settings.archive_dir)
    remote = remote or settings.archive_dvc_remote or None
    if use_dvc:
        from metricvault.archive.repository import check_ready
        from metricvault.archive.snapshot_format import snapshot_path

        check_ready(
            snapshot_path(out, experiment_id),
            repo,
            init=init,
            remote=remote,
            remote_url=remote_url,
        )
    from metricvault.cli.light import open_with

    with open_with(settings, need="export") as vault:
        exp = vault.experiments.get(experiment_id)
        if exp.end_ms is None:
            err.print(
                f"[yellow]warning[/]: experiment {exp.id} is still running; the snapshot holds "
                f"its data up to now (end it with `metricvault experiment end {exp.id}`)"
            )
        with _progress() as bar:
            task = bar.add_task("exporting", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            info = export_snapshot(
                vault, experiment_id, out, tier=tier, metrics=names, progress=advance
            )
    console.print(
        f"wrote {info.path}: {info.rows:,} rows of {info.series} series ({info.tier}), "
        f"{info.bytes:,} bytes, {info.content_hash}"
    )
    if use_dvc:
        from metricvault.archive.repository import publish

        done = publish(
            info,
            repo,
            tag_prefix=settings.archive_tag_prefix,
            tag=tag,
            remote=remote,
            init=init,
            remote_url=remote_url,
            remote_endpoint=remote_endpoint,
        )
        state = "archived" if done.created else "already archived with identical content"
        console.print(
            f"{state}: tag [bold]{done.tag}[/] -> commit {done.commit[:12]}, pushed to DVC "
            f"remote '{done.remote}' (md5 {done.md5})"
        )


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("series"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )


@archive_app.command("restore")
def archive_restore(
    ref: Annotated[str, typer.Argument(help="EXPERIMENT or EXPERIMENT@TAG.")],
    repo: RepoOpt = Path("."),
    out: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where to write (default: its path).")
    ] = None,
    remote: Annotated[str | None, typer.Option(help="DVC remote to fetch from.")] = None,
    force: Annotated[bool, typer.Option(help="Replace a different file at the target.")] = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Bring a snapshot back from the DVC remote, exactly as its tag recorded it.

    `EXPERIMENT` alone restores the tag `metrics/EXPERIMENT` (setting archive_tag_prefix)."""
    from metricvault.archive.repository import restore

    settings = load_settings(None, config, set_)
    path = restore(
        ref,
        repo,
        out=out,
        remote=remote or settings.archive_dvc_remote or None,
        force=force,
        tag_prefix=settings.archive_tag_prefix,
    )
    console.print(f"restored {path}")


@archive_app.command("open")
def archive_open(
    path: Annotated[Path, typer.Argument(help="A snapshot .parquet file.")],
    selector: Annotated[str | None, typer.Argument(help="PromQL selector to query.")] = None,
    start: Annotated[str | None, typer.Option("--start", "-s")] = None,
    end: Annotated[str | None, typer.Option("--end", "-e")] = None,
    step: Annotated[str | None, typer.Option(help="Bucket width or 'all'.")] = None,
    agg: Annotated[str, typer.Option(help="Aggregates, as for `query`.")] = "mean",
    fmt: FormatOpt = None,
    output: OutOpt = None,
) -> None:
    """Query a snapshot with the same options as `metricvault query` (without a selector:
    describe it and list its series)."""
    from metricvault.archive.opened import SnapshotVault

    with SnapshotVault(path) as snap:
        if selector is None:
            _describe(snap.stats())
            emit(snap.series(), fmt, output, title="series")
            return
        frame = snap.query(selector, start, end, step=step, aggs=agg.split(","))
    emit(frame, fmt, output, title=selector)


def _describe(stats: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    for key, value in stats.items():
        shown = _when(value) if key.endswith("_ms") else value
        table.add_row(key, f"{shown:,}" if isinstance(shown, int) else str(shown))
    console.print(table)


@archive_app.command("verify")
def archive_verify(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Snapshot files (default: all in the repo).")
    ] = None,
    repo: RepoOpt = Path("."),
) -> None:
    """Check every snapshot against its `.dvc` md5 and its embedded content hash; exit 1 on
    any mismatch."""
    from metricvault.archive.repository import verify

    results = verify(repo, list(files) if files else None)
    table = Table(title="snapshots verified")
    for col in ("snapshot", "status", "detail"):
        table.add_column(col)
    for r in results:
        colour = "green" if r.status == "ok" else ("yellow" if r.ok else "red")
        table.add_row(os.path.relpath(r.path), f"[{colour}]{r.status}[/]", r.detail)
    console.print(table)
    if not results:
        err.print("no snapshots found (looked for *.parquet.dvc in the repository)")
    if not all(r.ok for r in results):
        sys.exit(1)


@archive_app.command("list")
def archive_list(
    repo: RepoOpt = Path("."),
    remote: Annotated[str | None, typer.Option(help="DVC remote to check.")] = None,
    check_remote: Annotated[
        bool, typer.Option("--check-remote/--no-check-remote", help="Ask the remote.")
    ] = True,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Snapshots in the repository: experiment, tag, size, rows, local and remote status."""
    import pandas as pd

    from metricvault.archive.repository import list_snapshots

    settings = load_settings(None, config, set_)
    remote = remote or settings.archive_dvc_remote or None

    rows = [
        {
            "experiment": s.experiment,
            "tag": ", ".join(s.tags),
            "tier": s.tier,
            "rows": s.rows,
            "bytes": s.bytes,
            "local": "present" if s.present else "absent",
            "remote": {None: "", True: "pushed", False: "NOT PUSHED"}[s.in_remote],
            "pointer": os.path.relpath(s.pointer),
        }
        for s in list_snapshots(
            repo, remote=remote, check_remote=check_remote, tag_prefix=settings.archive_tag_prefix
        )
    ]
    columns = ["experiment", "tag", "tier", "rows", "bytes", "local", "remote", "pointer"]
    if fmt == "table" and output is None:  # the pointer path is for files; a screen lacks room
        columns.remove("pointer")
    emit(pd.DataFrame(rows, columns=columns), fmt, output, title="snapshots")
