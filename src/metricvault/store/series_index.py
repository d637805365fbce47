"""The series table in memory: series_id -> (metric, labels, kind), with collision detection,
and when each series was first and last seen (what ``/api/v1/series``, ``/labels`` and
``/label/<name>/values`` narrow to their ``start``/``end`` with).

First/last-seen times are the times of the first and last flushed sample. Series files carry
them in two extra columns, ``first_ms`` and ``last_ms``: a flush writes a row for every new
series and, again, for a known one whose span moved into another UTC day, so a series costs at
most a row a day and other processes know its span to the day. Reads therefore widen a span to
whole UTC days (a series is listed for a range that overlaps the days it has samples on, as
Prometheus lists the series of every block overlapping the range). A series file written
before these columns existed says nothing about time: its series count as present always.

**Shards.** Each series belongs to one of ``SERIES_SHARDS`` shards, by a hash of its metric
name (``shard_of``). A series file (layout 2) holds its rows sorted by shard, one Parquet row
group per shard, with a ``shard`` column, and the catalog names the shards each file holds
(``SeriesFile.shards``). The index is told the files (``sync``) but reads none on open: a
selector that names its metric reads only that shard's row groups, of only the files that
hold it; a write reads the shards of the metrics it carries (so a known series is never
registered again, and a colliding id is caught, within its metric's shard); anything that
needs every series (a selector without a metric name, ``all``, ``len``) reads every shard. A
file without shard information (layout 1, written before shards) is read whole the first time
any shard is needed. ``files_read`` counts the reads, for tests and benchmarks.
"""

from __future__ import annotations

import io
import json
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metricvault.errors import SeriesCollisionError
from metricvault.model import SERIES_SCHEMA, TIER_RESOLUTION_MS
from metricvault.selector import Selector, SelectorUnion

DAY_MS = 24 * TIER_RESOLUTION_MS["1h"]
UNKNOWN_FIRST = -(2**63)  # a series from a file without times: seen since always
UNKNOWN_LAST = 2**63 - 1  # ... and until now
SPAN_COLUMNS = ("first_ms", "last_ms")  # the series files' extra, nullable columns
SERIES_SHARDS = 64  # shards of the series table, by metric name (never change: files name them)
SHARD_COLUMN = "shard"  # a layout-2 series file's shard of each row
SERIES_LAYOUT_KEY = b"metricvault.series_layout"  # Parquet key-value metadata; absent = 1
SERIES_LAYOUT = 2  # 1: any order, no shard column; 2: sorted by shard, a row group per shard
SERIES_FILES_MAX = 64  # series files in a catalog version before a flush merges them
SERIES_FILES_COMPACT = 8  # ... before maintenance merges them (before a flush has to)
THREADED_ROWS = 1 << 16  # series file rows a read decodes on Arrow's thread pool above this

# reads a series file's rows: all of them (None) or those of some shards (a sorted tuple);
# the columns named, or all (None)
SeriesLoader = Callable[[str, "tuple[int, ...] | None", "list[str] | None"], pa.Table]


@lru_cache(maxsize=1 << 16)
def shard_of(metric: str) -> int:
    """The shard of a metric's series: stable across processes and versions (CRC-32)."""
    return zlib.crc32(metric.encode()) % SERIES_SHARDS


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    series_id: int
    metric: str
    labels: dict[str, str]
    kind: str
    labels_json: str


