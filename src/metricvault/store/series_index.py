"""The series table in memory: series_id -> (metric, labels, kind), with collision detection."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from metricvault.errors import SeriesCollisionError
from metricvault.model import SERIES_SCHEMA
from metricvault.selector import Selector, SelectorUnion


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
                raise SeriesCollisionError(
                    f"series id {series_id} already belongs to {known.metric}{known.labels_json}; "
                    f"{metric}{labels_json} hashes to the same 64-bit id. Nothing was written. "
                    "Add a distinguishing label to one of them and report this (it is a "
                    "one-in-2^64 event per pair)"
                )
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
        cols = [table.column(n).to_pylist() for n in SERIES_SCHEMA.names]
        self.load(zip(*cols, strict=True))

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
