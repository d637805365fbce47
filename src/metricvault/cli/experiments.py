"""``metricvault experiment ...``: the experiment registry (which series, when, which commit)
and comparing runs side by side. (``metricvault archive ...`` is :mod:`metricvault.cli.archive`.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from metricvault.cli.common import (
    ConfigOpt,
    DataOpt,
    FormatOpt,
    JsonFlag,
    OutOpt,
    RecordFormatOpt,
    SetOpt,
    console,
    emit,
    err,
    open_vault,
)
from metricvault.durations import ms_to_datetime

if TYPE_CHECKING:
    from metricvault.experiment import Experiment

experiment_app = typer.Typer(
    help="Register experiments (which series, when, which commit) and compare them.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
SelectorOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--selector",
        "-l",
        help="PromQL selector of the experiment's series; repeat to add more (joined by 'or').",
        show_default=False,
    ),
]


def _fields(
    selector: list[str] | None,
    name: str | None,
    start: str | None,
    end: str | None,
    git_repo: str | None,
    git_sha: str | None,
    owner: str | None,
    tag: list[str] | None,
    notes: str | None,
    param: list[str] | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "selector": " or ".join(selector) if selector else None,
        "name": name,
        "start": start,
        "end": end,
        "git_repo": git_repo,
        "git_sha": git_sha,
        "owner": owner,
        "tags": tuple(tag) if tag else None,
        "notes": notes,
        "params": _params(param) if param else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--param {item!r}: write KEY=VALUE, e.g. --param lr=3e-4")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _git_defaults(fields: dict[str, Any], no_git: bool) -> bool | None:
    """Add the current repository's HEAD unless told otherwise or given explicitly; returns
    whether its tree is dirty (None: nothing was added). Said only once the record exists:
    a create that fails has recorded nothing."""
    if no_git or "git_sha" in fields:
        return None
    from metricvault.errors import ArchiveError
    from metricvault.gitinfo import head, repo_root

    try:
        sha, origin, dirty = head(repo_root("."))
    except ArchiveError:
        return None
    fields["git_sha"] = sha
    fields.setdefault("git_repo", origin)
    return dirty


def _say_git_recorded(exp: Experiment, dirty: bool | None) -> None:
    if dirty is None:
        return
    err.print(f"recorded git commit {exp.git_sha[:12]} of the current repository")
    if dirty:
        err.print(
            "[yellow]warning[/]: the working tree has uncommitted changes; the commit alone "
            "does not reproduce this run"
        )


@experiment_app.command("create")
def experiment_create(
    experiment_id: Annotated[str, typer.Argument(help="A slug: letters, digits, . _ -")],
    selector: SelectorOpt = None,
    name: Annotated[str | None, typer.Option(help="Human-readable name.")] = None,
    start: Annotated[str | None, typer.Option(help="Start (ISO, epoch ms, -2d); now.")] = None,
    end: Annotated[str | None, typer.Option(help="End; omit while it runs.")] = None,
    git_repo: Annotated[str | None, typer.Option(help="Repository URL.")] = None,
    git_sha: Annotated[str | None, typer.Option(help="Commit; default: HEAD here.")] = None,
    no_git: Annotated[bool, typer.Option("--no-git", help="Do not record git.")] = False,
    owner: Annotated[str | None, typer.Option(help="Who runs it.")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Tag (repeatable).")] = None,
    notes: Annotated[str | None, typer.Option(help="Free text.")] = None,
    param: Annotated[
        list[str] | None, typer.Option("--param", help="KEY=VALUE (JSON values; repeatable).")
    ] = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Register an experiment: the series it owns (a selector), its time range, its commit.

    Example: `metricvault experiment create llama-70b-r3 -l '{job="llama-70b-r3"}' -l
    'DCGM_FI_DEV_GPU_UTIL{Hostname=~"node0[1-4]"}' --start 2026-03-01T08:00 --param lr=3e-4`

    Without --git-sha the HEAD commit of the git repository you are in is recorded.
    """
    if not selector:
        raise typer.BadParameter("give the experiment's series with --selector/-l")
    fields = _fields(selector, name, start, end, git_repo, git_sha, owner, tag, notes, param)
    dirty = _git_defaults(fields, no_git)
    with open_vault(data, config, set_, create=True) as vault:
        exp = vault.experiments.create(experiment_id, fields.pop("selector"), **fields)
    _say_git_recorded(exp, dirty)
    console.print(f"created experiment [bold]{exp.id}[/]")
    _print_experiment(exp)


