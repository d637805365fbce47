"""Reading decoded rows from a snapshot's data files, with a byte-bounded cache.

Data files never change once written, so a decoded file can be cached by path for as long as
memory allows; the cache is what makes repeated dashboard queries over rollups take
milliseconds. Rows from files whose time ranges overlap are deduplicated (later files win).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricvault.errors import StorageError
from metricvault.model import SAMPLE_SCHEMA
from metricvault.store import files as fmt
from metricvault.store.catalog import DataFile
from metricvault.store.layout import Location
from metricvault.store.rollup import ROLLUP_SCHEMA


def float_columns(tier: str) -> tuple[str, ...]:
    return fmt.RAW_FLOATS if tier == "raw" else fmt.ROLLUP_FLOATS


class FileCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> pa.Table | None:
        with self._lock:
            table = self._items.get(path)
            if table is not None:
                self._items.move_to_end(path)
            return table

    def put(self, path: str, table: pa.Table) -> None:
        size = table.nbytes
        if size > self.max_bytes // 8:
            return
        with self._lock:
            if path in self._items:
                return
            self._items[path] = table
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes


class Reader:
    def __init__(self, location: Location, cache: FileCache) -> None:
        self.loc = location
        self.cache = cache

    def read(
        self,
        files: Sequence[DataFile],
        series_ids: Sequence[int] | None,
        start: int,
        end: int,
        tier: str = "raw",
    ) -> pa.Table:
        """Decoded rows with ``start <= ts < end`` for the given series (None: all)."""
        chosen = [f for f in files if f.max_ts >= start and f.min_ts < end]
        ids = None if series_ids is None else pa.array(sorted(series_ids), pa.int64())
        chosen.sort(key=lambda f: f.file_id)  # later files win on duplicate samples
        pairs = [(f, t) for f in chosen if (t := self._read_one(f, ids, start, end)).num_rows]
        if not pairs:
            return _empty(tier)
        tables = [t for _, t in pairs]
        if len(pairs) == 1 or not _overlapping([f for f, _ in pairs]):
            return pa.concat_tables(tables)
        return fmt.sort_dedup(pa.concat_tables(tables))

    def _read_one(self, f: DataFile, ids: pa.Array | None, start: int, end: int) -> pa.Table:
        cols = float_columns(f.tier)
        table = self.cache.get(f.path)
        if table is None and f.bytes <= self.cache.max_bytes // 32:
            table = self._load(f, cols, None)
            self.cache.put(f.path, table)
        if table is None:
            filters = [("ts", ">=", start), ("ts", "<", end)]
            if ids is not None:
                filters.append(("series_id", "in", ids.to_pylist()))
            return self._load(f, cols, filters)
        if ids is not None:
            table = _slice_series(table, ids.to_numpy())
        if f.min_ts >= start and f.max_ts < end:
            return table
        mask = pc.and_(pc.greater_equal(table["ts"], start), pc.less(table["ts"], end))
        return table.filter(mask)

    def _load(self, f: DataFile, cols: tuple[str, ...], filters: object) -> pa.Table:
        try:
            table = pq.read_table(
                f.path, filesystem=self.loc.fs, filters=filters, partitioning=None
            )
        except (OSError, pa.ArrowException) as exc:
            raise StorageError(f"cannot read data file {f.path}: {exc}") from exc
        return fmt.decode(table, cols)


def _slice_series(table: pa.Table, ids: np.ndarray) -> pa.Table:
    """Rows of the given series from a table sorted by series_id, by binary search."""
    sid = (
        table["series_id"].chunk(0).to_numpy()
        if table["series_id"].num_chunks == 1
        else (table["series_id"].to_numpy())
    )
    lo = np.searchsorted(sid, ids, "left")
    hi = np.searchsorted(sid, ids, "right")
    pieces = [table.slice(a, b - a) for a, b in zip(lo, hi, strict=True) if b > a]
    if not pieces:
        return table.slice(0, 0)
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _overlapping(files: Sequence[DataFile]) -> bool:
    spans = sorted((f.min_ts, f.max_ts) for f in files)
    return any(b[0] <= a[1] for a, b in itertools.pairwise(spans))


def _empty(tier: str) -> pa.Table:
    return (SAMPLE_SCHEMA if tier == "raw" else ROLLUP_SCHEMA).empty_table()
