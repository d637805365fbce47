"""Importing a long-shape CSV or Parquet file, streamed in batches so memory stays bounded.

``metricvault import`` used to read the whole file, then normalize it whole (a 200 MB CSV
peaked at 1.1 GB). Here the CSV is read block by block (``pyarrow.csv.open_csv``) and Parquet
row group by row group, and every batch is written (durably) before the next is read; the
vault's flusher turns the buffer into Parquet files as it fills. A ``timestamp`` column may mix
epoch milliseconds and ISO times (with or without a zone; none means UTC) in one file.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from metricvault.errors import InputError, NotFoundError

if TYPE_CHECKING:
    from metricvault.store.vault import Vault

TIME_COLUMNS = ("timestamp", "ts")
CSV_BLOCK_BYTES = 8 * 1024 * 1024  # ~200 k rows of a typical long-shape CSV per batch
Progress = Callable[[int, int], None]  # (bytes read, file size)


def import_file(vault: Vault, path: str | Path, progress: Progress | None = None) -> int:
    """Write every row of ``path`` (``.parquet``, else CSV) into ``vault``; returns samples."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"{path} does not exist (give a long-shape CSV or Parquet file)")
    size = path.stat().st_size
    total = 0
    with path.open("rb") as fh:
        batches = _parquet_batches(fh) if path.suffix == ".parquet" else _csv_batches(fh, path)
        for number, batch in enumerate(batches):
            try:
                total += vault.write(with_epoch_ms(batch))
            except InputError as exc:
                raise type(exc)(f"{path}, batch {number + 1} (after {total:,} rows): "
                                f"{exc.message}") from exc  # fmt: skip
            if progress:
                progress(fh.tell(), size)
    return total


def _csv_batches(fh: BinaryIO, path: Path) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pacsv

    header = next(csv.reader([fh.readline().decode("utf-8-sig")]), [])
    fh.seek(0)
    if not header:
        raise InputError(f"{path} is empty: a CSV needs a header (metric,timestamp,value,...)")
    # labels and times stay text (a label "007" is not the number 7; times may be mixed)
    types = {c: pa.string() for c in header if c != "value"}
    types["value"] = pa.float64()
    try:
        reader = pacsv.open_csv(
            fh,
            read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES, use_threads=True),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
        yield from reader
    except pa.ArrowInvalid as exc:
        raise InputError(f"{path} is not a readable long-shape CSV: {exc}") from exc


def _parquet_batches(fh: BinaryIO) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    yield from pq.ParquetFile(fh).iter_batches(batch_size=200_000)


def with_epoch_ms(batch: pa.RecordBatch) -> pa.Table:
    """The batch with its text time column as int64 epoch ms (other types pass through)."""
    table = pa.Table.from_batches([batch])
    name = next((c for c in TIME_COLUMNS if c in table.column_names), None)
    if name is None or not pa.types.is_string(table.schema.field(name).type):
        return table
    i = table.column_names.index(name)
    return table.set_column(i, name, parse_times(table[name].combine_chunks()))


def parse_times(text: pa.Array) -> pa.Array:
    """Epoch ms, ISO times with a zone, and zone-less ISO times (UTC) -> int64 epoch ms."""
    text = pc.utf8_trim_whitespace(text)
    numeric = pc.match_substring_regex(text, r"^-?\d+$")
    zoned = pc.match_substring_regex(text, r"(Z|[+-]\d\d:?\d\d)$")
    iso_zoned = pc.and_(pc.invert(numeric), zoned)
    iso_plain = pc.and_(pc.invert(numeric), pc.invert(zoned))
    parts = [
        pc.cast(_only(text, numeric), pa.int64()),
        _iso_ms(_only(text, iso_zoned), pa.timestamp("ms", tz="UTC")),
        _iso_ms(_only(text, iso_plain), pa.timestamp("ms")),
    ]
    return pc.coalesce(*parts)


def _only(text: pa.Array, mask: pa.Array) -> pa.Array:
    return pc.if_else(mask, text, pa.scalar(None, pa.string()))


def _iso_ms(text: pa.Array, kind: pa.DataType) -> pa.Array:
    try:
        return pc.cast(pc.cast(text, kind), pa.int64())
    except pa.ArrowInvalid:
        bad = next(v for v in text.to_pylist() if v is not None and not _parses(v, kind))
        raise InputError(
            f"timestamp {bad!r} is neither epoch milliseconds nor an ISO time "
            "(e.g. 1767225600000, 2026-01-01T00:00:00Z, 2026-01-01 00:00:00)"
        ) from None


def _parses(value: Any, kind: pa.DataType) -> bool:
    try:
        pc.cast(pa.array([value]), kind)
    except pa.ArrowInvalid:
        return False
    return True
