"""Experiment snapshots: one deterministic Parquet file per experiment.

The file is the long shape with the experiment on every row::

    experiment_id, git_sha, series_id, metric, labels (canonical JSON), timestamp,
    value                                       (tier raw)
    count, sum, min, max, last, increase        (tiers 1m / 1h; increase is null for gauges)

Rows are sorted by (metric, labels, timestamp), written in row groups of exactly
``ROW_GROUP_ROWS`` rows with fixed writer settings and no wall-clock anywhere, so the same data
gives byte-identical files (DVC then stores it once). File-level key-value metadata carries the
schema version, the experiment record, the tier, the time range, the row count, the metricvault
version, the per-series row ranges (which let readers fetch one series without a scan) with, for
counters in raw snapshots, the last sample before the start (so ``increase`` over the first
bucket equals the vault's), and a content hash of the rows that :func:`content_hash` recomputes
from the file alone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metricvault.archive.experiments import Experiment
from metricvault.durations import ms_to_datetime
from metricvault.errors import InputError, NotFoundError, TimeRangeError
from metricvault.model import TIERS
from metricvault.store.backend import SampleReader
from metricvault.store.series_index import SeriesInfo
from metricvault.store.vault import Vault

SCHEMA_VERSION = 1
ROW_GROUP_ROWS = 131_072
TARGET_CHUNK_ROWS = 1_000_000  # rows fetched from the vault at a time (bounds memory)
TIER_MS = {"1m": 60_000, "1h": 3_600_000}
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


# --------------------------------------------------------------------------- export
def export_snapshot(
    vault: Vault,
    experiment_id: str,
    out: str | Path = "artifacts/metrics",
    *,
    tier: str = "raw",
    metrics: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
) -> SnapshotInfo:
    """Write ``<out>/<experiment_id>.parquet`` (``out`` may also name the ``.parquet`` file).

    ``metrics`` limits the export to these metric names; ``progress(series_done, series_total)``
    is called as the export advances. The file appears atomically when complete.
    """
    exp = vault.experiments.get(experiment_id)
    if tier not in TIERS:
        raise InputError(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}")
    start, end = exp.window()
    ctx = vault.sample_reader()
    _check_raw_kept(ctx.raw_horizon_ms, tier, exp, start)
    infos = _experiment_series(vault, exp, metrics)
    path = snapshot_path(out, exp.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        sink = _SnapshotWriter(tmp, exp, tier)
        for done, batch, table in _chunks(ctx, infos, exp, tier, start, end):
            sink.add(table)
            if tier == "raw":
                sink.prev.update(_counter_lookback(ctx, batch, start))
            if progress:
                progress(done, len(infos))
        if sink.rows + sink.pending_rows == 0:
            raise NotFoundError(
                f"experiment {exp.id!r} has no {tier} data between {ms_to_datetime(start)} and "
                f"{ms_to_datetime(end)}: nothing to export. Check its start/end "
                f"(`metricvault experiment show {exp.id}`) and `metricvault stats`"
            )
        sink.close(infos, tuple(metrics))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return read_info(path)


def snapshot_path(out: str | Path, experiment_id: str) -> Path:
    out = Path(out)
    return out if out.suffix == ".parquet" else out / f"{experiment_id}.parquet"


def _check_raw_kept(horizon: int, tier: str, exp: Experiment, start: int) -> None:
    if tier == "raw" and horizon and start < horizon:
        raise TimeRangeError(
            f"experiment {exp.id!r} starts at {ms_to_datetime(start):%Y-%m-%d %H:%M} but "
            f"retention dropped raw samples before {ms_to_datetime(horizon):%Y-%m-%d %H:%M}: "
            "export a rollup tier instead (--tier 1m or --tier 1h)"
        )


def _experiment_series(vault: Vault, exp: Experiment, metrics: Sequence[str]) -> list[SeriesInfo]:
    """The experiment's series, in the snapshot's order (metric, then labels)."""
    from metricvault.selector import parse_selectors

    ids = vault.index.match(parse_selectors(exp.selector))
    # the kind that decides roll-ups (exposition metadata wins over the name)
    infos = [replace(vault.index.get(s), kind=vault.index.kind(s)) for s in ids]
    if metrics:
        unknown = sorted(set(metrics) - {i.metric for i in infos})
        if unknown:
            raise NotFoundError(
                f"experiment {exp.id!r} has no series of metric(s) {', '.join(unknown)} "
                f"(its selector is {exp.selector}); check the names with "
                "`metricvault series`"
            )
        infos = [i for i in infos if i.metric in set(metrics)]
    return sorted(infos, key=lambda i: (i.metric, i.labels_json))


def _chunks(
    ctx: SampleReader,
    infos: list[SeriesInfo],
    exp: Experiment,
    tier: str,
    start: int,
    end: int,
) -> Iterator[tuple[int, list[SeriesInfo], pa.Table]]:
    """Rows in snapshot order, about ``TARGET_CHUNK_ROWS`` at a time (memory stays bounded)."""
    if not infos:
        raise NotFoundError(
            f"experiment {exp.id!r} matches no series (selector {exp.selector}): nothing to "
            "export. Check the selector with `metricvault series '<selector>'`"
        )
    done = 0
    for batch, lo, hi in _fetch_plan(ctx, infos, tier, start, end):
        rows = _fetch(ctx, [i.series_id for i in batch], tier, lo, hi)
        done += len(batch) if hi == end else 0
        yield done, batch if lo == start else [], _long_rows(rows, batch, exp, tier)


def _fetch_plan(
    ctx: SampleReader, infos: list[SeriesInfo], tier: str, start: int, end: int
) -> Iterator[tuple[list[SeriesInfo], int, int]]:
    """Groups of whole series whose rows add up to about the target; a series with more rows
    than that alone, in consecutive time slices (so rows stay in (series, time) order)."""
    counts = _row_counts(ctx, infos, tier, start, end)
    batch: list[SeriesInfo] = []
    rows = 0
    for info in infos:
        n = counts.get(info.series_id, 0)
        if batch and rows + n > TARGET_CHUNK_ROWS:
            yield batch, start, end
            batch, rows = [], 0
        if n > TARGET_CHUNK_ROWS:
            for lo, hi in _time_slices(start, end, n, TIER_MS.get(tier, 1)):
                yield [info], lo, hi
            continue
        batch.append(info)
        rows += n
    if batch:
        yield batch, start, end


def _row_counts(
    ctx: SampleReader, infos: list[SeriesInfo], tier: str, start: int, end: int
) -> dict[int, int]:
    """Rows each series will have: raw sample counts (answered from rollups, cheaply), or the
    number of buckets in the window for a rollup tier (an upper bound)."""
    if tier != "raw":
        buckets = (end - start) // TIER_MS[tier] + 2
        return {i.series_id: buckets for i in infos}
    counts: dict[int, int] = {}
    ids = [i.series_id for i in infos]
    for first in range(0, len(ids), 1024):
        partials = ctx.partials(ids[first : first + 1024], start, end, -1)
        pairs = zip(partials["series_id"].to_pylist(), partials["count"].to_pylist(), strict=True)
        counts.update(pairs)
    return counts


def _time_slices(start: int, end: int, rows: int, align: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces of about ``TARGET_CHUNK_ROWS`` rows, at multiples of
    ``align`` (a rollup bucket is never split between two fetches)."""
    pieces = -(-rows // TARGET_CHUNK_ROWS)
    width = -(-(end - start) // pieces // align) * align or align
    cuts = [start, *range((start // width + 1) * width, end, width), end]
    return list(itertools.pairwise(cuts))


def _counter_lookback(
    ctx: SampleReader, infos: list[SeriesInfo], start: int
) -> dict[int, list[float]]:
    """Each counter's last sample before ``start`` (within the lookback): a raw snapshot keeps
    it in its metadata so ``increase`` over its first bucket equals the vault's."""
    ids = [i.series_id for i in infos if ctx.index.is_counter(i.series_id)]
    if not ids:
        return {}
    before = ctx.raw_samples(ids, start - ctx.lookback_ms, start)
    prev: dict[int, list[float]] = {}
    for sid, ts, value in zip(
        *(before[c].to_pylist() for c in ("series_id", "ts", "value")), strict=True
    ):
        prev[sid] = [ts, value]  # rows are in time order per series: the last one wins
    return prev


def _fetch(ctx: SampleReader, ids: list[int], tier: str, start: int, end: int) -> pa.Table:
    if tier == "raw":
        return ctx.raw_samples(ids, start, end)
    return ctx.partials(ids, start, end, TIER_MS[tier])


def _long_rows(rows: pa.Table, batch: list[SeriesInfo], exp: Experiment, tier: str) -> pa.Table:
    """Sort a chunk into snapshot order and add the key columns (as dictionary arrays: a
    label set is stored once per chunk, not once per row)."""
    schema = writer_schema(tier)
    if rows.num_rows == 0:
        return schema.empty_table()
    batch_ids = np.array([i.series_id for i in batch], np.int64)
    by_id = np.argsort(batch_ids)
    sid = rows["series_id"].to_numpy()
    ts = rows["ts"].to_numpy()
    pos = by_id[np.searchsorted(batch_ids[by_id], sid)]  # each row's rank in the batch
    order = np.lexsort((ts, pos))
    codes = pos[order]
    zeros = pa.array(np.zeros(len(order), np.int32))
    cols: dict[str, Any] = {
        "experiment_id": pa.DictionaryArray.from_arrays(zeros, pa.array([exp.id])),
        "git_sha": pa.DictionaryArray.from_arrays(zeros, pa.array([exp.git_sha])),
        "series_id": pa.array(sid[order], pa.int64()),
        "metric": _dictionary(codes, [i.metric for i in batch]),
        "labels": _dictionary(codes, [i.labels_json for i in batch]),
        "timestamp": pa.array(ts[order], pa.timestamp("ms", tz="UTC")),
    }
    take = pa.array(order)
    for name in ("value",) if tier == "raw" else ROLLUP_COLUMNS:
        cols[name] = rows[name].take(take)
    return pa.table(cols, schema=schema)


def _dictionary(codes: np.ndarray, per_series: list[str]) -> pa.DictionaryArray:
    """Each row's string (``per_series[code]``) as a dictionary array with unique, sorted
    values: Parquet's writer encodes a dictionary with repeated values differently from one
    call to the next (seen with pyarrow 24), which would break byte-identical exports."""
    values, inverse = np.unique(np.array(per_series, dtype=object), return_inverse=True)
    indices = pa.array(inverse.astype(np.int32)[codes])
    return pa.DictionaryArray.from_arrays(indices, pa.array(values.tolist(), pa.string()))


def _canonical_dictionaries(table: pa.Table) -> pa.Table:
    """One chunk whose dictionaries hold each value once, in order of first appearance: the
    row group's bytes then depend on its rows only, not on how the export was chunked."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            plain = table.column(i).cast(field.type.value_type).combine_chunks()
            table = table.set_column(i, field, plain.dictionary_encode().cast(field.type))
    return table.combine_chunks()


class _SnapshotWriter:
    """Writes fixed-size row groups, hashes them, and remembers each series' row range."""

    def __init__(self, path: Path, exp: Experiment, tier: str) -> None:
        self.exp, self.tier = exp, tier
        self.schema = writer_schema(tier)
        self.writer = pq.ParquetWriter(
            path,
            self.schema,
            store_schema=False,
            compression="zstd",
            compression_level=9,
            use_dictionary=_DICTIONARY,
            column_encoding={k: v for k, v in _ENCODING.items() if k in self.schema.names},
            write_statistics=True,
            data_page_version="2.0",
            sorting_columns=[
                pq.SortingColumn(self.schema.get_field_index(c))
                for c in ("metric", "labels", "timestamp")
            ],
        )
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.rows = 0
        self.hash = RowHasher()
        self.series_rows: dict[int, int] = {}
        self.prev: dict[int, list[float]] = {}  # counter series -> [ts, value] before start
        self.first: int | None = None
        self.last: int | None = None

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._track(table)
        self.pending.append(table)
        self.pending_rows += table.num_rows
        while self.pending_rows >= ROW_GROUP_ROWS:
            self._emit(ROW_GROUP_ROWS)

    def _track(self, table: pa.Table) -> None:
        ids, counts = np.unique(table["series_id"].to_numpy(), return_counts=True)
        for sid, n in zip(ids.tolist(), counts.tolist(), strict=True):
            self.series_rows[sid] = self.series_rows.get(sid, 0) + n
        ts = table["timestamp"].cast(pa.int64()).to_numpy()
        lo, hi = int(ts.min()), int(ts.max())
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)

    def _emit(self, rows: int) -> None:
        """Write exactly ``rows`` pending rows as one row group (the rest stays pending)."""
        parts, need = [], rows
        while need:
            head = self.pending[0]
            if head.num_rows <= need:
                parts.append(self.pending.pop(0))
                need -= head.num_rows
            else:
                parts.append(head.slice(0, need))
                self.pending[0] = head.slice(need)
                need = 0
        group = _canonical_dictionaries(pa.concat_tables(parts))
        self.writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
        self.hash.update(group)
        self.rows += group.num_rows
        self.pending_rows -= rows

    def close(self, infos: list[SeriesInfo], metrics: tuple[str, ...]) -> dict[str, str]:
        if self.pending_rows:
            self._emit(self.pending_rows)
        meta = self._metadata(infos, metrics)
        self.writer.add_key_value_metadata(meta)
        self.writer.close()
        return meta

    def _metadata(self, infos: list[SeriesInfo], metrics: tuple[str, ...]) -> dict[str, str]:
        from metricvault import __version__

        series, first_row = [], 0
        for info in infos:
            n = self.series_rows.get(info.series_id, 0)
            if n:
                prev = self.prev.get(info.series_id)
                series.append(
                    [info.series_id, info.metric, info.labels_json, info.kind, first_row, n, prev]
                )
                first_row += n
        values = {
            "schema_version": str(SCHEMA_VERSION),
            # created_ms is when the record was registered, not part of the experiment: a
            # re-registered experiment with the same fields gives the same bytes
            "experiment": _dumps(
                {k: v for k, v in self.exp.to_record().items() if k != "created_ms"}
            ),
            "tier": self.tier,
            "time_range": _dumps(
                {
                    "start_ms": self.exp.start_ms,
                    "end_ms": self.exp.end_ms,  # None while the experiment runs: no clock here
                    "first_ms": self.first,
                    "last_ms": self.last,
                }
            ),
            "rows": str(self.rows),
            "row_group_rows": str(ROW_GROUP_ROWS),
            "metrics": _dumps(list(metrics)),
            "series": _dumps(series),
            "version": __version__,
            "content_hash": self.hash.hexdigest(),
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
