"""``metricvault baseline ...``: learn what normal looks like from the rollup history, store it
as ``metricvault_baseline`` series, and export it as Prometheus rules (docs/anomaly.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from metricvault.cli.common import ConfigOpt, DataOpt, SetOpt, console

baseline_app = typer.Typer(
    help="Baselines (mean, sigma, P50/P95/P99, median/MAD, seasonal profile) from the rollups.",
    invoke_without_command=True,
    rich_markup_mode="markdown",
)

NowOpt = Annotated[
    str | None, typer.Option("--now", help="Compute as of this time (default: now).")
]


@baseline_app.callback()
def baseline(
    ctx: typer.Context,
    selector: Annotated[
        list[str] | None,
        typer.Option(
            "--selector",
            "-s",
            help="Series to baseline (repeatable); default: the `baselines` setting.",
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(help="Group by these labels (comma-separated); default: per series."),
    ] = None,
    window: Annotated[str, typer.Option(help="Training window before now.")] = "28d",
    min_history: Annotated[
        str, typer.Option(help="Fewer hours of data than this: not trusted, not stored.")
    ] = "7d",
    warmup: Annotated[
        str, typer.Option(help="Left out after a series starts or resumes after a gap.")
    ] = "1h",
    dry_run: Annotated[bool, typer.Option(help="Show the baselines; store nothing.")] = False,
    now: NowOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Compute baselines over the training window from the 1h rollup rows and store them as
    `metricvault_baseline{<labels>, source_metric, stat}` series (a table of what was learned
    is printed). Subcommand `export-rules` writes them as Prometheus rules."""
    if ctx.invoked_subcommand is not None:
        return
    from metricvault.analysis.baselines import BaselineSpec, compute_baselines, store_baselines
    from metricvault.cli.light import load_settings, open_with
    from metricvault.durations import now_ms, parse_time_ms

    settings = load_settings(data, config, set_)
    groups = tuple(x.strip() for x in (by or "").split(",") if x.strip())
    if selector:
        specs = [BaselineSpec(s, groups, window, min_history, warmup) for s in selector]
    else:
        specs = [BaselineSpec.parse(entry) for entry in settings.baselines]
    if not specs:
        console.print("nothing to baseline: give --selector, or set `baselines`")
        raise typer.Exit(2)
    at = parse_time_ms(now) if now else now_ms()
    with open_with(settings, need="maintain") as vault:
        found = [b for spec in specs for b in compute_baselines(vault, spec, at)]
        stored = 0 if dry_run else store_baselines(vault, found, at)
    _print(found)
    trusted = sum(b.trusted for b in found)
    console.print(
        f"{len(found)} baseline(s), {trusted} trusted"
        + ("" if dry_run else f"; stored {stored} samples of metricvault_baseline")
    )


def _print(found: list[Any]) -> None:
    from rich.table import Table

    table = Table("source_metric", "labels", "hours", "mean", "stddev", "p99", "mad", "seasonal")
    for b in found:
        s = b.stats
        labels = ",".join(f"{k}={v}" for k, v in sorted(b.labels.items()))
        hours = f"{b.history_hours}" + ("" if b.trusted else " (untrusted)")
        season = "yes" if b.seasonality and b.seasonality.seasonal else "no"
        table.add_row(
            b.source_metric,
            labels,
            hours,
            *(f"{s.get(k, float('nan')):.6g}" for k in ("mean", "stddev", "p99", "mad")),
            season,
        )
    console.print(table)


@baseline_app.command("export-rules")
def export_rules(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Rule file to write (default: stdout).")
    ] = None,
    stat: Annotated[
        str, typer.Option(help="Thresholds to alert on, comma-separated (p99, p95, mean...).")
    ] = "p99",
    for_: Annotated[str, typer.Option("--for", help="The alerts' `for` duration.")] = "5m",
    now: NowOpt = None,
    data: DataOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Prometheus recording rules setting the stored thresholds and alerting rules against
    them (`promtool check rules` passes), for a Prometheus that keeps less than the window."""
    from metricvault.analysis.baseline_rules import baseline_rule_groups, rules_yaml
    from metricvault.cli.light import load_settings, open_with
    from metricvault.durations import now_ms, parse_time_ms

    settings = load_settings(data, config, set_)
    at = parse_time_ms(now) if now else now_ms()
    stats = [s.strip() for s in stat.split(",") if s.strip()]
    with open_with(settings, need="maintain") as vault:
        text = rules_yaml(baseline_rule_groups(vault, at, stats, for_))
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    console.print(f"wrote {output}")
