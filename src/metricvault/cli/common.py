"""What every typer command shares: the vault/config/--set options, opening a vault, printing.

The work itself lives in light modules (:mod:`metricvault.cli.light`,
:mod:`metricvault.cli.output`) that the fast path for hot commands uses without typer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from metricvault.cli.light import load_settings, open_vault
from metricvault.cli.output import emit, print_table

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
    str | None,
    typer.Option(
        "--format",
        "-f",
        help="Output: table, csv, tsv, json or parquet. Default: from the -o file's extension, "
        "else a table (plain tab-separated text when stdout is not a terminal).",
        show_default=False,
    ),
]
# commands whose answer is one record (stats, experiment show): a table, or -f json / --json
RecordFormatOpt = Annotated[
    str | None,
    typer.Option("--format", "-f", help="Output: table or json.", show_default=False),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Same as -f json.")]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Write the result to this file (.csv, .tsv, .json, .parquet); '-' is stdout.",
        show_default=False,
    ),
]

__all__ = [
    "ConfigOpt",
    "DataOpt",
    "FormatOpt",
    "JsonFlag",
    "OutOpt",
    "RecordFormatOpt",
    "SetOpt",
    "console",
    "emit",
    "err",
    "load_settings",
    "open_vault",
    "print_table",
]
