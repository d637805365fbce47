"""Reading decoded rows from a snapshot's data files, with a byte-bounded cache.

Data files never change once written, so a decoded row group can be cached for as long as
memory allows; the cache is what makes repeated dashboard queries take milliseconds. Rows from
files whose time ranges overlap are deduplicated (later files win).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricvault.errors import CorruptionError, StorageError
from metricvault.model import SAMPLE_SCHEMA, TIER_RESOLUTION_MS
from metricvault.store import files as fmt
from metricvault.store.catalog import DataFile
from metricvault.store.layout import Location
from metricvault.store.rollup import ROLLUP_SCHEMA, conform


def float_columns(tier: str) -> tuple[str, ...]:
    return fmt.RAW_FLOATS if tier == "raw" else fmt.ROLLUP_FLOATS


@dataclass(frozen=True, slots=True)
class RowGroup:
    index: int
    min_sid: int
    max_sid: int
    min_ts: int
    max_ts: int


# (file path, row group, decoded: else as stored, lean: without the rollups' sketch columns,
# the series a decoded part of the group holds: b"" for the whole group, else their ids)
CacheKey = tuple[str, int, bool, bool, bytes]
WHOLE = b""


class FileCache:
    """Row groups by :data:`CacheKey`, least recently used out first, bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> pa.Table | None:
        with self._lock:
            table = self._items.get(key)
            if table is not None:
                self._items.move_to_end(key)
            return table

    def put(self, key: CacheKey, table: pa.Table, evict: bool = True) -> None:
        """Keep ``table``; ``evict=False``: only where it fits without evicting another."""
        size = table.nbytes
        if size > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._items or (not evict and self._bytes + size > self.max_bytes):
                return
            self._items[key] = table
            self._bytes += size
            for other in _superseded(key):  # forms of the group this one answers for
                if other in self._items:
                    self._bytes -= self._items.pop(other).nbytes
            while self._bytes > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes


