"""Importing a long-shape CSV or Parquet file, streamed in batches so memory stays bounded.

``metricvault import`` used to read the whole file, then normalize it whole (a 200 MB CSV
peaked at 1.1 GB). Here the CSV is read block by block (``pyarrow.csv.open_csv``) and Parquet
row group by row group, and every batch is written (durably) before the next is read; the
vault's flusher turns the buffer into Parquet files as it fills. A ``timestamp`` column may mix
epoch milliseconds and ISO times (with or without a zone; none means UTC) in one file.

Bad input changes nothing: a first pass parses and validates every batch (names, values,
times, the raw horizon) without writing, so a bad row near the end of a large file is refused
before the first sample is stored. Parsing is cheap next to writing (the pass costs ~30 % of
the import's time), and it is the only way to be all-or-nothing without holding the file.

The CSV is read through a memory map: with a file object pyarrow's streaming reader keeps
anonymous memory that grows with the file (a 327 MB CSV: 355 MB, vs 84 MB mapped), while mapped
pages are the page cache's to drop.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    checked = _passes(path, lambda table: _validate(vault, table), _halves(progress, 0, size))
    written = _passes(path, vault.write, _halves(progress, size, size))
    assert written == checked, (written, checked)  # the same file, read twice
    return written


def _passes(path: Path, each: Callable[[pa.Table], int], progress: Progress | None) -> int:
    total = 0
    with _open(path) as source:
        batches = (
            _parquet_batches(source) if path.suffix == ".parquet" else _csv_batches(source, path)
        )
        for number, batch in enumerate(batches):
            try:
                total += each(with_epoch_ms(batch))
            except InputError as exc:
                raise type(exc)(f"{path}, batch {number + 1} (after {total:,} rows): "
                                f"{exc.message}; nothing was written") from exc  # fmt: skip
            if progress:
                progress(source.tell(), 0)
    return total


def _validate(vault: Vault, table: pa.Table) -> int:
    """What ``vault.write`` would refuse, without writing (InputError subclasses)."""
    from metricvault.store.normalize import normalize

    batch = normalize(table)
    vault.check_writable(batch.samples)
    return int(batch.samples.num_rows)


def _halves(progress: Progress | None, offset: int, size: int) -> Progress | None:
    """Progress over both passes: the first covers the first half of the bar."""
    if progress is None:
        return None
    return lambda done, _: progress(offset + done, 2 * size)


def _open(path: Path) -> Any:
    import pyarrow as pa

    return pa.memory_map(str(path)) if path.stat().st_size else pa.OSFile(str(path))


def _csv_batches(fh: Any, path: Path) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pacsv

    with path.open("rb") as head:
        header = next(csv.reader([head.readline().decode("utf-8-sig")]), [])
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


def _parquet_batches(fh: Any) -> Iterator[pa.RecordBatch]:
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
