"""The experiment snapshot FORMAT: one deterministic Parquet file per experiment.

What a snapshot file is, independent of how it was made (``snapshot_export`` writes one from a
vault; ``archive.opened`` and ``archive.repository`` read them). The file is the long shape
with the experiment on every row::

    experiment_id, git_sha, series_id, metric, labels (canonical JSON), timestamp,
    value                                       (tier raw)
    count, sum, min, max, last, increase        (tiers 1m / 1h; increase is null for gauges)

Rows are sorted by (metric, labels, timestamp), written in row groups of exactly
``ROW_GROUP_ROWS`` rows with the fixed writer settings of :func:`open_writer` and no
wall-clock anywhere, so the same data gives byte-identical files (DVC then stores it once).
File-level key-value metadata (:func:`file_metadata`, keys under ``META_PREFIX``) carries the
schema version, the experiment record, the tier, the time range, the row count, the
metricvault version, the per-series row ranges (which let readers fetch one series without a
scan) with, for counters in raw snapshots, the last sample before the start (so ``increase``
over the first bucket equals the vault's), and a content hash of the rows that
:func:`content_hash` recomputes from the file alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metricvault.errors import InputError, NotFoundError
from metricvault.experiment import Experiment
from metricvault.model import TIER_RESOLUTION_MS

SCHEMA_VERSION = 1
ROW_GROUP_ROWS = 131_072
TIER_MS = TIER_RESOLUTION_MS  # a snapshot of a rollup tier: its bucket width
META_PREFIX = "metricvault."
ROLLUP_COLUMNS = ("count", "sum", "min", "max", "last", "increase")
_KEY_COLUMNS = [
    pa.field("experiment_id", pa.string(), nullable=False),
    pa.field("git_sha", pa.string(), nullable=False),
    pa.field("series_id", pa.int64(), nullable=False),
    pa.field("metric", pa.string(), nullable=False),
    pa.field("labels", pa.string(), nullable=False),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
]
RAW_SCHEMA = pa.schema([*_KEY_COLUMNS, pa.field("value", pa.float64(), nullable=False)])
ROLLUP_SCHEMA = pa.schema(
    [
        *_KEY_COLUMNS,
        pa.field("count", pa.int64(), nullable=False),
        pa.field("sum", pa.float64(), nullable=False),
        pa.field("min", pa.float64(), nullable=False),
        pa.field("max", pa.float64(), nullable=False),
        pa.field("last", pa.float64(), nullable=False),
        pa.field("increase", pa.float64()),
    ]
)
_DICTIONARY = ["experiment_id", "git_sha", "series_id", "metric", "labels"]
_ENCODING = {
    "timestamp": "DELTA_BINARY_PACKED",
    "count": "DELTA_BINARY_PACKED",
    **{c: "BYTE_STREAM_SPLIT" for c in ("value", "sum", "min", "max", "last", "increase")},
}


def schema_for(tier: str) -> pa.Schema:
    """The schema readers see."""
    return RAW_SCHEMA if tier == "raw" else ROLLUP_SCHEMA


def writer_schema(tier: str) -> pa.Schema:
    """What the writer is fed: the string key columns as dictionaries (bounded memory); the
    file stores plain strings (no Arrow schema is embedded, so readers see ``schema_for``)."""
    schema = schema_for(tier)
    for name in _DICTIONARY:
        if name != "series_id":
            i = schema.get_field_index(name)
            schema = schema.set(
                i, schema.field(i).with_type(pa.dictionary(pa.int32(), pa.string()))
            )
    return schema


def open_writer(path: Path, tier: str) -> pq.ParquetWriter:
    """A Parquet writer with the settings every snapshot is written with: they are part of the
    format, since a change of any of them changes the bytes (and so DVC's md5)."""
    schema = writer_schema(tier)
    return pq.ParquetWriter(
        path,
        schema,
        store_schema=False,
        compression="zstd",
        compression_level=9,
        use_dictionary=_DICTIONARY,
        column_encoding={k: v for k, v in _ENCODING.items() if k in schema.names},
        write_statistics=True,
        data_page_version="2.0",
        sorting_columns=[
            pq.SortingColumn(schema.get_field_index(c)) for c in ("metric", "labels", "timestamp")
        ],
    )


@dataclass(frozen=True)
class SnapshotInfo:
    """What an export wrote (also what :func:`read_info` reads back from a file)."""

    path: Path
    experiment: Experiment
    tier: str
    rows: int
    series: int
    bytes: int
    content_hash: str
    start_ms: int
    end_ms: int | None
    first_ms: int | None
    last_ms: int | None
    metrics: tuple[str, ...] = ()


def snapshot_path(out: str | Path, experiment_id: str) -> Path:
    """Where an experiment's snapshot lives: ``out`` itself if it names a ``.parquet`` file,
    else ``<out>/<experiment_id>.parquet``."""
    out = Path(out)
    return out if out.suffix == ".parquet" else out / f"{experiment_id}.parquet"


# --------------------------------------------------------------------------- metadata
def file_metadata(
    *,
    experiment: Experiment,
    tier: str,
    rows: int,
    series: Sequence[list[Any]],
    metrics: Sequence[str],
    first_ms: int | None,
    last_ms: int | None,
    content_hash: str,
) -> dict[str, str]:
    """The key-value metadata of a snapshot file, keys with ``META_PREFIX``.

    ``series`` holds one ``[series_id, metric, labels_json, kind, first_row, rows, prev]`` per
    series in file order, ``prev`` a counter's ``[ts, value]`` before the start or None.
    """
    from metricvault import __version__

    values = {
        "schema_version": str(SCHEMA_VERSION),
        # created_ms is when the record was registered, not part of the experiment: a
        # re-registered experiment with the same fields gives the same bytes
        "experiment": _dumps(
            {k: v for k, v in experiment.to_record().items() if k != "created_ms"}
        ),
        "tier": tier,
        "time_range": _dumps(
            {
                "start_ms": experiment.start_ms,
                "end_ms": experiment.end_ms,  # None while the experiment runs: no clock here
                "first_ms": first_ms,
                "last_ms": last_ms,
            }
        ),
        "rows": str(rows),
        "row_group_rows": str(ROW_GROUP_ROWS),
        "metrics": _dumps(list(metrics)),
        "series": _dumps(list(series)),
        "version": __version__,
        "content_hash": content_hash,
    }
    return {META_PREFIX + k: v for k, v in values.items()}


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- content hash
class RowHasher:
    """SHA-256 over the rows in a canonical byte form that does not depend on Parquet's
    encoding or the library version: per row group, per column in schema order, integers and
    timestamps as little-endian int64, floats as little-endian float64 (a null as a 0 byte in
    a validity prefix and 0.0), strings as their UTF-8 bytes with int64 end offsets."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, table: pa.Table) -> None:
        for column in table.columns:
            self._column(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)

    def _column(self, arr: pa.Array) -> None:
        t = arr.type
        if pa.types.is_dictionary(t):
            arr, t = arr.dictionary_decode(), t.value_type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            arr = arr.cast(pa.large_string())
            offsets = np.frombuffer(arr.buffers()[1], np.int64)[
                arr.offset : arr.offset + len(arr) + 1
            ]
            data = arr.buffers()[2]
            self._h.update((offsets[1:] - offsets[0]).astype("<i8").tobytes())
            if data is not None:
                self._h.update(memoryview(data)[offsets[0] : offsets[-1]])
            return
        if pa.types.is_floating(t):
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            self._h.update(valid.astype(np.uint8).tobytes())
            self._h.update(arr.fill_null(0.0).to_numpy().astype("<f8").tobytes())
            return
        self._h.update(arr.cast(pa.int64()).to_numpy().astype("<i8").tobytes())

    def hexdigest(self) -> str:
        return "sha256:" + self._h.hexdigest()


def content_hash(path: str | Path) -> str:
    """Recompute a snapshot's content hash from its rows (row group by row group)."""
    hasher = RowHasher()
    pf = pq.ParquetFile(path)
    for i in range(pf.num_row_groups):
        group = pf.read_row_group(i)
        if group.num_rows:
            hasher.update(group)
    return hasher.hexdigest()


# --------------------------------------------------------------------------- reading back
def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``metricvault.*`` key-value metadata of a snapshot file (prefix removed)."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"no snapshot file {path}")
    try:
        raw = pq.read_metadata(path).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path} is not a readable Parquet file: {exc}") from exc
    meta = {
        k.decode()[len(META_PREFIX) :]: v.decode()
        for k, v in raw.items()
        if k.decode().startswith(META_PREFIX)
    }
    if "schema_version" not in meta:
        raise InputError(
            f"{path} is a Parquet file but not a metricvault snapshot (no "
            f"{META_PREFIX}schema_version metadata); export one with `metricvault archive export`"
        )
    if int(meta["schema_version"]) > SCHEMA_VERSION:
        raise InputError(
            f"{path} has snapshot schema version {meta['schema_version']}; this metricvault "
            f"reads up to {SCHEMA_VERSION}: upgrade metricvault"
        )
    return meta


def read_info(path: str | Path, meta: dict[str, str] | None = None) -> SnapshotInfo:
    path = Path(path)
    meta = read_metadata(path) if meta is None else meta
    span = json.loads(meta["time_range"])
    return SnapshotInfo(
        path=path,
        experiment=Experiment.from_record(json.loads(meta["experiment"])),
        tier=meta["tier"],
        rows=int(meta["rows"]),
        series=len(json.loads(meta["series"])),
        bytes=path.stat().st_size,
        content_hash=meta["content_hash"],
        start_ms=span["start_ms"],
        end_ms=span["end_ms"],
        first_ms=span["first_ms"],
        last_ms=span["last_ms"],
        metrics=tuple(json.loads(meta.get("metrics", "[]"))),
    )
