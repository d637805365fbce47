"""A query-result cache for ``query_range``: a dashboard refresh recomputes only its newest steps.

A Grafana panel refreshing every 30 s asks the same query at the same step over a range moved
forward by a few steps. Each step of a range query is evaluated on its own (PromQL has no state
between steps), so the steps the previous answer already holds are still right as long as no
sample they read changed. As VictoriaMetrics's rollup-result cache does, the cache keeps each
answer's *settled* steps (those at least ``settle_ms`` older than the wall clock: samples still
arrive for the newest ones) and on the next request evaluates only the steps after them.

What decides whether a cached answer still holds is the store's catalog version (the files the
reads see: queries read only what a flush committed), compared file by file with the version
the answer was computed from:

- files removed, rollup files added, the raw horizon or the metric kinds changed: maintenance
  (compaction, rollups, retention, a kind change) ran, and every cached answer of that vault is
  dropped;
- raw files added whose oldest sample is not after the answer's last settled step: late data
  (a sample older than the cached end arrived through the write path), the answer is dropped;
- raw files added whose samples are all newer: an ordinary flush, the answer still holds.

Because the catalog is what every process of a vault shares, this holds across ``serve``
workers and writers in other processes. Keys carry the tenant's matchers, so two tenants never
share an answer. Expressions whose steps read outside their own lookback (an ``@`` modifier, a
negative ``offset``) and instant queries are never cached. Cached points are bounded
(``max_points``, least recently used first out).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import promql_parser as pp

from metricvault.errors import PromQLError
from metricvault.promql.parse import duration_ms, parse, post_order
from metricvault.promql.points_json import format_series
from metricvault.promql.values import QueryResult

SETTLE_MS = 5 * 60_000  # VictoriaMetrics's -search.cacheTimestampOffset default
MAX_POINTS = 2_000_000  # about 100 MB: 16 B of numbers and ~35 B of JSON text a point
_DUMPS = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
).encode  # as server/prometheus_json.py and Starlette's JSONResponse write


class _File(Protocol):
    @property
    def tier(self) -> str: ...

    @property
    def min_ts(self) -> int: ...

    @property
    def file_id(self) -> int: ...


class CatalogVersion(Protocol):
    """What the cache reads of a store's catalog version (``Snapshot`` in the store)."""

    @property
    def version(self) -> int: ...

    @property
    def vault_id(self) -> str: ...

    @property
    def raw_horizon_ms(self) -> int: ...

    @property
    def files(self) -> Sequence[_File]: ...

    @property
    def metric_kinds(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Version:
    """The part of a catalog version a cached answer depends on."""

    vault_id: str
    version: int
    raw_horizon_ms: int
    kinds: tuple[tuple[str, str], ...]
    raw_ids: frozenset[int]
    other_ids: frozenset[int]

    @classmethod
    def of(cls, snap: CatalogVersion) -> Version:
        raw = frozenset(f.file_id for f in snap.files if f.tier == "raw")
        other = frozenset(f.file_id for f in snap.files if f.tier != "raw")
        kinds = tuple(sorted(snap.metric_kinds.items()))
        return cls(snap.vault_id, snap.version, snap.raw_horizon_ms, kinds, raw, other)


def still_holds(old: Version, snap: CatalogVersion, settled_end_ms: int) -> bool:
    """Whether an answer computed at ``old`` is still right at ``snap`` for its steps up to
    ``settled_end_ms``: only raw files were added since, each newer than that step."""
    if snap.version == old.version and snap.vault_id == old.vault_id:
        return True
    if snap.vault_id != old.vault_id or snap.raw_horizon_ms != old.raw_horizon_ms:
        return False
    if tuple(sorted(snap.metric_kinds.items())) != old.kinds:
        return False
    raw_now: set[int] = set()
    for f in snap.files:
        if f.tier != "raw":
            if f.file_id not in old.other_ids:
                return False  # a rollup run
            continue
        raw_now.add(f.file_id)
        if f.file_id not in old.raw_ids and f.min_ts <= settled_end_ms:
            return False  # late data: a sample a cached step may read
    other_now = sum(1 for f in snap.files if f.tier != "raw")
    # anything removed: compaction, rollups replacing stale rows, retention
    return old.raw_ids <= raw_now and other_now == len(old.other_ids)


def cacheable(expr: str) -> bool:
    """Whether each step of ``expr`` reads only samples at or before the step: no ``@``
    modifier (its time is the query's, not the step's; ``@ end()`` moves with the range) and
    no negative ``offset`` (it reads after the step)."""
    try:
        tree = parse(expr)
    except (PromQLError, ValueError):  # the evaluation reports it in its own words
        return False
    return all(_step_local(node) for node in post_order(tree))


def _step_local(node: Any) -> bool:
    if isinstance(node, pp.VectorSelector | pp.SubqueryExpr):
        if node.at is not None:
            return False
        if node.offset is not None and duration_ms(node.offset) < 0:
            return False
    return True


Evaluate = Callable[[int, int], tuple[QueryResult, list[str]]]
LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Text:
    """A series' points as the JSON of a Prometheus matrix writes them (``[<s>,"<v>"]``,
    comma-joined), with the offset of each point: a cached point is formatted once, and an
    answer's body joins slices of these strings."""

    text: str
    starts: np.ndarray  # offset of point i; starts[n] = len(text) + 1

    def slice(self, a: int, b: int) -> _Text:
        if b <= a:
            return _EMPTY_TEXT
        if a == 0 and b == self.starts.size - 1:
            return self  # all of it (immutable: shared, not copied)
        lo = int(self.starts[a])
        return _Text(self.text[lo : int(self.starts[b]) - 1], self.starts[a : b + 1] - lo)

    def __add__(self, other: _Text) -> _Text:
        if not self.text:
            return other
        if not other.text:
            return self
        shift = len(self.text) + 1
        return _Text(f"{self.text},{other.text}",
                     np.concatenate([self.starts[:-1], other.starts + shift]))  # fmt: skip


_EMPTY_TEXT = _Text("", np.zeros(1, np.int64))


def _format_series(items: list[tuple[np.ndarray, np.ndarray]]) -> list[_Text]:
    """The JSON of each series' points and where each point starts, the series of an answer
    formatted together (points_json.format_series)."""
    return [
        _Text(text, starts) if text and starts is not None else _EMPTY_TEXT
        for text, starts in format_series(items, with_starts=True)
    ]


def _format_points(ts: np.ndarray, vs: np.ndarray) -> _Text:
    """:func:`_format_series` of one series."""
    return _format_series([(ts, vs)])[0]


@dataclass
class CachedAnswer(QueryResult):
    """A matrix answered through the cache, with each series' points already written as
    JSON (``texts``, in ``series`` order): :meth:`body` is the bytes
    ``server/prometheus_json.answer_body`` writes for the same answer."""

    texts: list[str] = field(default_factory=list)

    def body(self, warnings: list[str]) -> bytes:
        result = ",".join(  # f-strings: see server/prometheus_json.answer_body
            f'{{"metric":{_DUMPS(labels)},"values":[{text}]}}'
            for (labels, _, _), text in zip(self.series, self.texts, strict=True)
        )
        tail = f',"warnings":{_DUMPS(warnings)}' if warnings else ""
        data = f'{{"resultType":"matrix","result":[{result}]}}'
        return f'{{"status":"success","data":{data}{tail}}}'.encode()


@dataclass
class _Entry:
    start_ms: int
    settled_end_ms: int  # the last settled step: points after it are kept, never served
    version: Version
    result_type: str
    series: dict[LabelKey, tuple[np.ndarray, np.ndarray]]
    warnings: list[str]
    served_by: set[str] = field(default_factory=set)
    texts: dict[LabelKey, _Text] = field(default_factory=dict)

    @property
    def points(self) -> int:
        return sum(len(ts) for ts, _ in self.series.values())


@dataclass
class CacheStats:
    hits: int = 0  # answered entirely from the cache
    partial: int = 0  # cached steps reused, the newest ones evaluated
    misses: int = 0  # evaluated in full (nothing cached, or it no longer held)
    invalidated: int = 0  # cached answers dropped because the catalog showed a change
    steps_evaluated: int = 0
    steps_reused: int = 0


class ResultCache:
    """Cached ``query_range`` answers of one store, shared by the queries of every tenant
    (each under its own key)."""

    def __init__(
        self,
        settle_ms: int = SETTLE_MS,
        max_points: int = MAX_POINTS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.settle_ms = settle_ms
        self.max_points = max_points
        self.clock = clock or time.time
        self.stats = CacheStats()
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._points = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def query_range(
        self,
        scope: tuple[Any, ...],
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        catalog: Callable[[], CatalogVersion | None],
        evaluate: Evaluate,
    ) -> tuple[QueryResult, list[str]]:
        """The answer of ``expr`` over ``start_ms..end_ms`` at ``step_ms``, evaluated by
        ``evaluate(start, end)`` for the steps the cache does not hold. ``scope`` names
        what else the answer depends on (the tenant's matchers, the engine's options)."""
        snap = catalog() if cacheable(expr) else None
        if snap is None:
            return evaluate(start_ms, end_ms)
        key = (scope, expr, step_ms, start_ms % step_ms)
        entry = self._lookup(key, snap, start_ms)
        version = entry.version if entry is not None else Version.of(snap)
        if entry is None:
            self.stats.misses += 1
            result, warnings = evaluate(start_ms, end_ms)
            self.stats.steps_evaluated += _steps(start_ms, end_ms, step_ms)
            if result.result_type != "matrix":
                return result, warnings
            merged = _Entry(start_ms, start_ms - step_ms, version, result.result_type,
                            _keyed(result), list(warnings), set(result.served_by))  # fmt: skip
            merged.texts = dict(
                zip(merged.series, _format_series(list(merged.series.values())), strict=True)
            )
        else:
            tail_start = entry.settled_end_ms + step_ms
            # (the entry may hold points after its settled end: those are evaluated anew)
            series, texts = _sliced_with_text(entry, start_ms, min(end_ms, entry.settled_end_ms))
            merged = _Entry(start_ms, entry.settled_end_ms, version, entry.result_type, series,
                            list(entry.warnings), set(entry.served_by), texts)  # fmt: skip
            self.stats.steps_reused += _steps(start_ms, min(end_ms, entry.settled_end_ms), step_ms)
            if tail_start <= end_ms:
                self.stats.partial += 1
                tail, tail_warnings = evaluate(tail_start, end_ms)
                self.stats.steps_evaluated += _steps(tail_start, end_ms, step_ms)
                fresh = _keyed(tail)
                _append(merged.series, fresh)
                for k, text in zip(fresh, _format_series(list(fresh.values())), strict=True):
                    merged.texts[k] = merged.texts.get(k, _EMPTY_TEXT) + text
                merged.warnings += [w for w in tail_warnings if w not in merged.warnings]
                merged.served_by |= tail.served_by
            else:
                self.stats.hits += 1
        keys = sorted(merged.series)
        answer = CachedAnswer(
            merged.result_type,
            [(dict(k), *merged.series[k]) for k in keys],
            warnings=list(merged.warnings),
            served_by=set(merged.served_by),
            texts=[merged.texts[k].text for k in keys],
        )
        self._keep(key, merged, end_ms, step_ms)
        return answer, list(merged.warnings)

    def _lookup(self, key: tuple[Any, ...], snap: CatalogVersion, start_ms: int) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if not still_holds(entry.version, snap, entry.settled_end_ms):
                self._drop(key)
                self.stats.invalidated += 1
                return None
            if not entry.start_ms <= start_ms <= entry.settled_end_ms:
                return None  # a range starting earlier, or after all it holds: evaluate anew
            self._entries.move_to_end(key)
            if entry.version.version != snap.version:  # only newer raw files came
                entry.version = Version.of(snap)  # compare with those next time
            return entry

    def _keep(self, key: tuple[Any, ...], merged: _Entry, end_ms: int, step_ms: int) -> None:
        """Keep the settled steps of ``merged`` (those ``settle_ms`` before now at most)."""
        settled = min(end_ms, int(self.clock() * 1000) - self.settle_ms)
        settled = merged.start_ms + (settled - merged.start_ms) // step_ms * step_ms
        with self._lock:
            self._drop(key)
            if settled < merged.start_ms:
                return
            # the points after ``settled`` stay, unread: a lookup slices to the settled end
            merged.settled_end_ms = settled
            points = merged.points
            if points > self.max_points:
                return
            self._entries[key] = merged
            self._points += points
            while self._points > self.max_points and self._entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[Any, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._points -= entry.points


def _steps(start_ms: int, end_ms: int, step_ms: int) -> int:
    return max(0, (end_ms - start_ms) // step_ms + 1)


def _keyed(result: QueryResult) -> dict[LabelKey, tuple[np.ndarray, np.ndarray]]:
    return {
        tuple(sorted(labels.items())): (np.asarray(ts, np.int64), np.asarray(vs, np.float64))
        for labels, ts, vs in result.series
    }


def _sliced_with_text(
    entry: _Entry, lo: int, hi: int
) -> tuple[dict[LabelKey, tuple[np.ndarray, np.ndarray]], dict[LabelKey, _Text]]:
    """The points of ``entry`` (and their JSON) from ``lo`` to ``hi``, both included."""
    series, texts = {}, {}
    for key, (ts, vs) in entry.series.items():
        n = len(ts)
        if n == 0:
            continue
        # most series lie wholly inside (a kept answer, its newest steps appended): two
        # comparisons instead of two binary searches
        a = 0 if ts[0] >= lo else int(np.searchsorted(ts, lo, "left"))
        b = n if ts[n - 1] <= hi else int(np.searchsorted(ts, hi, "right"))
        if b > a:
            if a == 0 and b == n:
                series[key], texts[key] = (ts, vs), entry.texts[key]
                continue
            series[key] = (ts[a:b], vs[a:b])
            texts[key] = entry.texts[key].slice(a, b)
    return series, texts


def _append(
    into: dict[LabelKey, tuple[np.ndarray, np.ndarray]],
    tail: dict[LabelKey, tuple[np.ndarray, np.ndarray]],
) -> None:
    for key, (ts, vs) in tail.items():
        if key in into:
            old_ts, old_vs = into[key]
            into[key] = (np.concatenate([old_ts, ts]), np.concatenate([old_vs, vs]))
        else:
            into[key] = (ts, vs)
