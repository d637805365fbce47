"""OTLP metrics -> Prometheus samples, as Prometheus's OTLP receiver translates them.

Per metric type (``storage/remote/otlptranslator/prometheusremotewrite``):

- gauge: one sample per point, ``as_double`` or ``as_int``;
- sum: monotonic -> a counter named ``..._total``; non-monotonic -> a gauge; CUMULATIVE points
  are samples as they are, DELTA points are handed on (:class:`DeltaPoint`) to be added up per
  stream (``otlp_streams``);
- histogram (explicit buckets): ``_bucket{le}`` with cumulative counts, the last
  ``le="+Inf"`` equal to ``count``, ``_sum`` (when the point has one) and ``_count``;
- exponential histogram: converted to the same classic series *exactly*, at power-of-two
  bounds: buckets are merged down to scale 0 (or kept at a coarser scale), so every ``le`` is
  a power of two that a float holds exactly and each count is the true number of observations
  at or below it; the zero bucket is ``le=<zero_threshold>``. Points with observations in
  negative buckets are rejected: their counts cannot be written as "at or below" exactly;
- summary: ``{quantile}`` series, ``_sum`` and ``_count``;
- a point flagged NO_RECORDED_VALUE becomes Prometheus's staleness marker in every series of it.

Labels: the point's attributes (sanitised; keys that collide after sanitising have their
values joined with ``;`` in key order), then ``job`` (``service.namespace/service.name``) and
``instance`` (``service.instance.id``) from the resource. The other resource attributes go to a
``target_info`` gauge (value 1, with ``job`` and ``instance``) at the resource's latest
timestamp, when the resource has any. Scope name and version add no labels (Prometheus's
default, ``promote_scope_metadata: false``). Timestamps: ns -> ms (floored).

A start time (``start_time_unix_nano``) of a cumulative counter, histogram or summary is kept
as a candidate zero sample (Prometheus's ``created-timestamp-zero-ingestion``): the stream
state stores it once per start, so a restarted application reads as a counter reset even when
its new count passes the old one.

Points that break a rule are left out one by one and counted, with the first reason, for the
reply's ``partial_success``; the rest of the request is kept.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import LabelError
from metricvault.ingest.protocols.decode_limits import DecodeBudget
from metricvault.ingest.protocols.otlp_names import (
    COUNTER as COUNTER,
)
from metricvault.ingest.protocols.otlp_names import (
    GAUGE,
    NON_MONOTONIC,
    SUMMARY,
    attribute_value,
    go_float,
    label_name,
    metric_name,
)
from metricvault.ingest.protocols.otlp_names import (
    HISTOGRAM as HISTOGRAM,
)
from metricvault.model import STALE_NAN_BITS, Series

Labels = tuple[tuple[str, str], ...]
CUMULATIVE, DELTA = 2, 1
NO_RECORDED_VALUE = 1
IDENTIFYING = ("service.namespace", "service.name", "service.instance.id")
TARGET_INFO = "target_info"
_BUDGET_EVERY = 256  # data points between two looks at the decode time budget
# Per process, bounded (emptied when full): attributes -> labels, and whether a series passes
# the store's rules. They hold facts about strings only, so they never change a result; a
# cluster's series recur in every export, and this work was half the decoding time.
_CACHE_MAX = 200_000
_LABELS: dict[Any, Labels] = {}
_VALID: dict[tuple[str, Labels], str | None] = {}
_UNSEEN = "unseen"


_STALE_BYTES = STALE_NAN_BITS.to_bytes(8, "little")
STALE_NAN: float = struct.unpack("<d", _STALE_BYTES)[0]


def resource_identity(attrs: dict[str, str]) -> dict[str, str]:
    """``job`` (``service.namespace/service.name``) and ``instance`` (``service.instance.id``)
    of a resource, as Prometheus's OTLP receiver names them; an empty value is no label."""
    ident: dict[str, str] = {}
    if "service.name" in attrs:
        job = attrs["service.name"]
        if "service.namespace" in attrs:
            job = f"{attrs['service.namespace']}/{job}"
        ident["job"] = job
    if "service.instance.id" in attrs:
        ident["instance"] = attrs["service.instance.id"]
    return {name: value for name, value in ident.items() if value}