class Reader:
    """Reads only the row groups a query needs (by series_id and ts statistics, which are exact
    because files are sorted by series), decodes them once, and keeps them in the cache."""

    def __init__(self, location: Location, cache: FileCache) -> None:
        self.loc = location
        self.cache = cache
        self._footers: dict[str, tuple[pq.FileMetaData, list[RowGroup]]] = {}
        self._nonfinite: dict[tuple[str, int], np.ndarray] = {}  # all_finite, per row group
        self._footer_lock = threading.Lock()

    def read(
        self,
        files: Sequence[DataFile],
        series_ids: Sequence[int] | None,
        start: int,
        end: int,
        tier: str = "raw",
        use_cache: bool = True,
        sketches: bool = True,
        at: np.ndarray | None = None,
        columns: frozenset[str] | None = None,
    ) -> pa.Table:
        """Decoded rows with ``start <= ts < end`` for the given series (None: all).

        ``use_cache=False`` is for maintenance scans, which would only evict what queries need.
        ``sketches=False``: rollup rows may come without their quantile sketches (null).
        ``at`` (ascending times): of those rows only, per series, the newest at or before each
        of these times, what an instant selector evaluated there reads (:func:`newest_at`).
        ``columns`` (with ``sketches=False``): the rollup columns the caller uses; the others
        may come null (see :meth:`_projected_part`).
        """
        lean = not sketches and tier != "raw"
        chosen = [f for f in files if f.max_ts >= start and f.min_ts < end]
        ids = None if series_ids is None else np.unique(np.asarray(series_ids, np.int64))
        chosen.sort(key=lambda f: f.order)  # later commits win on duplicate samples
        pairs = []
        for f in chosen:
            table = self._read_one(f, ids, start, end, use_cache, lean, at, columns)
            if table.num_rows:
                pairs.append((f, table))
        if not pairs:
            return _empty(tier)
        tables = [t for _, t in pairs]
        if len(pairs) == 1 or not _overlapping([f for f, _ in pairs]):
            return pa.concat_tables(tables)
        return fmt.sort_dedup(pa.concat_tables(tables))

    def _read_one(
        self,
        f: DataFile,
        ids: np.ndarray | None,
        start: int,
        end: int,
        use_cache: bool,
        lean: bool = False,
        at: np.ndarray | None = None,
        columns: frozenset[str] | None = None,
    ) -> pa.Table:
        metadata, groups = self._footer(f)
        wanted = [
            g
            for g in groups
            if g.max_ts >= start and g.min_ts < end and (ids is None or _hits(ids, g))
        ]
        tables = []
        for g in wanted:
            table = self._group(f, metadata, g.index, ids, use_cache, lean, columns)
            if at is not None:  # each group on its own: a partition keeps every newest row
                tables.append(newest_at(table, ids, at, start, end))
            elif g.min_ts < start or g.max_ts >= end:  # only the rows of [start, end)
                tables.append(slice_rows(table, ids, start, end, _slices_for(f.tier)))
            elif ids is not None:  # sliced per group: its own (cached) buffers, no copy
                tables.append(_slice_series(table, ids, _slices_for(f.tier)))
            else:
                tables.append(table)
        tables = [t for t in tables if t.num_rows] or tables[:1]
        if not tables:
            return _empty(f.tier)
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def all_finite(
        self, files: Sequence[DataFile], series_ids: Sequence[int], start: int, end: int
    ) -> bool:
        """Whether no raw sample of these series in the row groups of ``files`` overlapping
        ``[start, end)`` is NaN, ±Inf or a staleness marker. A file's writer records the
        series holding one in its footer (``fmt.nonfinite_series``: no page is read); in files
        without that record such values, never exact scaled integers, sit in ``value_f``: each
        row group's ``value_f`` is read once (mostly null, so small; ``series_id`` only where
        it holds one) and the series holding one are kept per group (files never change)."""
        ids = np.unique(np.asarray(series_ids, np.int64))
        for f in files:
            if f.max_ts < start or f.min_ts >= end:
                continue
            metadata, groups = self._footer(f)
            for g in groups:
                if g.max_ts < start or g.min_ts >= end or not _hits(ids, g):
                    continue
                if np.isin(self._nonfinite_series(f, metadata, g.index), ids).any():
                    return False
        return True

    def _nonfinite_series(self, f: DataFile, metadata: pq.FileMetaData, index: int) -> np.ndarray:
        key = (f.path, index)
        with self._footer_lock:
            found = self._nonfinite.get(key)
        if found is not None:
            return found
        recorded = fmt.nonfinite_series(metadata)  # for the whole file, so for each group
        if recorded is not None:
            found = recorded
        elif "value_f" not in metadata.schema.names or _all_null(metadata, index, "value_f"):
            found = np.zeros(0, np.int64)  # every value an exact scaled integer: all finite
        else:
            try:  # value_f alone first: series_id only where a row group holds an odd value
                with self.loc.fs.open_input_file(f.path) as handle:
                    pf = pq.ParquetFile(handle, metadata=metadata, **fmt.VERIFY)
                    values = pf.read_row_group(index, ["value_f"])["value_f"]
                    bad = pc.fill_null(pc.invert(pc.is_finite(values)), False)
                    found = np.zeros(0, np.int64)
                    if pc.any(bad).as_py():
                        ids = pf.read_row_group(index, ["series_id"])["series_id"]
                        found = np.unique(ids.filter(bad).to_numpy())
            except (OSError, pa.ArrowException) as exc:
                raise read_error(f.path, f"{f.tier} data file", exc) from exc
        with self._footer_lock:
            if len(self._nonfinite) > _MAX_NONFINITE_KEYS:
                self._nonfinite.clear()  # compacted files leave theirs behind
            self._nonfinite[key] = found
        return found

    def _footer(self, f: DataFile) -> tuple[pq.FileMetaData, list[RowGroup]]:
        with self._footer_lock:
            found = self._footers.get(f.path)
        if found is None:
            try:
                with self.loc.fs.open_input_file(f.path) as handle:
                    metadata = pq.ParquetFile(handle).metadata
            except (OSError, pa.ArrowException) as exc:
                raise read_error(f.path, f"{f.tier} data file", exc) from exc
            found = (metadata, _row_groups(metadata, f))
            with self._footer_lock:
                self._footers[f.path] = found
        return found

    def _group(
        self,
        f: DataFile,
        metadata: pq.FileMetaData,
        index: int,
        ids: np.ndarray | None,
        use_cache: bool,
        lean: bool = False,
        columns: frozenset[str] | None = None,
    ) -> pa.Table:
        """The decoded rows of one row group: all of them, or (where ``ids`` holds a small
        part of a group not read before) only those series' rows; ``lean``: the sketch
        columns may be left out; ``columns`` (lean rollup reads): the columns the caller
        uses, the only ones such a small part may be read with."""
        # Any cached form that holds what is asked: decoded before stored, and with the
        # sketches as well as (``lean``) without them, these series' decoded part before
        # the stored group.
        leanness = (False, True) if lean else (False,)
        these = WHOLE if ids is None else ids.tobytes()
        stored = None
        if use_cache:
            for decoded, part in ((True, WHOLE), (True, these), (False, WHOLE)):
                for without in leanness:
                    found = self.cache.get((f.path, index, decoded, without, part))
                    if found is not None and decoded:
                        return found
                    if found is not None and stored is None:
                        stored, lean = found, without
        key = (f.path, index, True, lean, WHOLE)
        if stored is None and ids is not None and lean and columns is not None:
            projected = these + b"|" + ",".join(sorted(columns)).encode()
            part_key = (f.path, index, True, True, projected)
            found = self.cache.get(part_key) if use_cache else None
            if found is not None:
                return found
            found = self._projected_part(f, metadata, index, ids, columns)
            if found is not None:
                if use_cache:
                    self.cache.put(part_key, found)
                return found
        if stored is None:
            stored = self._read_group(f, metadata, index, lean)
            if ids is not None:
                # The first read of a group for a few series (one GPU of a hundred) decodes
                # only their rows: decoding costs as much as reading, and is what a fresh
                # process pays on its first query. Their decoded rows are kept, which the
                # same series' next query (a dashboard refresh) finds, and the group as
                # stored where that evicts nothing: another query decodes it whole (below),
                # as every later one finds it decoded. (A query spanning more groups than the
                # cache holds whole would otherwise evict its own groups before reusing any.)
                part = _slice_series(stored, ids)
                if part.num_rows * SMALL_PART < stored.num_rows:
                    table = self._decode(f, part)
                    if use_cache:
                        self.cache.put((f.path, index, True, lean, these), table)
                        self.cache.put((f.path, index, False, lean, WHOLE), stored, evict=False)
                    return table
        table = self._decode(f, stored)
        if use_cache:
            self.cache.put(key, table)
        return table

    def _projected_part(
        self,
        f: DataFile,
        metadata: pq.FileMetaData,
        index: int,
        ids: np.ndarray,
        columns: frozenset[str],
    ) -> pa.Table | None:
        """The decoded rows of these series in a rollup row group, read with only the
        physical columns that ``columns`` (rollup columns) needs, the others null; None
        where the series hold a quarter of the group's rows or more (then the group is read
        whole, and cached, as a query reading most of it would read it again).

        A fresh process's first query of one series (a panel of one GPU) pays for reading
        and decoding every column of a group of ~45 series; a mean reads under half of them
        here. Always read: the keys and counts (what ``finite_rows`` uses), ``scale``, the
        int columns asked (a merge's bucket ends and NaN counts), and ``sum`` and ``min``: decoding
        derives others from them (:func:`files.decode`: ``sum``, ``max``, ``last`` and
        ``first`` stored as distances from ``count x min`` or ``min``; ``min`` restored from
        ``sum``, and ``max``, ``first``, ``last`` from ``min``, where the writer left them
        out). The floats not asked for (``max``, ``first``, ``last``, ``increase``, ``m2``)
        are the ones nothing is derived from.

        The keys are read first to find the series' share of the group, unless the group's
        footer already bounds it under a quarter (:func:`_surely_small`): then one read."""
        floats = set(columns) & set(fmt.ROLLUP_FLOATS) | {"sum", "min"}
        small = _surely_small(self._footer(f)[1][index], metadata, ids, f.tier)
        threads = metadata.row_group(index).num_rows > THREADED_ROWS
        try:
            with self.loc.fs.open_input_file(f.path) as handle:
                pf = pq.ParquetFile(handle, metadata=metadata, **fmt.VERIFY)
                if not small:
                    keys = pf.read_row_group(index, ["series_id"], use_threads=threads)
                    if _slice_series(keys, ids).num_rows * SMALL_PART >= keys.num_rows:
                        return None
                names = [
                    n
                    for n in pf.schema_arrow.names
                    if n in _PROJECTED_ALWAYS
                    or n in columns
                    or (n[-2:] in ("_i", "_j", "_f") and n[:-2] in floats)
                    or (n == "first_d" and "first" in floats)
                ]
                stored = _slice_series(pf.read_row_group(index, names, use_threads=threads), ids)
        except (OSError, pa.ArrowException) as exc:
            raise read_error(f.path, f"{f.tier} data file", exc) from exc
        return self._decode(f, stored)

    def _read_group(
        self, f: DataFile, metadata: pq.FileMetaData, index: int, lean: bool
    ) -> pa.Table:
        try:
            with self.loc.fs.open_input_file(f.path) as handle:
                pf = pq.ParquetFile(handle, metadata=metadata, **fmt.VERIFY)
                if not lean:
                    return pf.read_row_group(index)
                # every column a sketch is stored in (its keys, its counts in any encoding)
                names = [n for n in pf.schema_arrow.names if not n.startswith(SKETCH_PREFIX)]
                return pf.read_row_group(index, names)
        except (OSError, pa.ArrowException) as exc:
            raise read_error(f.path, f"{f.tier} data file", exc) from exc

    @staticmethod
    def _decode(f: DataFile, stored: pa.Table) -> pa.Table:
        table = fmt.decode(stored, float_columns(f.tier))
        return table if f.tier == "raw" else conform(table)


