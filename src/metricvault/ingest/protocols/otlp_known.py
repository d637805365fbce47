"""OTLP's fast path for the usual export: gauges and cumulative sums, series seen before.

A Collector or SDK sends the same series in every export, one data point per series and
metric, so walking each point's attributes in Python (a message, a key and a value each, then
Prometheus's label rules) was most of the decoding time. Here the request is parsed (in C)
through a *twin* schema that hands each data point over as its raw ``bytes``. In the order
every protobuf encoder writes a ``NumberDataPoint`` (fields by number: start time, time, value,
exemplars, attributes, flags), the fixed-size start time, time and value come first; they are
read for all points at once with numpy, and the bytes after them (the attributes) are the key
of a process-wide cache that maps them, per metric name and resource, to the series: labels,
validated and hashed once, the first time they are seen. Resources and scopes are cached by
their bytes the same way.

The result is :class:`FastRows` (one series per row, timestamps, values), which ``to_write``
hands to the store as resolved samples (``Vault.write_resolved``), beside the same
:class:`Points` bookkeeping (kinds, start times, counts) the general path gives. Anything
unusual returns ``None`` and the general path (``otlp_points.Translator``) decides, with its
rules and errors: JSON, histograms, summaries, DELTA sums, a metric without points or a name
that breaks a rule, exemplars, NO_RECORDED_VALUE or other flags, a time out of range, a label
breaking a rule, fields out of the usual order, bytes that are not valid protobuf.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message,
    message_factory,
)
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import LabelError
from metricvault.ingest.protocols.decode_limits import DecodeBudget
from metricvault.ingest.protocols.otlp_names import (
    COUNTER,
    GAUGE,
    NON_MONOTONIC,
    attribute_value,
    metric_name,
)
from metricvault.ingest.protocols.otlp_points import (
    CUMULATIVE,
    IDENTIFYING,
    TARGET_INFO,
    Labels,
    Points,
    StartPoint,
    _labels,
    resource_identity,
)
from metricvault.model import Series, series_key_block

CACHE_MAX = 1 << 18  # series remembered per process: emptied when full (only speed changes)
_BUDGET_EVERY = 64  # metrics between two looks at the decode time budget
_START_TAG, _TIME_TAG = 0x11, 0x19  # fixed64 fields 2 and 3 of NumberDataPoint
_DOUBLE_TAG, _INT_TAG = 0x21, 0x31  # as_double (4, double), as_int (6, sfixed64)
_NS_PER_MS = 1_000_000


def _twin_class() -> Any:
    """``ExportMetricsServiceRequest`` read with resources, scopes and data points as bytes
    (and histograms, summaries and metadata as bytes too: they send a request elsewhere)."""
    package = "metricvault.otlp_twin"
    proto = descriptor_pb2.FileDescriptorProto(
        name="metricvault/otlp_twin.proto", package=package, syntax="proto3"
    )
    fdp = descriptor_pb2.FieldDescriptorProto
    kinds = {
        "bytes": fdp.TYPE_BYTES,
        "string": fdp.TYPE_STRING,
        "bool": fdp.TYPE_BOOL,
        "int32": fdp.TYPE_INT32,  # the wire form of an enum
    }
    schema: dict[str, tuple[tuple[str, str, str, int], ...]] = {
        "Request": (("repeated", "ResourceMetrics", "resource_metrics", 1),),
        "ResourceMetrics": (
            ("", "bytes", "resource", 1),
            ("repeated", "ScopeMetrics", "scope_metrics", 2),
            ("", "string", "schema_url", 3),
        ),
        "ScopeMetrics": (
            ("", "bytes", "scope", 1),
            ("repeated", "Metric", "metrics", 2),
            ("", "string", "schema_url", 3),
        ),
        "Metric": (
            ("", "string", "name", 1),
            ("", "string", "description", 2),
            ("", "string", "unit", 3),
            ("oneof", "Gauge", "gauge", 5),
            ("oneof", "Sum", "sum", 7),
            ("oneof", "bytes", "histogram", 9),
            ("oneof", "bytes", "exponential_histogram", 10),
            ("oneof", "bytes", "summary", 11),
            ("repeated", "bytes", "metadata", 12),
        ),
        "Gauge": (("repeated", "bytes", "data_points", 1),),
        "Sum": (
            ("repeated", "bytes", "data_points", 1),
            ("", "int32", "aggregation_temporality", 2),
            ("", "bool", "is_monotonic", 3),
        ),
    }
    for name, fields in schema.items():
        target = proto.message_type.add(name=name)
        for label, type_name, field_name, number in fields:
            field = target.field.add(name=field_name, number=number)
            field.label = fdp.LABEL_REPEATED if label == "repeated" else fdp.LABEL_OPTIONAL
            if type_name in kinds:
                field.type = kinds[type_name]
            else:
                field.type = fdp.TYPE_MESSAGE
                field.type_name = f".{package}.{type_name}"
            if label == "oneof":
                if not target.oneof_decl:
                    target.oneof_decl.add(name="data")
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Request"))


RequestTwin: Any = _twin_class()


class OtlpSeries:
    """What a data point's attribute bytes mean, for one metric name and resource."""

    __slots__ = ("key", "label_map", "labels", "labels_json", "metric", "names", "series_id")

    def __init__(self, metric: str, labels: Labels, series: Series, key: int) -> None:
        self.key = key  # its rows' SeriesRows keys: 2 * key + the kind's index in KINDS
        self.metric = metric
        self.labels = labels
        self.label_map = dict(labels)
        names = frozenset(self.label_map)
        # for the request's label-name limit; one object per distinct set of names, so that a
        # set of them is built by identity, not by comparing sets
        self.names = _NAME_SETS.setdefault(names, names) if len(_NAME_SETS) < 4096 else names
        self.series_id = series.series_id
        self.labels_json = series.labels_json


