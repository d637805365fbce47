"""What every typer command shares: the vault/config/--set options, opening a vault, printing.

The work itself lives in light modules (:mod:`metricvault.cli.light`,
:mod:`metricvault.cli.output`) that the fast path for hot commands uses without typer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from metricvault.cli.light import (
    COMMON_OPTS,
    FORMAT_OPT,
    JSON_OPT,
    OUTPUT_OPT,
    RECORD_FORMAT_OPT,
    Opt,
    load_settings,
    open_vault,
)
from metricvault.cli.output import emit, print_table

console = Console()
err = Console(stderr=True)


def typer_annotation(opt: Opt) -> Any:
    """The typer parameter type of a declared option (cli/light.py owns the declarations)."""
    hint: Any = {"path": Path | None, "list": list[str] | None, "flag": bool}.get(opt.kind)
    if hint is None:
        hint = str if opt.required else str | None
    if not opt.flags:
        return Annotated[hint, typer.Argument(help=opt.help, show_default=False)]
    show = opt.default not in (None, False)
    return Annotated[hint, typer.Option(*opt.flags, help=opt.help, show_default=show)]


DataOpt, ConfigOpt, SetOpt = (typer_annotation(o) for o in COMMON_OPTS)
FormatOpt = typer_annotation(FORMAT_OPT)
# commands whose answer is one record (stats, experiment show): a table, or -f json / --json
RecordFormatOpt = typer_annotation(RECORD_FORMAT_OPT)
JsonFlag = typer_annotation(JSON_OPT)
OutOpt = typer_annotation(OUTPUT_OPT)

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