@experiment_app.command("update")
def experiment_update(
    experiment_id: Annotated[str, typer.Argument(help="Experiment id.")],
    selector: SelectorOpt = None,
    name: Annotated[str | None, typer.Option()] = None,
    start: Annotated[str | None, typer.Option()] = None,
    end: Annotated[str | None, typer.Option()] = None,
    git_repo: Annotated[str | None, typer.Option()] = None,
    git_sha: Annotated[str | None, typer.Option()] = None,
    owner: Annotated[str | None, typer.Option()] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Replaces the tags.")] = None,
    notes: Annotated[str | None, typer.Option()] = None,
    param: Annotated[
        list[str] | None, typer.Option("--param", help="Replaces the params (KEY=VALUE).")
    ] = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Change fields of an experiment (the id never changes)."""
    from metricvault.experiment import EDITABLE

    fields = _fields(selector, name, start, end, git_repo, git_sha, owner, tag, notes, param)
    if not fields:
        raise typer.BadParameter(f"nothing to update: give one of {', '.join(EDITABLE)}")
    with open_vault(data, config, set_) as vault:
        exp = vault.experiments.update(experiment_id, **fields)
    _print_experiment(exp)


@experiment_app.command("end")
def experiment_end(
    experiment_id: Annotated[str, typer.Argument(help="Experiment id.")],
    at: Annotated[str, typer.Option(help="When it ended.")] = "now",
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Mark an experiment finished (now, or --at TIME)."""
    with open_vault(data, config, set_) as vault:
        exp = vault.experiments.end(experiment_id, at)
    console.print(f"experiment {exp.id} ended at {_when(exp.end_ms)}")


@experiment_app.command("show")
def experiment_show(
    experiment_id: Annotated[str, typer.Argument(help="Experiment id.")],
    fmt: RecordFormatOpt = None,
    as_json: JsonFlag = False,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Show one experiment's record (-f json: the JSON record)."""
    fmt = "json" if as_json else fmt
    if fmt not in (None, "table", "json"):
        # one record, not a table of rows: `experiment list -f csv` gives the rows as CSV
        from metricvault.errors import InputError

        raise InputError(
            f"experiment show prints -f table or -f json, not {fmt!r} (for CSV/TSV/Parquet "
            "rows use `metricvault experiment list -f csv`)"
        )
    with open_vault(data, config, set_) as vault:
        exp = vault.experiments.get(experiment_id)
    if fmt == "json":
        print(json.dumps(exp.to_record(), indent=2))
    else:
        _print_experiment(exp)


@experiment_app.command("list")
def experiment_list(
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="Only runs with this tag (repeatable: all).")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="Only runs with this KEY=VALUE param (repeatable: all)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only runs started at or after this (ISO, -30d).")
    ] = None,
    fmt: FormatOpt = None,
    output: OutOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """All experiments, by start time, or those matching every filter given.

    Example: `metricvault experiment list --tag paper --param lr=3e-4 --since 2026-03-01`
    """
    import pandas as pd

    from metricvault.experiment import select

    wanted = dict(item.partition("=")[::2] for item in param or [])
    if any("=" not in item for item in param or []):
        raise typer.BadParameter("--param filters are KEY=VALUE, e.g. --param lr=3e-4")
    with open_vault(data, config, set_) as vault:
        chosen = select(vault.experiments.list(), tags=tag or (), params=wanted, since=since)
        rows = [_row(e) for e in chosen]
    columns = ["id", "name", "start", "end", "hours", "owner", "git_sha", "tags", "selector"]
    emit(pd.DataFrame(rows, columns=columns), fmt, output, title="experiments")


def _row(exp: Experiment) -> dict[str, Any]:
    hours = (exp.end_ms - exp.start_ms) / 3_600_000 if exp.end_ms is not None else None
    return {
        "id": exp.id,
        "name": exp.name,
        "start": _when(exp.start_ms),
        "end": _when(exp.end_ms) or "running",
        "hours": hours,
        "owner": exp.owner,
        "git_sha": exp.git_sha[:12],
        "tags": ",".join(exp.tags),
        "selector": exp.selector,
    }


