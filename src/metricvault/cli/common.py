"""What every command shares: the vault/config/--set options, opening a vault, printing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from metricvault.config import Settings

if TYPE_CHECKING:  # imported where used: `metricvault agent` must stay light (no pandas/pyarrow)
    import pandas as pd

    from metricvault.store.vault import Vault

console = Console()
err = Console(stderr=True)

DataOpt = Annotated[
    str | None,
    typer.Option("--data", "-d", help="Vault directory or s3://bucket/prefix.", show_default=False),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML settings file.", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a setting for this run: NAME=VALUE (repeatable; see 'metricvault config').",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="Output: table, csv, json or parquet (needs -o).")
]
OutOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the result to this file.")
]


def load_settings(
    data: str | None, config: Path | None, overrides: list[str] | None = None
) -> Settings:
    flags: dict[str, Any] = {}
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(
                f"--set {item!r}: write NAME=VALUE, e.g. --set retention_raw=90d"
            )
        flags[name.strip()] = value.strip()
    return Settings.load(config_file=config, data=data, **flags)


def open_vault(
    data: str | None, config: Path | None, overrides: list[str] | None, create: bool = False
) -> Vault:
    """Open the vault; commands that only read refuse to create an empty one by mistake."""
    from metricvault.store.vault import Vault

    settings = load_settings(data, config, overrides)
    return Vault.open(settings.data, settings, create=create)


def emit(frame: pd.DataFrame, fmt: str, output: Path | None, title: str = "") -> None:
    """Print or save a result frame in the requested format."""
    if fmt == "parquet":
        if output is None:
            raise typer.BadParameter("--format parquet needs --output FILE")
        frame.to_parquet(output, index=False)
    elif fmt == "csv":
        text = frame.to_csv(index=False)
        output.write_text(text) if output else sys.stdout.write(text)
    elif fmt == "json":
        text = frame.to_json(orient="records", date_format="iso", indent=1)
        output.write_text(text) if output else sys.stdout.write(text + "\n")
    elif fmt == "table":
        if output:
            output.write_text(frame.to_string(index=False))
        else:
            console.print(_rich_table(frame, title))
    else:
        raise typer.BadParameter(f"unknown format {fmt!r}: use table, csv, json or parquet")
    if output:
        err.print(f"wrote {len(frame)} rows to {output}")


def _rich_table(frame: pd.DataFrame, title: str, limit: int = 200) -> Table:
    table = Table(title=title or None, show_lines=False)
    for col in frame.columns:
        numeric = frame[col].dtype.kind in "fiu"
        # a narrow terminal folds long text (labels, paths) rather than squeezing columns away
        table.add_column(
            str(col),
            justify="right" if numeric else "left",
            no_wrap=numeric,
            overflow="fold",
            min_width=min(len(str(col)), 8),
        )
    for row in frame.head(limit).itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    if len(frame) > limit:
        table.caption = f"{len(frame) - limit} more rows: use --format csv or -o FILE"
    return table


def _cell(value: Any) -> str:
    import pandas as pd

    if value is None or (isinstance(value, float) and value != value) or value is pd.NaT:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3].removesuffix(".000")
    return str(value)
