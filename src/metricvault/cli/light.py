"""The hot commands (``query``, ``series``, ``stats``, ``--version``) without typer and rich.

typer (with pydantic) and rich cost ~0.2 s of imports before a command does anything, more
than the command itself. :func:`dispatch` parses these commands with argparse and runs them
directly; the typer commands in :mod:`metricvault.cli.main` call the same functions, so the two
entry points behave alike (a unit test holds their options equal). Anything else — ``--help``,
a parse error, another command — falls through to typer, which prints the manual and the
usual errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metricvault.cli.output import emit, print_error, print_table
from metricvault.errors import ConfigError, MetricVaultError

if TYPE_CHECKING:
    from metricvault.config import Settings

HOT_COMMANDS = ("query", "series", "stats")
FULL_CLI_ENV = "_METRICVAULT_FULL_CLI"  # set when a hot command reruns through typer


def load_settings(
    data: str | None, config: Path | str | None, overrides: list[str] | None = None
) -> Settings:
    from metricvault.config import Settings

    flags: dict[str, Any] = {}
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--set {item!r}: write NAME=VALUE, e.g. --set retention_raw=90d")
        flags[name.strip()] = value.strip()
    return Settings.load(config_file=config, data=data, **flags)


def open_vault(
    data: str | None,
    config: Path | str | None,
    overrides: list[str] | None,
    create: bool = False,
    need: str = "read",
) -> Any:
    """Open the vault for what the command ``need``s (a capability of
    :mod:`metricvault.protocols`: a snapshot cannot be written, a gateway URL not read), so a
    store that cannot do it is refused with a clear error before any work; commands that only
    read refuse to create an empty one by mistake."""
    return open_with(load_settings(data, config, overrides), need, create=create)


def open_with(settings: Settings, need: str = "read", create: bool = False) -> Any:
    """:func:`open_vault` for commands that have loaded their settings already."""
    from metricvault.open import open as open_store

    return open_store(settings.data, settings, need=need, create=create)  # type: ignore[call-overload]


def run_query(
    selector: str,
    start: str,
    end: str,
    step: str | None,
    agg: str,
    fmt: str | None,
    output: str | Path | None,
    data: str | None,
    config: Path | str | None,
    set_: list[str] | None,
) -> None:
    from metricvault.cli.output import resolve_format, to_arrow

    kind = resolve_format(fmt, output)  # a bad -o/-f is refused before any work
    with open_vault(data, config, set_) as vault:
        table = vault.query(selector, start, end, step=step, aggs=agg.split(","), output="arrow")
        empty = table.num_rows == 0 and _explain_empty(vault, selector)
    if empty:
        print(empty, file=sys.stderr)
        if kind == "table" and output is None:
            return  # say so instead of drawing an empty table
    emit(to_arrow(table), kind, output, title=selector)


def _explain_empty(vault: Any, selector: str) -> str:
    from metricvault.selector import parse_selectors
    from metricvault.store.query import explain_empty

    index = getattr(vault, "index", None)
    if index is None:  # backends without an in-memory series index (InfluxDB)
        return f"no samples match {selector} in the range"
    ids = index.match(parse_selectors(selector))
    return explain_empty(index, selector, ids, vault.catalog_version())


def run_series(
    selector: str | None,
    fmt: str | None,
    output: str | Path | None,
    data: str | None,
    config: Path | str | None,
    set_: list[str] | None,
) -> None:
    from metricvault.cli.output import resolve_format

    resolve_format(fmt, output)
    with open_vault(data, config, set_) as vault:
        table = vault.series(selector, output="arrow")
        empty = table.num_rows == 0 and selector and _explain_empty(vault, selector)
    if empty:
        print(empty, file=sys.stderr)
    emit(table, fmt, output, title="series")


def run_stats(
    fmt: str | None, data: str | None, config: Path | str | None, set_: list[str] | None
) -> None:
    if fmt not in (None, "table", "json"):
        raise ConfigError(f"stats prints -f table or -f json, not {fmt!r}")
    with open_vault(data, config, set_) as vault:
        info = vault.stats()
    if fmt == "json":
        print(json.dumps(info, indent=2))
    else:
        print_stats(info)


def print_stats(info: dict[str, Any]) -> None:
    columns = ["tier", "files", "rows", "bytes", "bytes/row", "first", "last"]
    rows = [
        [
            tier,
            _count(t.get("files")),
            _count(t.get("rows")),
            _count(t.get("bytes")),
            f"{t['bytes_per_row']}" if t["bytes_per_row"] is not None else "",
            _when(t["first"]),
            _when(t["last"]),
        ]
        for tier, t in info["tiers"].items()
    ]
    title = f"{info['uri']}  ·  {info['series']} series  ·  catalog version {info['snapshot']}"
    if sys.stdout.isatty():
        print_table(columns, rows, title, [c not in ("tier", "first", "last") for c in columns])
    else:
        print(f"# {title}")
        print_table(columns, rows)
    lag = info["rollup"]
    state = (
        "up to date"
        if not lag["pending_hours"]
        else (
            f"{lag['pending_hours']} hour(s) pending, complete until {_when(lag['complete_until'])}"
        )
    )
    print(f"rollups: {state}")
    print(f"ingest buffer: {info['buffer']['samples']:,} samples waiting")
    if info["buffer"].get("quarantined_batches"):
        print(
            f"{info['buffer']['quarantined_batches']} corrupt buffer batch(es) moved to "
            "state/quarantine/ (docs/operations.md)"
        )


def _count(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _when(ms: int | None) -> str:
    from metricvault.durations import ms_to_datetime

    return ms_to_datetime(ms).strftime("%Y-%m-%d %H:%M:%S") if ms is not None else ""


# --------------------------------------------------------------------------- the fast path
class _Fallback(Exception):
    """argparse could not parse the line: let typer parse it and explain."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Fallback(message)


