"""``metricvault influx ...``: manage an InfluxDB 1.x database used as metricvault's store."""

from __future__ import annotations

from typing import Annotated

import typer

from metricvault.cli.common import ConfigOpt, SetOpt, err, load_settings

influx_app = typer.Typer(
    help="Use InfluxDB 1.x as the store: create its database, retention policies and "
    "continuous query.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@influx_app.callback()
def influx() -> None:
    """Use InfluxDB 1.x as the store (`influxdb://` URIs wherever a vault is opened)."""


@influx_app.command()
def setup(
    url: Annotated[
        str,
        typer.Option(
            "--url",
            help="influxdb://[user:pass@]HOST:PORT/DB (influxdbs:// for TLS); credentials may "
            "also come from METRICVAULT_INFLUX_USER / METRICVAULT_INFLUX_PASSWORD.",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the InfluxQL for a new database; run nothing.")
    ] = False,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Create the database, the retention policies (raw as DEFAULT, 1-minute long-term, and
    metricvault's metadata) and the continuous query that rolls every measurement up to
    1-minute mean/min/max/count/last, keeping all tags. Idempotent: prints what it runs.

    Names and durations follow the tier settings: `rp_raw_<retention_raw>` (rp_raw_30d) and
    `rp_longterm_<retention_1m>` (rp_longterm_3y)."""
    from metricvault.store.backends.influxdb import setup as run_setup

    settings = load_settings(None, config, set_)
    ran = run_setup(url, settings, dry_run=dry_run, echo=lambda s: typer.echo(f"{s};"))
    if dry_run:
        err.print("dry run: nothing was sent to InfluxDB")
    elif not ran:
        err.print("already set up: nothing to change")
    else:
        err.print(f"ran {len(ran)} statement(s)")