def _print_experiment(exp: Experiment) -> None:
    table = Table(show_header=False, box=None)
    record = exp.to_record()
    for key in ("id", "name", "selector", "start", "end", "git_repo", "git_sha", "owner"):
        table.add_row(key, str(record[key] or ("running" if key == "end" else "")))
    table.add_row("tags", ", ".join(exp.tags))
    table.add_row("params", json.dumps(dict(exp.params), sort_keys=True))
    table.add_row("notes", exp.notes)
    console.print(table)


def _when(ms: int | None) -> str:
    return ms_to_datetime(ms).strftime("%Y-%m-%d %H:%M:%S") if ms is not None else ""


@experiment_app.command("compare")
def experiment_compare(
    experiment_ids: Annotated[list[str], typer.Argument(help="Two or more experiment ids.")],
    plot: Annotated[
        Path | None, typer.Option(help="Also write curves to this .png or .html file.")
    ] = None,
    metric: Annotated[
        list[str] | None, typer.Option("--metric", "-m", help="Metric to plot (repeatable).")
    ] = None,
    align: Annotated[str, typer.Option(help="Align curves by elapsed, step or time.")] = (
        "elapsed"
    ),
    step: Annotated[
        str,
        typer.Option(
            help="Curve resolution for --align elapsed/time: auto (raw samples for short runs), "
            "raw, or a bucket width (1m, 1h). --align step always joins raw samples by step."
        ),
    ] = "auto",
    fmt: FormatOpt = None,
    output: OutOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Side by side: duration, GPUs, GPU-hours, mean/max GPU utilisation, mean MFU, energy
    (kWh, from the DCGM energy counter) and final loss; then the GPUs each run was given,
    its commit and its params, rows that differ marked ≠ (csv/json: `param.<key>` columns).

    Example: `metricvault experiment compare llama-70b-r3 llama-70b-r4 --plot cmp.png -m mfu
    -m train_loss --align step`
    """
    from metricvault.archive.compare import compare
    from metricvault.archive.compare import plot as draw

    with open_vault(data, config, set_) as vault:
        frame = compare(vault, experiment_ids)
        if plot is not None:
            written = draw(
                vault,
                experiment_ids,
                metric or ["mfu", "train_loss"],
                plot,
                align=align,
                step=step,
            )
            err.print(f"wrote {written}")
        details = _run_details(vault, experiment_ids, frame)
    if fmt in (None, "table") and output is None:  # for people: formatted, then the details
        from metricvault.archive.compare import display_table

        emit(display_table(frame), fmt, output, title="experiments compared")
        if sys.stdout.isatty():
            console.print(_details_table(details, experiment_ids))
        else:  # plain TSV like the summary; a blank line lets a reader split the two tables
            print(flush=True)
            emit(_marked(details, experiment_ids), fmt, output)
    else:
        emit(frame, fmt, output, title="experiments compared")


def _marked(details: Any, ids: list[str]) -> Any:
    """The details as plain text rows, a leading ≠ where the runs differ."""
    import pandas as pd

    marks = ["≠" if d else "" for d in details["differs"]]
    return pd.DataFrame(
        {"": marks, "field / param": details["param"], **{i: details[i] for i in ids}}
    )


def _run_details(vault: Any, ids: list[str], frame: Any) -> Any:
    """What each run was given (GPUs, commit, window) and its params, one row per field."""
    import pandas as pd

    from metricvault.archive.compare import experiment_of, params_table

    exps = [experiment_of(vault, i) for i in ids]
    fields = {
        "gpu_model": list(frame["gpu_model"]),
        "gpu_list": list(frame["gpu_list"]),
        "git_sha": [e.git_sha[:12] for e in exps],
        "start": [_when(e.start_ms) for e in exps],
        "end": [_when(e.end_ms) or "running" for e in exps],
    }
    rows = [
        {"param": k, **dict(zip(ids, v, strict=True)), "differs": len(set(v)) > 1}
        for k, v in fields.items()
    ]
    return pd.concat([pd.DataFrame(rows), params_table(vault, ids)], ignore_index=True)


def _details_table(details: Any, ids: list[str]) -> Table:
    table = Table(title="runs side by side (differing rows marked)")
    table.add_column("")
    table.add_column("field / param")
    for exp_id in ids:
        table.add_column(exp_id, overflow="fold")
    for row in details.to_dict("records"):
        style = "bold yellow" if row["differs"] else None
        cells = [str(row[i]) for i in ids]
        table.add_row("≠" if row["differs"] else "", row["param"], *cells, style=style)
    return table