# What pyarrow says when a file's bytes are not what was written (as opposed to a file that
# is missing or a store that cannot be reached, where retrying may help).
_DAMAGE_HINTS = ("crc", "checksum", "magic bytes", "corrupt", "decompress", "invalid", "eof")


def read_error(path: str, what: str, exc: BaseException) -> StorageError:
    """The error for a vault file that cannot be read: damaged bytes name the file and the fix
    (``metricvault check``); a missing file or a store error stays a retryable StorageError."""
    text = str(exc)
    if isinstance(exc, FileNotFoundError):
        return CorruptionError(
            f"{what} {path} is missing, but the catalog lists it: nothing was answered. Run "
            "'metricvault check' to see what is affected and 'metricvault check --repair' to fix"
        )
    if isinstance(exc, pa.ArrowInvalid) or any(h in text.lower() for h in _DAMAGE_HINTS):
        return CorruptionError(
            f"{what} {path} is damaged ({text}): its bytes are not what was written (a page "
            "checksum or the file structure does not match), so nothing was answered from it. "
            "Run 'metricvault check' to see what is affected and 'metricvault check --repair' "
            "to fix it"
        )
    return StorageError(f"cannot read {what} {path}: {text}")


def _row_groups(metadata: pq.FileMetaData, f: DataFile) -> list[RowGroup]:
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    sid_col, ts_col = names.index("series_id"), names.index("ts")
    groups = []
    for i in range(metadata.num_row_groups):
        rg = metadata.row_group(i)
        sid, ts = rg.column(sid_col).statistics, rg.column(ts_col).statistics
        if sid is None or ts is None or not (sid.has_min_max and ts.has_min_max):
            groups.append(RowGroup(i, -(2**63), 2**63 - 1, f.min_ts, f.max_ts))
        else:
            groups.append(RowGroup(i, sid.min, sid.max, ts.min, ts.max))
    return groups