_NAME_SETS: dict[frozenset[str], frozenset[str]] = {}  # the first 4,096 label-name sets


def distinct_series(entries: list[OtlpSeries]) -> list[OtlpSeries]:
    """The first row's series of each series id, in the order they first appear."""
    once = list(dict.fromkeys(entries))  # by identity: one OtlpSeries per (metric, labels)
    if len({entry.series_id for entry in once}) == len(once):
        return once
    by_id: dict[int, OtlpSeries] = {}  # two objects of one id: a cache emptied meanwhile
    for entry in entries:
        by_id.setdefault(entry.series_id, entry)
    return list(by_id.values())


@dataclass(frozen=True)
class FastRows:
    """The request's rows, in request order: each row's series, timestamp (ms) and value;
    ``distinct``: its series, once each (``Points.series`` stays empty on this path: hashing
    every label tuple again cost more than the rest of the bookkeeping)."""

    entries: list[OtlpSeries]
    timestamps: Any  # int64
    values: Any  # float64
    distinct: list[OtlpSeries]


class _Resource:
    __slots__ = ("ident", "key", "others")

    def __init__(self, attrs: dict[str, str]) -> None:
        self.ident = resource_identity(attrs)
        self.key = tuple(self.ident.items())
        self.others = {key: value for key, value in attrs.items() if key not in IDENTIFYING}