@dataclass(frozen=True)
class Opt:
    """One option of a hot command, declared once: :func:`parsers` builds the fast path's
    argparse from it and :mod:`metricvault.cli.main` the typer command (and its manual)."""

    dest: str
    flags: tuple[str, ...] = ()  # none: a positional argument
    help: str = ""
    default: Any = None
    kind: str = "str"  # str, path, list (repeatable) or flag (true when given)
    required: bool = False  # positional arguments only


FORMAT_HELP = (
    "Output: table, csv, tsv, json or parquet. Default: from the -o file's extension, "
    "else a table (plain tab-separated text when stdout is not a terminal)."
)
COMMON_OPTS = (
    Opt("data", ("--data", "-d"), "Vault directory or s3://bucket/prefix."),
    Opt("config", ("--config", "-c"), "TOML settings file.", kind="path"),
    Opt(
        "set_",
        ("--set",),
        "Override a setting for this run: NAME=VALUE (repeatable; see 'metricvault config').",
        kind="list",
    ),
)
FORMAT_OPT = Opt("fmt", ("--format", "-f"), FORMAT_HELP)
OUTPUT_OPT = Opt(
    "output",
    ("--output", "-o"),
    "Write the result to this file (.csv, .tsv, .json, .parquet); '-' is stdout.",
    kind="path",
)
RECORD_FORMAT_OPT = Opt("fmt", ("--format", "-f"), "Output: table or json.")
JSON_OPT = Opt("as_json", ("--json",), "Same as -f json.", default=False, kind="flag")
HOT_OPTS: dict[str, tuple[Opt, ...]] = {
    "query": (
        Opt("selector", help="PromQL selector, e.g. 'mfu{job=\"llama-7b\"}'.", required=True),
        Opt("start", ("--start", "-s"), "ISO time, epoch ms or -30d.", "-1h"),
        Opt("end", ("--end", "-e"), "ISO time, epoch ms, now or -1d.", "now"),
        Opt("step", ("--step",), "Bucket width (1m, 1h, 1d) or 'all'; omit for raw samples."),
        Opt(
            "agg",
            ("--agg",),
            "Aggregates: mean,min,max,count,sum,last,increase,stddev,p50,p90,p95,p99.",
            "mean",
        ),
        FORMAT_OPT,
        OUTPUT_OPT,
    ),
    "series": (Opt("selector", help="Optional PromQL selector."), FORMAT_OPT, OUTPUT_OPT),
    "stats": (RECORD_FORMAT_OPT, JSON_OPT),
}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The hot commands' options from :data:`HOT_OPTS`, as typer's commands take them."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, opts in HOT_OPTS.items():
        parser = _Parser(prog=f"metricvault {name}", add_help=False, allow_abbrev=False)
        for opt in (*opts, *COMMON_OPTS):
            _add_argument(parser, opt)
        out[name] = parser
    return out


def _add_argument(parser: argparse.ArgumentParser, opt: Opt) -> None:
    if not opt.flags:
        parser.add_argument(opt.dest, nargs=None if opt.required else "?", default=opt.default)
    elif opt.kind == "flag":
        parser.add_argument(*opt.flags, dest=opt.dest, action="store_true")
    elif opt.kind == "list":
        parser.add_argument(*opt.flags, dest=opt.dest, action="append")
    else:
        parser.add_argument(*opt.flags, dest=opt.dest, default=opt.default)


def dispatch(argv: list[str]) -> int | None:
    """Run a hot command and return its exit status; None hands ``argv`` to typer."""
    if argv in (["--version"], ["-V"]):
        from metricvault import __version__

        print(f"metricvault {__version__}")
        return 0
    if not argv or argv[0] not in HOT_COMMANDS or {"-h", "--help"} & set(argv[1:]):
        return None
    if os.environ.get(FULL_CLI_ENV):
        return None
    try:
        args = vars(parsers()[argv[0]].parse_args(argv[1:]))
    except _Fallback:
        return None
    # pyarrow imports pandas (~0.15 s) the first time pa.array() sees a Python list, only to
    # ask whether the list is a pandas object; these commands never need pandas, so pyarrow is
    # told it is absent. Should a code path need it after all, the command starts again
    # through typer with pandas importable (these commands only read, so a rerun is safe).
    sys.meta_path.insert(0, _NoPandas())
    try:
        run_hot(argv[0], args)
    except ImportError as exc:
        if exc.name != "pandas":
            raise
        os.environ[FULL_CLI_ENV] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "metricvault.cli", *argv])
    except MetricVaultError as exc:
        print_error(exc)
        return 2
    except BrokenPipeError:  # `metricvault series | head`
        sys.stderr.close()
        return 0
    return 0


class _NoPandas:
    """A meta-path finder that makes ``import pandas`` fail (see :func:`dispatch`)."""

    def find_spec(self, name: str, *args: object) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by this command", name="pandas")


def run_hot(command: str, args: dict[str, Any]) -> None:
    """Run a hot command with its parsed options (the fast path's and typer's alike)."""
    common = {k: args.pop(k) for k in ("data", "config", "set_")}
    if command == "query":
        run_query(**args, **common)
    elif command == "series":
        run_series(**args, **common)
    else:
        fmt = "json" if args["as_json"] else args["fmt"]
        run_stats(fmt, **common)
