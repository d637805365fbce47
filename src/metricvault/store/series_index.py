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
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metricvault.errors import SeriesCollisionError
from metricvault.model import SERIES_SCHEMA, TIER_RESOLUTION_MS
from metricvault.selector import Selector, SelectorUnion

DAY_MS = 24 * TIER_RESOLUTION_MS["1h"]
UNKNOWN_FIRST = -(2**63)  # a series from a file without times: seen since always
UNKNOWN_LAST = 2**63 - 1  # ... and until now
SPAN_COLUMNS = ("first_ms", "last_ms")  # the series files' extra, nullable columns


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    series_id: int
    metric: str
    labels: dict[str, str]
    kind: str
    labels_json: str


class SeriesIndex:
    def __init__(self) -> None:
        self._by_id: dict[int, SeriesInfo] = {}
        self._by_metric: dict[str, list[int]] = {}
        self._metric_kinds: dict[str, str] = {}  # from exposition metadata; wins over names
        self._lock = threading.Lock()
        # first/last flushed sample per series (ms) as far as this process knows, and the
        # UTC days the series files already say (a row is written again when they widen)
        self._seen: dict[int, tuple[int, int]] = {}
        self._saved_days: dict[int, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, series_id: int) -> bool:
        return series_id in self._by_id

    def get(self, series_id: int) -> SeriesInfo:
        return self._by_id[series_id]

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
        candidates = self._by_metric.get(metric, []) if metric else list(self._by_id)
        return [
            sid
            for sid in candidates
            if selector.matches(self._by_id[sid].metric, self._by_id[sid].labels)
        ]

    def set_metric_kinds(self, kinds: dict[str, str]) -> None:
        self._metric_kinds.update(kinds)

    def kind_of_metric(self, metric: str) -> str | None:
        return self._metric_kinds.get(metric)

    def kind(self, series_id: int) -> str:
        """The series' kind: its metric's metadata type if known, else the kind it got when it
        was first written (from ``write(kinds=...)`` or its name)."""
        info = self._by_id[series_id]
        return self._metric_kinds.get(info.metric, info.kind)

    def is_counter(self, series_id: int) -> bool:
        return self.kind(series_id) == "counter"

    def counters(self) -> list[int]:
        return [sid for sid in self._by_id if self.is_counter(sid)]

    def all(self) -> list[SeriesInfo]:
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