class OtlpSeriesCache:
    """Bytes -> meaning (resources, scopes, attribute sets), shared by a process's decoders."""

    def __init__(self, max_series: int = CACHE_MAX) -> None:
        self.max_series = max_series
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[bytes, OtlpSeries]] = {}
        self.size = 0
        self.resources: dict[bytes, _Resource] = {}
        self.scopes: set[bytes] = set()
        self.labelled: dict[tuple[str, Labels], OtlpSeries] = {}
        self.lock = threading.Lock()
        self._keys_lock = threading.Lock()
        self._next_key = self._keys_end = 0

    def _key(self) -> int:
        """A number of its own for a new OtlpSeries (blocks of ``max_series`` at a time)."""
        with self._keys_lock:
            if self._next_key == self._keys_end:
                # 2 * key + 1 stays inside the block, whatever its first number
                self._next_key = (series_key_block(2 * self.max_series + 1) + 1) // 2
                self._keys_end = self._next_key + self.max_series
            key = self._next_key
            self._next_key += 1
            return key

    def resource(self, raw: bytes) -> _Resource | None:
        known = self.resources.get(raw)
        if known is not None:
            return known
        try:
            parsed = Resource.FromString(raw)
        except message.DecodeError:
            return None
        try:
            entry = _Resource({kv.key: attribute_value(kv.value) for kv in parsed.attributes})
        except (LabelError, ValueError):
            return None
        with self.lock:
            if len(self.resources) >= 4096:
                self.resources.clear()
            self.resources[raw] = entry
        return entry

    def scope(self, raw: bytes) -> bool:
        if raw in self.scopes:
            return True
        try:
            InstrumentationScope.FromString(raw)
        except message.DecodeError:
            return False
        with self.lock:
            if len(self.scopes) >= 4096:
                self.scopes.clear()
            self.scopes.add(raw)
        return True

    def table(self, base: str, resource: _Resource) -> dict[bytes, OtlpSeries]:
        key = (base, resource.key)
        table = self.series.get(key)
        if table is None:
            with self.lock:
                table = self.series.setdefault(key, {})
        return table

    def learn(
        self, table: dict[bytes, OtlpSeries], base: str, ident: dict[str, str], raw: bytes
    ) -> OtlpSeries | None:
        """The series of a point whose bytes after its value are ``raw``; None if those
        bytes hold anything but attributes in canonical form, or the labels break a rule."""
        try:
            parsed = NumberDataPoint.FromString(raw)
        except message.DecodeError:
            return None
        if (
            parsed.start_time_unix_nano
            or parsed.time_unix_nano
            or parsed.WhichOneof("value")
            or parsed.exemplars
            or parsed.flags
            or parsed.ByteSize() != len(raw)  # an explicit default: not the canonical form
        ):
            return None
        try:
            pairs = [(kv.key, attribute_value(kv.value)) for kv in parsed.attributes]
            labels = _labels(pairs, ident)
        except (LabelError, ValueError):
            return None
        entry = self.labelled_series(base, labels)
        if entry is None:
            return None
        with self.lock:
            if self.size >= self.max_series:
                for known in self.series.values():
                    known.clear()  # a decoder may hold one of these tables: empty, not dropped
                self.series.clear()
                self.labelled.clear()
                self.size = 0
            table[raw] = entry
            self.size += 1
        return entry

    def labelled_series(self, metric: str, labels: Labels) -> OtlpSeries | None:
        """The series of (metric, labels), validated and hashed once; None if invalid."""
        key = (metric, labels)
        entry = self.labelled.get(key)
        if entry is None:
            try:
                series = Series.make(metric, dict(labels))
            except (LabelError, ValueError):
                return None
            made = OtlpSeries(metric, labels, series, self._key())  # a key unused if it loses
            entry = self.labelled.setdefault(key, made)
        return entry


SERIES_CACHE = OtlpSeriesCache()


class _Fallback(Exception):
    """Something the fast path does not handle: the general path decodes the request."""


def decode_fast(
    raw: bytes, budget: DecodeBudget, cache: OtlpSeriesCache = SERIES_CACHE
) -> tuple[Points, FastRows] | None:
    """The protobuf request's points and rows, or None for the general path."""
    request = RequestTwin()
    try:
        request.ParseFromString(raw)
    except message.DecodeError:
        return None
    try:
        return _Walk(cache, budget).request(request)
    except _Fallback:
        return None


