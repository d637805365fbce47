"""``metricvault cost``: GPU-hours, idle GPU-hours and kWh per team, experiment, namespace or
label over a period (``metricvault.cost``), as a table, CSV, JSON or Parquet."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from metricvault.cli.common import (
    ConfigOpt,
    DataOpt,
    FormatOpt,
    OutOpt,
    SetOpt,
    emit,
    load_settings,
)


def cost(
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="Group by team, experiment, namespace or any label of the GPU series.",
        ),
    ] = "team",
    start: Annotated[
        str, typer.Option("--start", "-s", help="Period start (ISO, epoch ms, -90d).")
    ] = "-90d",
    end: Annotated[str, typer.Option("--end", "-e", help="Period end (exclusive).")] = "now",
    idle_below: Annotated[
        float, typer.Option(help="An hour whose mean GPU utilisation is below this % is idle.")
    ] = 5.0,
    team_label: Annotated[
        str,
        typer.Option(
            help="--by team: the series label naming the team (else the experiment's owner)."
        ),
    ] = "team",
    fmt: FormatOpt = None,
    output: OutOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """GPU-hours, idle GPU-hours, mean utilisation and energy (kWh) per group over a period,
    from the 1h rollup tier (docs/cost.md).

    Both ends move down to whole UTC hours. Example: `metricvault cost --by team --start
    2026-07-01 --end 2026-10-01 -o q3.csv`
    """
    from metricvault.cost import cost_report
    from metricvault.durations import parse_time_ms
    from metricvault.open import open as open_store

    settings = load_settings(data, config, set_)
    start_ms, end_ms = parse_time_ms(start), parse_time_ms(end)
    with open_store(settings.data, settings, need="read") as vault:
        report = cost_report(
            vault, start_ms, end_ms, by, idle_below=idle_below, team_label=team_label
        )
    for note in report.warnings:
        print(f"warning: {note}", file=sys.stderr)
    period = f"{_utc(report.start_ms)} .. {_utc(report.end_ms)} UTC"
    emit(report.table, fmt, output, title=f"cost by {by}, {period} ({'+'.join(report.tiers)})")


def _utc(ms: int) -> str:
    from metricvault.durations import ms_to_datetime

    return f"{ms_to_datetime(ms):%Y-%m-%d %H:%M}"