def _surely_small(group: RowGroup, metadata: pq.FileMetaData, ids: np.ndarray, tier: str) -> bool:
    """Whether the series ``ids`` (sorted) surely hold under a quarter of a rollup row
    group's rows, from its footer alone: a series has at most one row per bucket between
    the group's first and last bucket, and only ids within its series-id bounds are there."""
    inside = np.searchsorted(ids, group.max_sid, "right") - np.searchsorted(ids, group.min_sid)
    buckets = (group.max_ts - group.min_ts) // TIER_RESOLUTION_MS[tier] + 1
    rows: int = metadata.row_group(group.index).num_rows
    return int(inside) * buckets * SMALL_PART < rows


def _hits(ids: np.ndarray, group: RowGroup) -> bool:
    at = int(np.searchsorted(ids, group.min_sid))
    return at < len(ids) and int(ids[at]) <= group.max_sid


_MAX_SLICES = 32
_FEW_SLICES = 4  # time-cut runs kept as slices; more are taken (a copy of only those rows)
_ROLLUP_MAX_SLICES = 1 << 14  # both, for rollup rows (_slices_for)
_SEARCHED_RUNS = 16  # runs searched one by one (below: one vectorised search of them all)
_MAX_NONFINITE_KEYS = 100_000


def _superseded(key: CacheKey) -> list[CacheKey]:
    """The cached forms of a row group that ``key``'s form makes useless: a decoded group
    replaces the stored one, and one with sketches the lean ones."""
    path, index, decoded, lean, part = key
    if part:
        return []
    found = [(path, index, False, lean, part)] if decoded else []
    if not lean:
        found += [(path, index, False, True, part)]
        found += [(path, index, True, True, part)] if decoded else []
    return [k for k in found if k != key]