class _Walk:
    """Two passes: the request's structure (metrics and their points, in order), then the
    points of all metrics read at once (numpy's per-call cost is paid once per request)."""

    def __init__(self, cache: OtlpSeriesCache, budget: DecodeBudget) -> None:
        self.cache = cache
        self.budget = budget
        self.out = Points()
        self.points: list[bytes] = []
        # in request order: (base, kind, resource, first point, end) per metric, and
        # (None, "", resource, 0, 0) after each resource's metrics
        self.segments: list[tuple[str | None, str, _Resource, int, int]] = []

    def request(self, request: Any) -> tuple[Points, FastRows]:
        for resource_metrics in request.resource_metrics:
            self.resource(resource_metrics)
        if not self.points:
            raise _Fallback  # nothing to store: the general path words any notes
        self.budget.check(f"{len(self.points):,} data points")
        starts_ns, times_ns, values, keys = _columns(self.points)
        ts_ms = times_ns // _NS_PER_MS
        entries: list[OtlpSeries] = []
        latest_ns = 0
        out = self.out
        for base, kind, resource, first, end in self.segments:
            if base is None:  # the end of a resource's metrics
                if latest_ns and resource.others and resource.ident:
                    entries.append(self._target_info(resource))
                latest_ns = 0
                continue
            learned = self._series(base, resource, keys[first:end])
            out.points += end - first
            out.kinds[base] = "counter" if kind == COUNTER else "gauge"
            entries.extend(learned)
            latest_ns = max(latest_ns, int(times_ns[first:end].max()))
            if kind == COUNTER:
                self._starts(learned, starts_ns[first:end], ts_ms[first:end])
        distinct = distinct_series(entries)
        if len(entries) == len(self.points):  # no target_info rows: the columns as they are
            return out, FastRows(entries, ts_ms, values, distinct)
        in_order = _in_row_order(self.segments, ts_ms, values, entries)
        return out, FastRows(entries, *in_order, distinct)

    def resource(self, resource_metrics: Any) -> None:
        resource = self.cache.resource(resource_metrics.resource)
        if resource is None:
            raise _Fallback
        for scope_metrics in resource_metrics.scope_metrics:
            if not self.cache.scope(scope_metrics.scope):
                raise _Fallback
            for metric in scope_metrics.metrics:
                self.metric(metric, resource)
        self.segments.append((None, "", resource, 0, 0))

    def _target_info(self, resource: _Resource) -> OtlpSeries:
        try:
            labels = _labels(resource.others.items(), resource.ident)
        except (LabelError, ValueError):
            raise _Fallback from None
        entry = self.cache.labelled_series(TARGET_INFO, labels)
        if entry is None:
            raise _Fallback  # the general path notes why target_info is left out
        self.out.kinds[TARGET_INFO] = "gauge"
        return entry

    def metric(self, metric: Any, resource: _Resource) -> None:
        """Note one metric and its points."""
        which = metric.WhichOneof("data")
        if which == "gauge":
            kind, data = GAUGE, metric.gauge
        elif which == "sum" and metric.sum.aggregation_temporality == CUMULATIVE:
            data = metric.sum
            kind = COUNTER if data.is_monotonic else NON_MONOTONIC
        else:
            raise _Fallback  # no data, histograms, summaries, DELTA or unknown temporality
        if metric.metadata or not metric.name:
            raise _Fallback
        if not len(self.segments) % _BUDGET_EVERY:
            self.budget.check(f"{len(self.points):,} data points")
        try:
            base = metric_name(metric.name, metric.unit, kind)
        except LabelError:
            raise _Fallback from None
        if not base:
            raise _Fallback
        first = len(self.points)
        self.points.extend(data.data_points)
        if len(self.points) == first:
            raise _Fallback
        self.segments.append((base, kind, resource, first, len(self.points)))

    def _series(self, base: str, resource: _Resource, keys: list[bytes]) -> list[OtlpSeries]:
        table = self.cache.table(base, resource)
        with self.cache.lock:
            entries = [table.get(key) for key in keys]
        if None in entries:
            for number, entry in enumerate(entries):
                if entry is None:
                    entry = self.cache.learn(table, base, resource.ident, keys[number])
                    if entry is None:
                        raise _Fallback  # the general path names the rule it breaks
                    entries[number] = entry
        return entries  # type: ignore[return-value]  # no None is left

    def _starts(self, entries: list[OtlpSeries], starts_ns: Any, ts_ms: Any) -> None:
        """A candidate zero sample per counter point with a start time (as the general
        path's ``Translator._start``)."""
        start_ms = starts_ns // _NS_PER_MS
        wanted = (starts_ns != 0) & (start_ms >= MIN_TS_MS) & (start_ms <= ts_ms)
        for number in np.flatnonzero(wanted).tolist():
            entry = entries[number]
            key = (entry.metric, entry.labels)
            zeros = (key,) if start_ms[number] < ts_ms[number] else ()
            self.out.starts.append(StartPoint(key, int(starts_ns[number]), zeros))