class _PointProblem(Exception):
    """One data point (or metric) is left out; the message says why."""


@dataclass
class Hist:
    """A histogram as non-cumulative bucket counts keyed by upper bound (``inf`` last)."""

    count: int
    total: float | None  # the sum, None when the point has none
    buckets: dict[float, int]
    layout: tuple[Any, ...]  # explicit bounds, or ("exponential", zero_threshold)

    def plus(self, other: Hist) -> Hist:
        buckets = dict(self.buckets)
        for bound, count in other.buckets.items():
            buckets[bound] = buckets.get(bound, 0) + count
        total = None if self.total is None or other.total is None else self.total + other.total
        return Hist(self.count + other.count, total, buckets, self.layout)


@dataclass(frozen=True)
class DeltaPoint:
    """A DELTA sum or histogram point, to be added to its stream's running total."""

    key: tuple[str, Labels]  # (base metric name, labels): the Prometheus series identity
    kind: str  # COUNTER, NON_MONOTONIC or HISTOGRAM
    start_ns: int
    time_ns: int
    value: float | Hist | None  # None: NO_RECORDED_VALUE (the stream ends)


@dataclass(frozen=True)
class StartPoint:
    """A candidate zero sample at a cumulative stream's start time."""

    key: tuple[str, Labels]
    start_ns: int
    rows: tuple[tuple[str, Labels], ...]  # the series that get a 0 at start_ns


@dataclass
class Points:
    """What one request translates to: rows, delta points, start candidates, rejections."""

    metrics: list[str] = field(default_factory=list)
    labels: list[Labels] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    deltas: list[DeltaPoint] = field(default_factory=list)
    starts: list[StartPoint] = field(default_factory=list)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    exemplars: int = 0
    points: int = 0
    series: set[tuple[str, Labels]] = field(default_factory=set)

    def add(self, metric: str, labels: Labels, ts_ms: int, value: float) -> None:
        self.metrics.append(metric)
        self.labels.append(labels)
        self.timestamps.append(ts_ms)
        self.values.append(value)
        self.series.add((metric, labels))

    def reject(self, count: int, reason: str) -> None:
        self.rejected += count
        if len(self.reasons) < 3:
            self.reasons.append(reason)

    def note(self, reason: str) -> None:
        """A problem that rejects no data point the client sent (target_info)."""
        if len(self.reasons) < 3:
            self.reasons.append(reason)


def hist_rows(base: str, labels: Labels, hist: Hist) -> Iterable[tuple[str, Labels, float]]:
    """The classic series of a histogram: cumulative ``_bucket``s, ``_sum``, ``_count``."""
    running = 0
    for bound in sorted(hist.buckets):
        if math.isinf(bound):
            continue
        running += hist.buckets[bound]
        yield f"{base}_bucket", _with(labels, "le", go_float(bound)), float(running)
    yield f"{base}_bucket", _with(labels, "le", "+Inf"), float(hist.count)
    if hist.total is not None:
        yield f"{base}_sum", labels, hist.total
    yield f"{base}_count", labels, float(hist.count)


def _with(labels: Labels, name: str, value: str) -> Labels:
    return tuple(sorted((*(pair for pair in labels if pair[0] != name), (name, value))))