SKETCH_PREFIX = "sketch_"  # rollup columns of the quantile sketches (rollup.SKETCH_COLUMNS)
SMALL_PART = 4  # under a quarter of a group's rows: decode only those on its first read
# A projected read of a row group of more rows decodes its columns on Arrow's thread pool;
# a smaller one on the caller's thread, where handing columns over costs more than it saves
# and, on a busy machine, waits for a core (a 1h group of 4,448 rows: 1.5 vs 1.8 ms CPU,
# 1.6 vs 6 ms median wall at load 7; 65,536 rows: about even, the pool ahead when idle).
THREADED_ROWS = 1 << 15
# The physical columns a projected rollup read always takes (Reader._projected_part).
_PROJECTED_ALWAYS = frozenset({"series_id", "ts", "count", "scale"})


def _slices_for(tier: str) -> int:
    """The most runs of a row group read as slices of it (more: a copy of only those rows).
    Rollup rows go to PromQL's numpy columns, which a copy of Arrow's would only precede:
    there a take or filter costs Arrow's per-column dispatch (~0.9 ms for a refresh's few
    rows of 32 series and 15 columns, against 0.4 ms for their slices) and saves nothing."""
    return _MAX_SLICES if tier == "raw" else _ROLLUP_MAX_SLICES


def _slice_series(table: pa.Table, ids: np.ndarray, most: int = _MAX_SLICES) -> pa.Table:
    """Rows of the given series from a table sorted by series_id, by binary search (as
    slices, up to ``most`` runs of them; a filter beyond)."""
    sid = _column(table, "series_id")
    lo, hi = _series_runs(sid, ids)
    if lo.size == 0:
        return table.slice(0, 0)
    # Runs of wanted series that touch each other become one slice; slices share the
    # (cached) decoded buffers, where a filter would copy every column.
    run_lo, run_hi = _joined(lo, hi)
    if run_lo.size == 1 and run_lo[0] == 0 and run_hi[0] == len(sid):
        return table
    if run_lo.size > most:  # one filter beats many slices (and a many-chunk table)
        edges = np.zeros(len(sid) + 1, dtype=np.int32)
        np.add.at(edges, run_lo, 1)
        np.add.at(edges, run_hi, -1)
        return table.filter(pa.array(np.cumsum(edges[:-1]) > 0))
    return _slices(table, run_lo, run_hi)


def slice_rows(
    table: pa.Table, ids: np.ndarray | None, start: int, end: int, few: int = _FEW_SLICES
) -> pa.Table:
    """The rows of ``table`` (sorted by series, then time) of the series ``ids`` (None: all)
    with ``start <= ts < end``. Each series' run of rows is cut to those times by binary
    search before any column is touched, so a read of a few minutes costs the few minutes'
    rows, not the whole group's (a filter over the group would compare every row's time)."""
    if table.num_rows == 0:
        return table
    sid = _column(table, "series_id")
    lo, hi = _series_runs(sid, ids)
    ts = _column(table, "ts")
    first, last = _lower_bounds(ts, lo, hi, start), _lower_bounds(ts, lo, hi, end)
    held = last > first
    first, last = first[held], last[held]
    if first.size == 0:
        return table.slice(0, 0)
    first, last = _joined(first, last)
    if first.size == 1 and first[0] == 0 and last[0] == sid.size:
        return table
    if first.size <= few:  # slices share the (cached) decoded buffers
        return _slices(table, first, last)
    lengths = last - first
    before = np.cumsum(lengths) - lengths  # rows taken from the runs before each
    rows = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(first - before, lengths)
    return table.take(pa.array(rows))