class SeriesIndex:
    def __init__(self, loader: SeriesLoader | None = None) -> None:
        self._loader = loader
        self._load_lock = threading.RLock()  # one reader of series files at a time
        self._tracked: dict[str, tuple[int, ...] | None] = {}  # series files synced, shards
        self._pending: dict[int, set[str]] = {}  # shard -> files not read for it yet
        self._pending_whole: set[str] = set()  # files without shards, not read yet
        self._file_ids: dict[str, list[int]] = {}  # series ids of unread files (len only)
        self.files_read = 0  # series file reads (a whole file, or some shards' row groups)
        self._by_id: dict[int, SeriesInfo] = {}
        self._by_metric: dict[str, list[int]] = {}
        self._metric_kinds: dict[str, str] = {}  # from exposition metadata; wins over names
        self._lock = threading.Lock()
        # first/last flushed sample per series (ms) as far as this process knows, and the
        # UTC days the series files already say (a row is written again when they widen)
        self._seen: dict[int, tuple[int, int]] = {}
        self._saved_days: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ lazy loading
    def sync(self, files: Iterable[tuple[str, tuple[int, ...] | None]]) -> None:
        """The series files of the current catalog version, as ``(path, shards)`` (``None``:
        a file without shard information). New ones are read when their shards are needed;
        unread ones a version no longer names are forgotten (compaction wrote their rows into
        a file it names)."""
        current = dict(files)
        with self._load_lock:
            for path, shards in current.items():
                if path in self._tracked:
                    continue
                self._tracked[path] = shards
                if shards is None:
                    self._pending_whole.add(path)
                for shard in shards or ():
                    self._pending.setdefault(shard, set()).add(path)
            gone = [p for p in self._tracked if p not in current]
            for path in gone:
                del self._tracked[path]
                self._pending_whole.discard(path)
                self._file_ids.pop(path, None)
                for shard in list(self._pending):
                    self._pending[shard].discard(path)
                    if not self._pending[shard]:
                        del self._pending[shard]

    def tracks(self, paths: Iterable[str]) -> bool:
        """Whether every one of ``paths`` was synced already (nothing new to track)."""
        return all(p in self._tracked for p in paths)

    def fully_loaded(self) -> bool:
        return not self._pending and not self._pending_whole

    def need_metrics(self, metrics: Iterable[str]) -> None:
        """Read the shards of these metrics' series from every file not read for them yet."""
        if self.fully_loaded():
            return
        self._need({shard_of(m) for m in metrics})

    def need_all(self) -> None:
        """Read every shard of every series file not read yet."""
        if not self.fully_loaded():
            self._need(None)

    def need_series(self, series_ids: Iterable[int]) -> None:
        """Read the shards of these series (every shard when one of them is not known yet:
        its metric, and so its shard, is what a series file says)."""
        if self.fully_loaded():
            return
        by_id = self._by_id
        metrics = set()
        for sid in series_ids:
            info = by_id.get(sid)
            if info is None:
                self._need(None)
                return
            metrics.add(info.metric)
        self._need({shard_of(m) for m in metrics})

    def _need(self, shards: set[int] | None) -> None:
        if self._loader is None:
            return
        with self._load_lock:
            todo: dict[str, set[int] | None] = dict.fromkeys(sorted(self._pending_whole))
            pending = set(self._pending)
            wanted = sorted(pending if shards is None else shards & pending)
            for shard in wanted:
                for path in sorted(self._pending[shard]):
                    want = todo.setdefault(path, set())
                    if want is not None:
                        want.add(shard)
            for path, want in todo.items():
                table = self._loader(path, None if want is None else tuple(sorted(want)), None)
                self.load_table(table)
                self.files_read += 1
                if want is None:
                    self._pending_whole.discard(path)
                    self._file_ids.pop(path, None)
                for shard in want or ():
                    self._pending[shard].discard(path)
                    if not self._pending[shard]:
                        del self._pending[shard]
                if want is not None and not any(path in p for p in self._pending.values()):
                    self._file_ids.pop(path, None)

    def __len__(self) -> int:
        """Distinct series: the ones read, and the ids of files not read yet (their
        ``series_id`` column only, so counting does not parse every series)."""
        if self.fully_loaded() or self._loader is None:
            return len(self._by_id)
        with self._load_lock:
            unread = set(self._pending_whole).union(*self._pending.values())
            for path in unread:
                if path not in self._file_ids:
                    ids = self._loader(path, None, ["series_id"]).column("series_id")
                    self._file_ids[path] = ids.to_pylist()  # (to_numpy imports pandas)
            lists = [self._file_ids[p] for p in unread]
        return len(set(self._by_id).union(*lists))

    def __contains__(self, series_id: int) -> bool:
        if series_id not in self._by_id:
            self.need_all()
        return series_id in self._by_id

    def get(self, series_id: int) -> SeriesInfo:
        info = self._by_id.get(series_id)
        if info is None:
            self.need_all()
            info = self._by_id[series_id]
        return info

    def add(self, series_id: int, metric: str, labels_json: str, kind: str) -> bool:
        """Register a series; False if known. A different series with the same id raises."""
        known = self._by_id.get(series_id)
        if known is not None:
            if known.metric != metric or known.labels_json != labels_json:
                raise _collision(known, metric, labels_json)
            return False
        with self._lock:
            info = SeriesInfo(series_id, metric, json.loads(labels_json), kind, labels_json)
            self._by_id[series_id] = info
            self._by_metric.setdefault(metric, []).append(series_id)
        return True

    def unknown(self, series: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
        """The series not registered yet, after reading their metrics' shards: a series some
        series file holds is known, whichever process wrote it."""
        if not self.fully_loaded():
            self.need_metrics({s[1] for s in series})
        by_id = self._by_id
        return [s for s in series if s[0] not in by_id]

    def check_known(self, series: list[tuple[int, str, str, str]]) -> None:
        """Raise SeriesCollisionError if a known id arrives with another metric or labels."""
        by_id = self._by_id
        for sid, metric, labels_json, _ in series:
            known = by_id.get(sid)
            if known is not None and (known.labels_json != labels_json or known.metric != metric):
                self.add(sid, metric, labels_json, known.kind)  # raises with the full message

    def load(self, rows: Iterable[tuple[int, str, str, str]]) -> None:
        for sid, metric, labels, kind in rows:
            self.add(sid, metric, labels, kind)

    def load_table(self, table: pa.Table) -> None:
        """Register a series file's rows. Every process that opens a vault does this before
        its first answer, so it is one pass: the labels of all rows parsed by one JSON call,
        one lock, spans set directly where a series has none yet."""
        ids, metrics, labels, kinds = (table.column(n).to_pylist() for n in SERIES_SCHEMA.names)
        parsed = json.loads("[" + ",".join(labels) + "]") if labels else []
        if all(c in table.column_names for c in SPAN_COLUMNS):
            firsts = table.column("first_ms").to_pylist()
            lasts = table.column("last_ms").to_pylist()
        else:  # written before series files carried times
            firsts = lasts = [None] * len(ids)
        by_id, by_metric = self._by_id, self._by_metric
        with self._lock:
            for sid, metric, labels_json, kind, label_map in zip(
                ids, metrics, labels, kinds, parsed, strict=True
            ):
                known = by_id.get(sid)
                if known is None:
                    by_id[sid] = SeriesInfo(sid, metric, label_map, kind, labels_json)
                    by_metric.setdefault(metric, []).append(sid)
                elif known.metric != metric or known.labels_json != labels_json:
                    raise _collision(known, metric, labels_json)
        seen, saved = self._seen, self._saved_days
        for sid, first, last in zip(ids, firsts, lasts, strict=True):
            first = UNKNOWN_FIRST if first is None else first
            last = UNKNOWN_LAST if last is None else last
            if sid in seen or sid in saved:
                self._merge_span(sid, first, last, saved=True)
            else:
                seen[sid] = (first, last)
                saved[sid] = (_day(first), _day(last))

    def match(self, selector: Selector | SelectorUnion) -> list[int]:
        if isinstance(selector, SelectorUnion):
            found = [sid for part in selector.parts for sid in self.match(part)]
            return list(dict.fromkeys(found))
        metric = selector.metric
        if metric:
            self.need_metrics((metric,))
        else:
            self.need_all()
        candidates = self._by_metric.get(metric, []) if metric else list(self._by_id)
        return [
            sid
            for sid in candidates
            if selector.matches(self._by_id[sid].metric, self._by_id[sid].labels)
        ]

    def has_series_of(self, metric: str) -> bool:
        """Whether any series of ``metric`` is stored (``match`` of its name, not listed)."""
        self.need_metrics((metric,))
        return bool(self._by_metric.get(metric))

    def set_metric_kinds(self, kinds: dict[str, str]) -> None:
        self._metric_kinds.update(kinds)

    def kind_of_metric(self, metric: str) -> str | None:
        return self._metric_kinds.get(metric)

    def kind(self, series_id: int) -> str:
        """The series' kind: its metric's metadata type if known, else the kind it got when it
        was first written (from ``write(kinds=...)`` or its name)."""
        info = self.get(series_id)
        return self._metric_kinds.get(info.metric, info.kind)

    def is_counter(self, series_id: int) -> bool:
        return self.kind(series_id) == "counter"

    def counters(self) -> list[int]:
        self.need_all()
        return [sid for sid in self._by_id if self.is_counter(sid)]

    def all(self) -> list[SeriesInfo]:
        self.need_all()
        return list(self._by_id.values())

    def to_table(self, series_ids: Iterable[int] | None = None) -> pa.Table:
        infos = self.all() if series_ids is None else [self._by_id[s] for s in series_ids]
        return pa.table(
            {
                "series_id": pa.array([i.series_id for i in infos], pa.int64()),
                "metric": pa.array([i.metric for i in infos], pa.string()),
                "labels": pa.array([i.labels_json for i in infos], pa.string()),
                "kind": pa.array([self.kind(i.series_id) for i in infos], pa.string()),
            },
            schema=SERIES_SCHEMA,
        )

    # ------------------------------------------------------------------ first/last seen
    def _merge_span(self, sid: int, first: int, last: int, saved: bool) -> None:
        old = self._seen.get(sid)
        if old is not None:
            first, last = min(first, old[0]), max(last, old[1])
        self._seen[sid] = (first, last)
        if saved:
            days = (_day(first), _day(last))
            was = self._saved_days.get(sid)
            if was is not None:
                days = (min(days[0], was[0]), max(days[1], was[1]))
            self._saved_days[sid] = days

    def spans_to_save(self, ids: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """A mask over ``ids``: the series whose flushed span (``first``/``last``, this
        flush's) the series files do not cover to the day yet."""
        saved = self._saved_days
        out = np.ones(len(ids), dtype=bool)
        first_day, last_day = first // DAY_MS, last // DAY_MS
        for i, sid in enumerate(ids.tolist()):
            days = saved.get(sid)
            if days is not None and days[0] <= first_day[i] and last_day[i] <= days[1]:
                out[i] = False
        return out

    def observe(
        self, ids: np.ndarray, first: np.ndarray, last: np.ndarray, saved: np.ndarray
    ) -> None:
        """Record a committed flush's spans; ``saved`` marks those its series file holds."""
        with self._lock:
            for sid, f, la, s in zip(
                ids.tolist(), first.tolist(), last.tolist(), saved.tolist(), strict=True
            ):
                self._merge_span(sid, f, la, s)

    def span(self, series_id: int) -> tuple[int, int] | None:
        """First and last flushed sample (ms; the UNKNOWN_* bounds when no file said), or
        None for a series not flushed yet."""
        return self._seen.get(series_id)

    def seen_between(self, series_id: int, start_ms: int, end_ms: int) -> bool:
        """Whether the series has samples on a UTC day overlapping ``[start_ms, end_ms]``.
        A series not flushed yet is being written now: present."""
        span = self._seen.get(series_id)
        if span is None:
            return True
        first, last = span
        return first // DAY_MS * DAY_MS <= end_ms and start_ms < (last // DAY_MS + 1) * DAY_MS

    def file_rows(self) -> pa.Table:
        """Every series a series file holds (read before: ``need_all``), with the widest span
        known here: the rows of one file that replaces them all (maintenance's merge)."""
        empty = np.empty(0, np.int64)
        return self.flush_rows(empty, empty, empty, SERIES_SCHEMA.empty_table(), everything=True)

    def flush_rows(
        self,
        ids: np.ndarray,
        first: np.ndarray,
        last: np.ndarray,
        new_series: pa.Table,
        everything: bool = False,
    ) -> pa.Table:
        """The series file a flush writes: every row of ``new_series`` (the series its buffer
        registered) and the known series among ``ids`` (with this flush's ``first``/``last``),
        each with the widest span known here; unknown times as nulls. ``everything`` adds
        every series a series file already holds (a file that replaces them all)."""
        rows: dict[int, tuple[str, str, str]] = {}
        names = SERIES_SCHEMA.names
        cols = [new_series.column(n).to_pylist() for n in names]
        for sid, metric, labels, kind in zip(*cols, strict=True):
            rows[sid] = (metric, labels, kind)
        seen = self._seen
        spans: dict[int, tuple[int, int]] = {}
        for sid, f, la in zip(ids.tolist(), first.tolist(), last.tolist(), strict=True):
            old = seen.get(sid)
            spans[sid] = (f, la) if old is None else (min(f, old[0]), max(la, old[1]))
            if sid not in rows:
                info = self._by_id[sid]
                rows[sid] = (info.metric, info.labels_json, info.kind)
        if everything:  # one file to replace all series files: every series they hold
            for sid in self._saved_days:
                if sid not in rows:
                    info = self._by_id[sid]
                    rows[sid] = (info.metric, info.labels_json, info.kind)
        order = list(rows)
        known = [spans.get(sid, seen.get(sid)) for sid in order]
        return pa.table(
            {
                "series_id": pa.array(order, pa.int64()),
                "metric": pa.array([rows[s][0] for s in order], pa.string()),
                "labels": pa.array([rows[s][1] for s in order], pa.string()),
                "kind": pa.array([rows[s][2] for s in order], pa.string()),
                "first_ms": pa.array(
                    [None if k is None or k[0] == UNKNOWN_FIRST else k[0] for k in known],
                    pa.int64(),
                ),
                "last_ms": pa.array(
                    [None if k is None or k[1] == UNKNOWN_LAST else k[1] for k in known],
                    pa.int64(),
                ),
            }
        )


def sharded_file(rows: pa.Table) -> tuple[bytes, tuple[int, ...]]:
    """A series file (layout 2) of ``rows`` (``flush_rows``' columns): sorted by shard and
    series id, a ``shard`` column, one row group per shard; and the shards it holds."""
    metrics = rows.column("metric").to_pylist()
    shard = np.fromiter((shard_of(m) for m in metrics), np.int16, len(metrics))
    order = np.lexsort((rows.column("series_id").to_numpy(), shard))
    table = rows.take(pa.array(order)).append_column(SHARD_COLUMN, pa.array(shard[order]))
    table = table.replace_schema_metadata({SERIES_LAYOUT_KEY: str(SERIES_LAYOUT).encode()})
    shards, starts = np.unique(shard[order], return_index=True)
    ends = [*starts[1:].tolist(), len(order)]
    sink = io.BytesIO()
    # Statistics of the shard column only (read_shards picks row groups by them): those of
    # the labels' JSON were most of a small file's footer, which every process reads before
    # its first answer; no dictionary pages, which a row group of a shard's few series
    # (and zstd beside them) does not repay.
    with pq.ParquetWriter(
        sink,
        table.schema,
        compression="zstd",
        write_page_checksum=True,
        write_statistics=[SHARD_COLUMN],
        use_dictionary=False,
    ) as writer:
        for lo, hi in zip(starts.tolist(), ends, strict=True):
            writer.write_table(table.slice(lo, hi - lo), row_group_size=max(hi - lo, 1))
    return sink.getvalue(), tuple(int(x) for x in shards)


def read_shards(
    parquet: pq.ParquetFile, shards: tuple[int, ...] | None, columns: list[str] | None = None
) -> pa.Table:
    """The rows of ``shards`` (None: all) of an open series file: only the row groups whose
    ``shard`` statistics say they hold one of them; a layout-1 file is read whole."""
    meta = parquet.metadata
    names = parquet.schema_arrow.names
    if shards is None or SHARD_COLUMN not in names:
        return parquet.read(columns=columns)
    col = names.index(SHARD_COLUMN)
    wanted = set(shards)
    groups, mixed = [], False
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(col).statistics
        if stats is None or not stats.has_min_max:
            groups.append(i)  # no statistics: read it, filter below
            mixed = True
        elif any(stats.min <= s <= stats.max for s in wanted):
            groups.append(i)
            mixed |= stats.min != stats.max
    keep = columns or [n for n in names if n != SHARD_COLUMN]
    # A few shards' rows are read on this thread: handing each column to Arrow's thread pool
    # costs more than decoding it, and on a busy machine waits for a core (a fresh process's
    # first query, one shard: 1.2 ms alone, 5-6 ms median through the pool at load 10).
    threads = sum(meta.row_group(i).num_rows for i in groups) > THREADED_ROWS
    if not mixed:  # a row group per shard (as sharded_file writes): nothing to filter
        return parquet.read_row_groups(groups, columns=keep, use_threads=threads)
    # (numpy and Arrow arrays from Python import pandas, which a vault's open avoids: only
    # files this version did not write get here)
    with_shard = list(dict.fromkeys([*keep, SHARD_COLUMN]))
    table = parquet.read_row_groups(groups, columns=with_shard, use_threads=threads)
    mask = np.isin(table.column(SHARD_COLUMN).to_numpy(), list(wanted))
    return table.filter(pa.array(mask)).select(keep)


def _day(ms: int) -> int:
    return ms // DAY_MS


def series_spans(series_id: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per series of samples sorted by ``(series_id, ts)``: ids, first ts, last ts."""
    if not len(series_id):
        empty = np.empty(0, np.int64)
        return empty, empty, empty
    starts = np.flatnonzero(np.r_[True, series_id[1:] != series_id[:-1]])
    ends = np.r_[starts[1:], len(series_id)] - 1
    return series_id[starts], ts[starts], ts[ends]


def _collision(known: SeriesInfo, metric: str, labels_json: str) -> SeriesCollisionError:
    return SeriesCollisionError(
        f"series id {known.series_id} already belongs to {known.metric}{known.labels_json}; "
        f"{metric}{labels_json} hashes to the same 64-bit id. Nothing was written. "
        "Add a distinguishing label to one of them and report this (it is a "
        "one-in-2^64 event per pair)"
    )
