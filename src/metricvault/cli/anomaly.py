"""``metricvault anomaly ...``: score files with the streaming anomaly detectors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

anomaly_app = typer.Typer(
    help="Anomaly detection: score a timestamp,value CSV with a streaming detector.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@anomaly_app.callback()
def anomaly() -> None:
    """Streaming anomaly detectors (docs/anomaly.md)."""


@anomaly_app.command()
def score(
    source: Annotated[Path, typer.Argument(help="CSV with the header timestamp,value.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="CSV to write.")],
    detector: Annotated[
        str,
        typer.Option(
            "--detector",
            help="range (the default), novelty, gaussian, gaussian-rolling, quantile, mad, "
            "history, random (docs/anomaly.md).",
        ),
    ] = "",
) -> None:
    """Write INPUT's rows plus `anomaly_score` (0..1) and `is_anomaly` (0/1) to OUT, scoring
    row by row: no row's score depends on a later row."""
    from metricvault.analysis.detectors import DEFAULT_DETECTOR
    from metricvault.analysis.score_csv import score_csv
    from metricvault.errors import InputError

    if not source.is_file():
        raise InputError(f"{source}: no such file")
    rows = score_csv(source, output, detector or DEFAULT_DETECTOR)
    typer.echo(f"scored {rows} rows with {detector or DEFAULT_DETECTOR} -> {output}", err=True)