def _lower_bounds(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray, value: int) -> np.ndarray:
    """Per run ``ts[lo[i]:hi[i]]`` (each ascending), the first index whose time is at least
    ``value`` (``hi[i]`` where none is): numpy's search per run for a few runs, else one
    binary search over every run at once (a dozen passes of a few array operations)."""
    if lo.size <= _SEARCHED_RUNS:
        found = [
            a + int(np.searchsorted(ts[a:b], value, "left"))
            for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
        ]
        return np.asarray(found, dtype=np.int64)
    a, b = lo.astype(np.int64), hi.astype(np.int64)
    top = max(ts.size - 1, 0)
    while True:
        open_ = a < b
        if not open_.any():
            return a
        mid = (a + b) // 2
        below = open_ & (ts[np.minimum(mid, top)] < value)
        a = np.where(below, mid + 1, a)
        b = np.where(open_ & ~below, mid, b)


def newest_at(
    table: pa.Table, ids: np.ndarray | None, at: np.ndarray, start: int, end: int
) -> pa.Table:
    """The rows of ``table`` (sorted by series, then time) of the series ``ids`` (None: all)
    with ``start <= ts < end`` that are, in their series, the newest at or before some time
    of ``at`` (ascending). An instant selector evaluated at those times takes exactly these
    rows (the newest sample at or before each time, if within its lookback, which starts at
    or after ``start``). Over any partition of a series' rows (row groups, files) the kept
    rows hold the newest of the whole at every time, so they may be kept part by part, and
    duplicates across files then resolved as for all rows."""
    if table.num_rows == 0 or at.size == 0:
        return table.slice(0, 0)
    ts = _column(table, "ts")
    lo, hi = _series_runs(_column(table, "series_id"), ids)
    rows = []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        run = ts[a:b]
        first = a + int(np.searchsorted(run, start, "left"))
        last = a + int(np.searchsorted(run, end, "left"))
        if first >= last:
            continue
        run = ts[first:last]
        # the times this run can answer: from its first row on (earlier ones find none)
        times = at[int(np.searchsorted(at, run[0], "left")) :]
        if times.size == 0:
            continue
        newest = np.searchsorted(run, times, "right") - 1  # non-decreasing: times ascend
        rows.append(first + newest[np.r_[True, newest[1:] != newest[:-1]]])  # np.unique sorts
    if not rows:
        return table.slice(0, 0)
    return table.take(pa.array(np.concatenate(rows)))


def _series_runs(sid: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi)`` of each series' rows in ``sid`` (sorted, not empty), of the series
    ``ids`` (None: every series there); series without rows are left out."""
    if ids is None:
        cut = np.flatnonzero(sid[1:] != sid[:-1]) + 1
        return np.r_[0, cut], np.r_[cut, sid.size]
    lo, hi = np.searchsorted(sid, ids, "left"), np.searchsorted(sid, ids, "right")
    held = hi > lo
    return lo[held], hi[held]


def _joined(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ascending runs ``[lo, hi)`` (at least one) with those that touch each other as one."""
    starts = np.r_[True, lo[1:] != hi[:-1]]
    return lo[starts], np.r_[hi[:-1][starts[1:]], hi[-1]]


def _slices(table: pa.Table, lo: np.ndarray, hi: np.ndarray) -> pa.Table:
    """The rows ``[lo, hi)`` of each run, as slices (they share the decoded buffers)."""
    pieces = [table.slice(a, b - a) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _column(table: pa.Table, name: str) -> np.ndarray:
    column = table[name]
    values = column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()
    return np.asarray(values, np.int64)


def _overlapping(files: Sequence[DataFile]) -> bool:
    spans = sorted((f.min_ts, f.max_ts) for f in files)
    return any(b[0] <= a[1] for a, b in itertools.pairwise(spans))


def _empty(tier: str) -> pa.Table:
    return (SAMPLE_SCHEMA if tier == "raw" else ROLLUP_SCHEMA).empty_table()


def _all_null(metadata: pq.FileMetaData, index: int, column: str) -> bool:
    """Whether the footer's statistics say ``column`` is null in every row of row group
    ``index`` (a 30-day panel's finiteness test then reads no page: docs/ui.md)."""
    group = metadata.row_group(index)
    for i in range(group.num_columns):
        chunk = group.column(i)
        if chunk.path_in_schema == column:
            stats = chunk.statistics
            return bool(
                stats is not None and stats.has_null_count and stats.null_count == group.num_rows
            )
    return False