def _in_row_order(
    segments: list[tuple[str | None, str, _Resource, int, int]],
    ts_ms: Any,
    values: Any,
    entries: list[OtlpSeries],
) -> tuple[Any, Any]:
    """Timestamps and values with each resource's target_info row after its metrics' rows."""
    timestamps: list[Any] = []
    row_values: list[Any] = []
    latest_ms = -1
    for base, _, resource, first, end in segments:
        if base is None:
            if latest_ms >= 0 and resource.others and resource.ident:
                timestamps.append(np.array([latest_ms], dtype=np.int64))
                row_values.append(np.ones(1, dtype=np.float64))
            latest_ms = -1
            continue
        timestamps.append(ts_ms[first:end])
        row_values.append(values[first:end])
        latest_ms = max(latest_ms, int(ts_ms[first:end].max()))
    out_ts, out_values = np.concatenate(timestamps), np.concatenate(row_values)
    assert len(out_ts) == len(entries)
    return out_ts, out_values


def _columns(points: list[bytes]) -> tuple[Any, Any, Any, list[bytes]]:
    """(start ns, time ns, value, attribute bytes) of every point, read with numpy; raises
    ``_Fallback`` unless every point starts [start time,] time, value."""
    count = len(points)
    joined = b"".join(points)
    buffer = np.frombuffer(joined + bytes(32), dtype=np.uint8)
    lengths = np.fromiter(map(len, points), dtype=np.int64, count=count)
    ends = np.cumsum(lengths)
    begins = ends - lengths
    has_start = buffer[begins] == _START_TAG
    at = begins + np.where(has_start, 9, 0)
    value_tag = buffer[at + 9]
    is_int = value_tag == _INT_TAG
    if (
        (buffer[at] != _TIME_TAG).any()
        or not ((value_tag == _DOUBLE_TAG) | is_int).all()
        or (at + 18 > ends).any()
    ):
        raise _Fallback
    offsets = np.arange(8, dtype=np.int64)
    starts_ns = np.where(has_start, _fixed64(buffer, begins + 1, offsets), np.uint64(0))
    times_ns = _fixed64(buffer, at + 1, offsets)
    raw_values = buffer[(at + 10)[:, None] + offsets].copy()
    values = raw_values.view("<f8").reshape(count)
    if is_int.any():
        as_int = raw_values.view("<i8").reshape(count).astype(np.float64)
        values = np.where(is_int, as_int, values)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if (times_ns == 0).any():
        raise _Fallback
    ms = times_ns // _NS_PER_MS
    if (ms < MIN_TS_MS).any() or (ms > MAX_TS_MS).any():
        raise _Fallback  # the general path rejects those points one by one
    key_starts = (at + 18).tolist()
    keys = [joined[a:b] for a, b in zip(key_starts, ends.tolist(), strict=True)]
    return starts_ns.astype(np.int64), times_ns.astype(np.int64), values, keys


def _fixed64(buffer: Any, where: Any, offsets: Any) -> Any:
    """The little-endian uint64 at each position of ``where``."""
    return buffer[where[:, None] + offsets].copy().view("<u8").reshape(len(where))
