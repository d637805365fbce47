"""Printing and saving results: the one table printer every command uses.

Results travel as Arrow tables (pandas frames are converted), so a command that prints a query
never imports pandas. A table on a terminal is drawn with rich (long text folds, 200 rows);
anywhere else — a pipe, a file — it is plain tab-separated text, every row, every character,
so `metricvault series | grep` and `cut -f2` see whole values. ``-o`` picks the format from the
file's extension, refuses an extension that contradicts ``-f``, and ``-o -`` is stdout.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import IO, Any

from metricvault.errors import InputError, MetricVaultError

FORMATS = ("table", "csv", "tsv", "json", "parquet")
EXTENSIONS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "table",
}
TABLE_ROW_LIMIT = 200


def is_stdout(output: str | Path | None) -> bool:
    return output is None or str(output) == "-"


def resolve_format(fmt: str | None, output: str | Path | None) -> str:
    """The output format: ``-f`` if given, else the extension of ``-o``, else a table."""
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}: use {', '.join(FORMATS)}")
    if is_stdout(output):
        return fmt or "table"
    suffix = Path(str(output)).suffix.lower()
    implied = EXTENSIONS.get(suffix)
    if fmt is None:
        if implied is None:
            raise InputError(
                f"cannot tell the format of {output} from its extension {suffix or '(none)'}; "
                f"name it .csv, .tsv, .json or .parquet, or add -f {'/'.join(FORMATS)}"
            )
        return implied
    if implied is not None and implied != fmt:
        raise InputError(
            f"-f {fmt} contradicts -o {output} (a .{implied} name); drop -f to write "
            f"{implied}, or name the file for {fmt}"
        )
    return fmt


def to_arrow(frame: Any) -> Any:
    """An Arrow table from an Arrow table or a pandas frame."""
    import pyarrow as pa

    if isinstance(frame, pa.Table):
        return frame
    return pa.Table.from_pandas(frame, preserve_index=False)


def emit(frame: Any, fmt: str | None, output: str | Path | None, title: str = "") -> None:
    """Print or save a result (Arrow table or pandas frame) in the requested format."""
    kind = resolve_format(fmt, output)
    table = to_arrow(frame)
    if kind == "parquet":
        _write_parquet(table, output)
    elif kind == "table" and is_stdout(output) and sys.stdout.isatty():
        print_table(list(table.column_names), _rows(table), title, _numeric(table))
    else:
        with _open_text(output) as out:
            _write_text(table, kind, out)
    if not is_stdout(output):
        print(f"wrote {table.num_rows} rows to {output}", file=sys.stderr)


def _write_text(table: Any, kind: str, out: IO[str]) -> None:
    if kind == "json":
        records = [
            {name: _json_value(v) for name, v in zip(table.column_names, row, strict=True)}
            for row in _rows(table)
        ]
        out.write(json.dumps(records, indent=1) + "\n")
    elif kind == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(table.column_names)
        writer.writerows([_plain(v) for v in row] for row in _rows(table))
    else:  # tsv, and a table anywhere but a terminal
        write_tsv(table.column_names, _rows(table), out)


def write_tsv(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: IO[str]) -> None:
    """Tab-separated, full width; tabs and newlines inside values become spaces."""
    out.write("\t".join(columns) + "\n")
    for row in rows:
        out.write("\t".join(_plain(v).replace("\t", " ").replace("\n", " ") for v in row) + "\n")


def print_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    title: str = "",
    numeric: Sequence[bool] | None = None,
    caption: str = "",
) -> None:
    """A rich table on a terminal; tab-separated text, every row, when stdout is not one."""
    if not sys.stdout.isatty():
        write_tsv(columns, rows, sys.stdout)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title or None, show_lines=False, caption=caption or None)
    numeric = numeric or [False] * len(columns)
    for name, is_number in zip(columns, numeric, strict=True):
        # a narrow terminal folds long text (labels, paths) rather than squeezing columns away
        table.add_column(
            str(name),
            justify="right" if is_number else "left",
            no_wrap=is_number,
            overflow="fold",
            min_width=min(len(str(name)), 8),
        )
    for row in rows[:TABLE_ROW_LIMIT]:
        table.add_row(*(Text(_cell(v)) for v in row))  # Text: "[x]" is data, not markup
    if len(rows) > TABLE_ROW_LIMIT:
        table.caption = f"{len(rows) - TABLE_ROW_LIMIT} more rows: pipe the output or use -o FILE"
    Console().print(table)


def print_error(exc: MetricVaultError) -> None:
    from metricvault.redact import redact  # standard library only: the fast path stays light

    print(redact(f"error ({type(exc).__name__}): {exc.message}"), file=sys.stderr)


def _write_parquet(table: Any, output: str | Path | None) -> None:
    import pyarrow.parquet as pq

    if is_stdout(output):
        if sys.stdout.isatty():
            raise InputError("Parquet is binary: write it with -o FILE.parquet (or pipe -o -)")
        sys.stdout.flush()
        pq.write_table(table, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        pq.write_table(table, str(output))


class _open_text:
    """stdout for ``None``/``-`` (left open), else the file (closed afterwards)."""

    def __init__(self, output: str | Path | None) -> None:
        self.output = output
        self.handle: IO[str] = sys.stdout

    def __enter__(self) -> IO[str]:
        if not is_stdout(self.output):
            self.handle = open(str(self.output), "w", newline="")
        return self.handle

    def __exit__(self, *exc: object) -> None:
        if self.handle is not sys.stdout:
            self.handle.close()


def _rows(table: Any) -> list[tuple[Any, ...]]:
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(zip(*columns, strict=True)) if columns else []


def _numeric(table: Any) -> list[bool]:
    import pyarrow as pa

    return [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]


def _cell(value: Any) -> str:
    """A value for a human reading a terminal: short floats, times to the second."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.6g}"
    return _plain(value)


def _plain(value: Any) -> str:
    """A value in full (pipes, CSV, TSV): floats round-trip, times in UTC to the ms."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3].removesuffix(".000")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return value