class Translator:
    """Walks one ``ExportMetricsServiceRequest`` into :class:`Points`."""

    def __init__(self, budget: DecodeBudget) -> None:
        self.budget = budget
        self.out = Points()
        self._valid = _VALID  # shared by requests: the same series come every export

    def request(self, request: Any) -> Points:
        for resource_metrics in request.resource_metrics:
            self.resource(resource_metrics)
        return self.out

    # ------------------------------------------------------------------ resource
    def resource(self, resource_metrics: Any) -> None:
        attrs = {kv.key: attribute_value(kv.value) for kv in resource_metrics.resource.attributes}
        ident = resource_identity(attrs)
        before = len(self.out.timestamps)
        latest_ns = 0
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                latest_ns = max(latest_ns, self.metric(metric, ident))
        if len(self.out.timestamps) == before and not latest_ns:
            return
        self.target_info(attrs, ident, latest_ns)

    def target_info(self, attrs: dict[str, str], ident: dict[str, str], latest_ns: int) -> None:
        others = {key: value for key, value in attrs.items() if key not in IDENTIFYING}
        if not others or not ident or not latest_ns:
            return  # only job/instance: Prometheus adds no target_info
        try:
            labels = _labels(others.items(), ident)
            self._check(TARGET_INFO, labels)
        except (LabelError, _PointProblem) as exc:
            self.out.note(f"target_info of resource {ident}: {exc}; not stored")
            return
        self.out.kinds[TARGET_INFO] = "gauge"
        self.out.add(TARGET_INFO, labels, latest_ns // 1_000_000, 1.0)

    # ------------------------------------------------------------------ metrics
    def metric(self, metric: Any, ident: dict[str, str]) -> int:
        """Translate one metric; the latest point time it had (ns), for target_info."""
        which = metric.WhichOneof("data")
        points = list(getattr(metric, which).data_points) if which else []
        self.out.points += len(points)
        shown = repr(metric.name) if metric.name else "(no name)"
        if which is None:
            self.out.note(f"metric {shown} has no data (gauge, sum, histogram, ...); skipped")
            return 0
        kind = _kind(which, metric)
        temporality = getattr(getattr(metric, which), "aggregation_temporality", CUMULATIVE)
        if which in ("sum", "histogram", "exponential_histogram") and temporality not in (
            CUMULATIVE,
            DELTA,
        ):
            self.out.reject(
                len(points),
                f"metric {shown}: aggregation temporality {temporality} is neither DELTA (1) "
                "nor CUMULATIVE (2)",
            )
            return 0
        try:
            base = metric_name(metric.name, metric.unit, kind) if metric.name else ""
        except LabelError as exc:
            self.out.reject(len(points), str(exc))
            return 0
        if not base:
            self.out.reject(
                len(points), "a metric has an empty name; every OTLP metric needs a name"
            )
            return 0
        latest = 0
        for number, point in enumerate(points):
            if not number % _BUDGET_EVERY:
                self.budget.check(f"{self.out.points:,} data points")
            try:
                self.point(which, kind, base, point, ident, temporality == DELTA)
                latest = max(latest, point.time_unix_nano)
            except (_PointProblem, LabelError) as exc:
                self.out.reject(1, f"metric {shown} ({base}), data point #{number}: {exc}")
        return latest

    def point(
        self, which: str, kind: str, base: str, point: Any, ident: dict[str, str], delta: bool
    ) -> None:
        ts_ms = _timestamp(point.time_unix_nano)
        pairs = tuple([(kv.key, attribute_value(kv.value)) for kv in point.attributes])
        cache_key = (pairs, tuple(ident.items()))
        labels = _LABELS.get(cache_key)
        if labels is None:
            labels = _labels(pairs, ident)
            if len(_LABELS) >= _CACHE_MAX:
                _LABELS.clear()
            _LABELS[cache_key] = labels
        self._check(base, labels)
        self.out.exemplars += len(getattr(point, "exemplars", ()))
        stale = bool(point.flags & NO_RECORDED_VALUE)
        if which in ("gauge", "sum"):
            value = STALE_NAN if stale else _number(point)
            self._scalar(kind, base, labels, point, ts_ms, value, delta)
        elif which == "summary":
            self._summary(base, labels, point, ts_ms, stale)
        else:
            hist = None if stale else _hist(which, point)
            self._histogram(base, labels, point, ts_ms, hist, delta)

    def _scalar(
        self,
        kind: str,
        base: str,
        labels: Labels,
        point: Any,
        ts_ms: int,
        value: float,
        delta: bool,
    ) -> None:
        self.out.kinds[base] = "counter" if kind == COUNTER else "gauge"
        if delta:
            is_stale = _is_stale(value)
            self.out.deltas.append(
                DeltaPoint(
                    (base, labels),
                    kind,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    None if is_stale else value,
                )
            )
            self.out.series.add((base, labels))
            return
        self.out.add(base, labels, ts_ms, value)
        if kind == COUNTER and not _is_stale(value):
            self._start(base, labels, point, ((base, labels),))

    def _histogram(
        self, base: str, labels: Labels, point: Any, ts_ms: int, hist: Hist | None, delta: bool
    ) -> None:
        for suffix in ("_bucket", "_sum", "_count"):
            self.out.kinds[base + suffix] = "counter"
        if delta:
            self.out.deltas.append(
                DeltaPoint(
                    (base, labels),
                    HISTOGRAM,
                    point.start_time_unix_nano,
                    point.time_unix_nano,
                    hist,
                )
            )
            for metric, row_labels, _ in hist_rows(base, labels, hist or _stale_hist(point)):
                self.out.series.add((metric, row_labels))
            return
        if hist is None:
            for metric, row_labels, _ in hist_rows(base, labels, _stale_hist(point)):
                self.out.add(metric, row_labels, ts_ms, STALE_NAN)
            return
        rows = tuple(hist_rows(base, labels, hist))
        for metric, row_labels, value in rows:
            self.out.add(metric, row_labels, ts_ms, value)
        self._start(base, labels, point, tuple((m, lbl) for m, lbl, _ in rows))

    def _summary(self, base: str, labels: Labels, point: Any, ts_ms: int, stale: bool) -> None:
        self.out.kinds[base] = "gauge"
        self.out.kinds[base + "_sum"] = self.out.kinds[base + "_count"] = "counter"
        rows: list[tuple[str, Labels, float]] = []
        for quantile in point.quantile_values:
            if not 0 <= quantile.quantile <= 1:
                raise _PointProblem(
                    f"quantile {quantile.quantile!r} is outside 0..1; a summary's quantiles "
                    "are fractions (0.5 for the median)"
                )
            rows.append(
                (base, _with(labels, "quantile", go_float(quantile.quantile)), quantile.value)
            )
        rows.append((f"{base}_sum", labels, point.sum))
        rows.append((f"{base}_count", labels, float(point.count)))
        for metric, row_labels, value in rows:
            self.out.add(metric, row_labels, ts_ms, STALE_NAN if stale else value)
        if not stale:
            self._start(base, labels, point, tuple((m, lbl) for m, lbl, _ in rows[-2:]))

    def _start(
        self, base: str, labels: Labels, point: Any, rows: tuple[tuple[str, Labels], ...]
    ) -> None:
        start = point.start_time_unix_nano
        start_ms = start // 1_000_000
        if start and MIN_TS_MS <= start_ms <= point.time_unix_nano // 1_000_000:
            # A start in the point's own millisecond gets no zero (it would overwrite the
            # point), but is remembered, so no later export writes a zero over this point.
            zeros = rows if start_ms < point.time_unix_nano // 1_000_000 else ()
            self.out.starts.append(StartPoint((base, labels), start, zeros))

    def _check(self, metric: str, labels: Labels) -> None:
        """The series rules of the store (label names, reserved names, control characters,
        value length, label count), once per distinct label set of the request."""
        key = (metric, labels)
        problem = self._valid.get(key, _UNSEEN)
        if problem is _UNSEEN:
            try:
                Series.make(metric, dict(labels))
                problem = None
            except LabelError as exc:
                problem = exc.message
            if len(self._valid) >= _CACHE_MAX:
                self._valid.clear()
            self._valid[key] = problem
        if problem is not None:
            raise _PointProblem(problem)


def _kind(which: str, metric: Any) -> str:
    if which == "gauge":
        return GAUGE
    if which == "sum":
        return COUNTER if metric.sum.is_monotonic else NON_MONOTONIC
    if which == "summary":
        return SUMMARY
    return HISTOGRAM


def _labels(pairs: Iterable[tuple[str, str]], ident: dict[str, str]) -> Labels:
    """Attributes -> labels: sorted by key, sanitised, colliding names joined with ';', then
    job and instance from the resource; empty values dropped (an empty label is no label)."""
    out: dict[str, str] = {}
    for key, value in sorted(pairs, key=lambda pair: pair[0]):
        name = label_name(key)
        out[name] = f"{out[name]};{value}" if name in out else value
    out.update(ident)
    return tuple(sorted((name, value) for name, value in out.items() if value))


def _timestamp(time_ns: int) -> int:
    if not time_ns:
        raise _PointProblem("time_unix_nano is 0; every data point needs its time")
    ms = time_ns // 1_000_000
    if not MIN_TS_MS <= ms <= MAX_TS_MS:
        raise _PointProblem(
            f"time_unix_nano {time_ns} is outside the years 1990..2200 that metricvault "
            "accepts; OTLP times are nanoseconds since the epoch"
        )
    return ms


def _number(point: Any) -> float:
    which = point.WhichOneof("value")
    if which is None:
        raise _PointProblem(
            "the point has neither as_double nor as_int (and no NO_RECORDED_VALUE flag)"
        )
    return float(getattr(point, which))


def _is_stale(value: float) -> bool:
    return struct.pack("<d", value) == _STALE_BYTES


def _stale_hist(point: Any) -> Hist:
    """The series a NO_RECORDED_VALUE histogram point marks stale (Prometheus: its bounds)."""
    bounds = list(getattr(point, "explicit_bounds", ()))
    return Hist(0, 0.0 if point.HasField("sum") else None, dict.fromkeys(bounds, 0), ())


def _hist(which: str, point: Any) -> Hist:
    total = point.sum if point.HasField("sum") else None
    if which == "histogram":
        return _explicit(point, total)
    return _exponential(point, total)


def _explicit(point: Any, total: float | None) -> Hist:
    bounds, counts = list(point.explicit_bounds), list(point.bucket_counts)
    if any(math.isnan(b) or math.isinf(b) for b in bounds):
        raise _PointProblem(f"explicit_bounds {bounds[:8]} hold NaN or ±Inf; bounds are finite")
    if any(b >= c for b, c in itertools.pairwise(bounds)):
        raise _PointProblem(
            f"explicit_bounds {bounds[:8]} are not strictly increasing; histogram bounds must "
            "be sorted and distinct"
        )
    if not counts:
        return Hist(point.count, total, {}, tuple(bounds))
    if len(counts) != len(bounds) + 1:
        raise _PointProblem(
            f"{len(counts)} bucket_counts for {len(bounds)} explicit_bounds; a histogram has "
            "one bucket more than bounds (the last one up to +Inf)"
        )
    if sum(counts) != point.count:
        raise _PointProblem(
            f"count is {point.count} but the bucket_counts add up to {sum(counts)}; they must "
            "be equal"
        )
    return Hist(
        point.count, total, dict(zip([*bounds, math.inf], counts, strict=True)), tuple(bounds)
    )


def _exponential(point: Any, total: float | None) -> Hist:
    if any(point.negative.bucket_counts):
        raise _PointProblem(
            "the exponential histogram has observations in negative buckets; they cannot be "
            "written as classic buckets (count at or below a bound) exactly, so the point "
            "was not stored: record non-negative values, or use explicit buckets"
        )
    threshold = point.zero_threshold
    if math.isnan(threshold) or threshold < 0:
        raise _PointProblem(f"zero_threshold {threshold!r} must be a number >= 0")
    scale = point.scale
    target = min(scale, 0)
    buckets: dict[float, int] = {threshold: point.zero_count}
    offset = point.positive.offset
    for position, count in enumerate(point.positive.bucket_counts):
        if not count:
            continue
        merged = (offset + position) >> (scale - target)
        try:
            upper = math.ldexp(1.0, (merged + 1) << -target)
        except OverflowError:
            upper = math.inf
        if upper <= threshold:
            raise _PointProblem(
                f"positive bucket {offset + position} (upper bound {upper!r}) lies below "
                f"zero_threshold {threshold!r}; the histogram is inconsistent"
            )
        buckets[upper] = buckets.get(upper, 0) + count
    observed = sum(buckets.values())
    if observed != point.count:
        raise _PointProblem(
            f"count is {point.count} but the zero and positive buckets add up to {observed}"
        )
    return Hist(point.count, total, buckets, ("exponential", threshold))
