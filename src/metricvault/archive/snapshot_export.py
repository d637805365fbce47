"""Snapshot EXPORT: plan and write an experiment's snapshot file from a vault.

The file format (schema, metadata keys, content hash, reading back) is
:mod:`metricvault.archive.snapshot_format`; this module decides what to fetch from the vault,
in which order and in how big pieces (memory stays bounded however long the experiment), and
feeds the fixed-size row groups to the writer. The bytes depend on the data only: not on the
chunking (``chunk_rows``), not on when the record was registered.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault.archive.snapshot_format import (
    ROLLUP_COLUMNS,
    ROW_GROUP_ROWS,
    TIER_MS,
    RowHasher,
    SnapshotInfo,
    file_metadata,
    open_writer,
    read_info,
    snapshot_path,
    writer_schema,
)
from metricvault.durations import ms_to_datetime
from metricvault.errors import InputError, NotFoundError, TimeRangeError
from metricvault.experiment import Experiment
from metricvault.model import TIERS
from metricvault.protocols import Exporting, SampleReader, require
from metricvault.store.series_index import SeriesInfo

TARGET_CHUNK_ROWS = 1_000_000  # rows fetched from the vault at a time (bounds memory)


# --------------------------------------------------------------------------- export
def export_snapshot(
    vault: Exporting,
    experiment_id: str,
    out: str | Path = "artifacts/metrics",
    *,
    tier: str = "raw",
    metrics: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    chunk_rows: int = TARGET_CHUNK_ROWS,
) -> SnapshotInfo:
    """Write ``<out>/<experiment_id>.parquet`` (``out`` may also name the ``.parquet`` file).

    ``metrics`` limits the export to these metric names; ``progress(series_done, series_total)``
    is called as the export advances. The file appears atomically when complete.
    ``chunk_rows`` is about how many rows are fetched from the vault at a time (it bounds
    memory; the file's bytes do not depend on it).

    ``vault`` is any store that can export (:class:`metricvault.protocols.Exporting`: the
    embedded vault, InfluxDB); any other (a gateway URL, a snapshot) is refused before any
    request, saying what to use instead.
    """
    require(vault, "export", str(getattr(vault, "uri", "")))
    if chunk_rows < 1:
        raise InputError(f"chunk_rows must be at least 1, got {chunk_rows}")
    exp = vault.experiments.get(experiment_id)
    if tier not in TIERS:
        raise InputError(f"unknown tier {tier!r}; choose from {', '.join(TIERS)}")
    start, end = exp.window()
    ctx = vault.sample_reader()
    _check_raw_kept(ctx.raw_horizon_ms, tier, exp, start)
    infos = _experiment_series(ctx, exp, metrics)
    path = snapshot_path(out, exp.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        sink = _SnapshotWriter(tmp, exp, tier)
        for done, batch, table in _chunks(ctx, infos, exp, tier, start, end, chunk_rows):
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


def _check_raw_kept(horizon: int, tier: str, exp: Experiment, start: int) -> None:
    if tier == "raw" and horizon and start < horizon:
        raise TimeRangeError(
            f"experiment {exp.id!r} starts at {ms_to_datetime(start):%Y-%m-%d %H:%M} but "
            f"retention dropped raw samples before {ms_to_datetime(horizon):%Y-%m-%d %H:%M}: "
            "export a rollup tier instead (--tier 1m or --tier 1h)"
        )


def _experiment_series(
    ctx: SampleReader, exp: Experiment, metrics: Sequence[str]
) -> list[SeriesInfo]:
    """The experiment's series, in the snapshot's order (metric, then labels)."""
    from metricvault.selector import parse_selectors

    ids = ctx.index.match(parse_selectors(exp.selector))
    # the kind that decides roll-ups (exposition metadata wins over the name)
    infos: list[SeriesInfo] = [replace(ctx.index.get(s), kind=ctx.index.kind(s)) for s in ids]
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
    chunk_rows: int,
) -> Iterator[tuple[int, list[SeriesInfo], pa.Table]]:
    """Rows in snapshot order, about ``chunk_rows`` at a time (memory stays bounded)."""
    if not infos:
        raise NotFoundError(
            f"experiment {exp.id!r} matches no series (selector {exp.selector}): nothing to "
            "export. Check the selector with `metricvault series '<selector>'`"
        )
    done = 0
    for batch, lo, hi in _fetch_plan(ctx, infos, tier, start, end, chunk_rows):
        rows = _fetch(ctx, [i.series_id for i in batch], tier, lo, hi)
        done += len(batch) if hi == end else 0
        yield done, batch if lo == start else [], _long_rows(rows, batch, exp, tier)


def _fetch_plan(
    ctx: SampleReader,
    infos: list[SeriesInfo],
    tier: str,
    start: int,
    end: int,
    chunk_rows: int = TARGET_CHUNK_ROWS,
) -> Iterator[tuple[list[SeriesInfo], int, int]]:
    """Groups of whole series whose rows add up to about the target; a series with more rows
    than that alone, in consecutive time slices (so rows stay in (series, time) order)."""
    counts = _row_counts(ctx, infos, tier, start, end)
    batch: list[SeriesInfo] = []
    rows = 0
    for info in infos:
        n = counts.get(info.series_id, 0)
        if batch and rows + n > chunk_rows:
            yield batch, start, end
            batch, rows = [], 0
        if n > chunk_rows:
            for lo, hi in _time_slices(start, end, n, TIER_MS.get(tier, 1), chunk_rows):
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


def _time_slices(
    start: int, end: int, rows: int, align: int, chunk_rows: int = TARGET_CHUNK_ROWS
) -> list[tuple[int, int]]:
    """``[start, end)`` cut into pieces of about ``chunk_rows`` rows, at multiples of
    ``align`` (a rollup bucket is never split between two fetches)."""
    pieces = -(-rows // chunk_rows)
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
        self.writer = open_writer(path, tier)
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
        series: list[list[Any]] = []
        first_row = 0
        for info in infos:
            n = self.series_rows.get(info.series_id, 0)
            if n:
                prev = self.prev.get(info.series_id)
                series.append(
                    [info.series_id, info.metric, info.labels_json, info.kind, first_row, n, prev]
                )
                first_row += n
        return file_metadata(
            experiment=self.exp,
            tier=self.tier,
            rows=self.rows,
            series=series,
            metrics=metrics,
            first_ms=self.first,
            last_ms=self.last,
            content_hash=self.hash.hexdigest(),
        )
