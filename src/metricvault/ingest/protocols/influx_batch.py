"""Line protocol points -> the long-shape batch: Prometheus names for measurements, fields and
tags (one name rule, ``metricvault.model``'s), timestamps in epoch ms, the per-request series
and label limits, and the Arrow table."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import InputError, LabelError, TooLargeError, ValueRangeError
from metricvault.ingest.protocols.decode_limits import check_label_names
from metricvault.ingest.protocols.influx_tokens import Parsed, Tag, parse_fast, parse_slow
from metricvault.ingest.protocols.influx_values import (
    DIGITS,
    HOW,
    MAX_DIGITS,
    _LineProblem,
    clip,
    q,
)
from metricvault.model import MAX_LABEL_VALUE_BYTES, MAX_LABELS, label_name_problem

SHOWN_LINE_CHARS = 200

# Nanoseconds per unit, keyed by every spelling InfluxDB 1.x and 2.x accept for ``precision``.
PRECISIONS = {
    "ns": 1,
    "n": 1,
    "us": 1_000,
    "u": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
# InfluxDB's own timestamp range (models.MinNanoTime / MaxNanoTime).
_MIN_NS = -(2**63) + 2
_MAX_NS = 2**63 - 2

_METRIC_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class LineError:
    """One line left out of an otherwise accepted request."""

    line: int  # 1-based line number in the (decompressed) body
    text: str  # the line, at most SHOWN_LINE_CHARS characters
    reason: str


@dataclass(frozen=True)
class DecodedLines:
    """The accepted points in the long shape, plus the lines left out one by one."""

    table: pa.Table
    points: int
    samples: int
    rejected: tuple[LineError, ...]


class Decoder:
    """Accumulates the accepted points of one request, column by column."""

    def __init__(self, precision: str, ns_per_unit: int, now_ms: int) -> None:
        self.precision = precision
        self.ns_per_unit = ns_per_unit
        self.now_ms = now_ms
        self.metric_names: dict[str, dict[str, str]] = {}
        self.label_names: dict[str, str] = {}
        self.point_tags: list[dict[str, str]] = []
        self.point_ts: list[int] = []
        self.row_point: list[int] = []
        self.metrics: list[str] = []
        self.values: list[float] = []
        self.rejected: list[LineError] = []
        self.max_series: int | None = None
        self.max_label_names: int | None = None
        self.labels: set[str] = set()
        self.series_fields: dict[tuple[str, tuple[Tag, ...]], set[str]] = {}
        self.series = 0

    def add(self, number: int, line: str) -> None:
        try:
            stripped = line
            if line[0] in " \t" or line[-1] in " \t\r":
                stripped = line.strip(" \t\r")
                if not stripped or stripped[0] == "#":
                    return
            parsed = parse_fast(stripped) or parse_slow(stripped)
            self._add_point(number, line, parsed)
        except _LineProblem as problem:
            raise problem.kind(
                f"line {number}: {problem.reason}. The line was {_shown(line)!r}; the whole "
                "request was rejected and nothing was stored"
            ) from None

    def _add_point(self, number: int, line: str, parsed: Parsed) -> None:
        measurement, pairs, keys, values, ts_token = parsed
        ts = self.now_ms if ts_token is None else self._timestamp(ts_token)
        tags = self._tags(pairs, len(line) > MAX_LABEL_VALUE_BYTES)
        names = self._metric_names(measurement, keys)
        if None in values:
            strings = [key for key, value in zip(keys, values, strict=True) if value is None]
            self.rejected.append(LineError(number, _shown(line), _string_reason(strings)))
            return
        self._count_series(measurement, pairs, keys)
        point = len(self.point_ts)
        self.point_tags.append(tags)
        self.point_ts.append(ts)
        self.metrics.extend(names)
        self.values.extend(values)  # type: ignore[arg-type]  # no None: checked above
        self.row_point.extend([point] * len(values))

    def _count_series(self, measurement: str, pairs: list[Tag], keys: list[str]) -> None:
        if self.max_series is None:
            return
        fields = self.series_fields.setdefault((measurement, tuple(pairs)), set())
        before = len(fields)
        fields.update(keys)
        self.series += len(fields) - before
        if self.series > self.max_series:
            raise TooLargeError(
                f"the request holds more than {self.max_series:,} series (metric and tag set), "
                "over the limit per request (max_series_per_request); nothing was stored: "
                "split the batch into smaller requests or raise max_series_per_request"
            )

    def _timestamp(self, token: str) -> int:
        digits = token[1:] if token[0] == "-" else token
        if len(digits) > MAX_DIGITS:
            digits = digits.lstrip("0") or "0"
        if not (digits.isdigit() and digits.isascii()):
            raise _LineProblem(
                f"timestamp {q(token)} is not an integer; give whole {self.precision} since "
                f"the epoch (or leave it out for 'now'). {HOW}"
            )
        raw = _MAX_NS + 1 if len(digits) > MAX_DIGITS else int(digits)
        raw = -raw if token[0] == "-" else raw
        ns = raw * self.ns_per_unit
        if not _MIN_NS <= ns <= _MAX_NS:
            raise _LineProblem(
                f"timestamp {clip(token)} in precision {q(self.precision)} is outside the int64 "
                "nanosecond range InfluxDB allows; check the timestamp and the precision",
                ValueRangeError,
            )
        ms = ns // 1_000_000
        if not MIN_TS_MS <= ms <= MAX_TS_MS:
            raise _LineProblem(_absurd_timestamp(raw, ms, self.precision), ValueRangeError)
        return ms

    def _tags(self, pairs: list[Tag], long_line: bool) -> dict[str, str]:
        if len(pairs) > MAX_LABELS:
            raise _LineProblem(
                f"the line has {len(pairs)} tags; the limit is {MAX_LABELS}: drop "
                "high-cardinality or redundant tags",
                LabelError,
            )
        known = self.label_names
        tags = {known.get(key) or self._new_label(key): value for key, _, value in pairs}
        if len(tags) != len(pairs):
            labels = [known[key] for key, _, _ in pairs]
            label = next(label for label in labels if labels.count(label) > 1)
            keys = [key for key, _, _ in pairs if known[key] == label]
            raise _LineProblem(_duplicate("tag", keys, label), LabelError)
        if long_line:
            for key, _, value in pairs:
                if len(value.encode()) > MAX_LABEL_VALUE_BYTES:
                    raise _LineProblem(
                        f"tag {q(key)} has a {len(value.encode())}-byte value; the limit is "
                        f"{MAX_LABEL_VALUE_BYTES} bytes: do not put free text into tags",
                        LabelError,
                    )
        return tags

    def _new_label(self, key: str) -> str:
        label = _LABEL_BAD_CHARS.sub("_", key)
        if label[0] in DIGITS:
            label = "_" + label
        problem = label_name_problem(label)
        if problem is not None:
            mapped = f" becomes label {q(label)}" if label != key else ""
            raise _LineProblem(f"tag {q(key)}{mapped}: {problem}", LabelError)
        self.label_names[key] = label
        self.labels.add(label)
        check_label_names(len(self.labels), self.max_label_names, q(label))
        return label

    def _metric_names(self, measurement: str, keys: list[str]) -> list[str]:
        known = self.metric_names.get(measurement)
        if known is None:
            known = self.metric_names[measurement] = {}
        names = [known.get(key) or _metric_name(known, measurement, key) for key in keys]
        if len(names) > 1 and len(set(names)) != len(names):
            name = next(name for name in names if names.count(name) > 1)
            same = [key for key, other in zip(keys, names, strict=True) if other == name]
            raise _LineProblem(_duplicate("field", same, name), LabelError)
        return names

    def result(self) -> DecodedLines:
        if not self.point_ts and self.rejected:
            first = self.rejected[0]
            raise InputError(
                f"all {len(self.rejected)} lines were rejected, nothing was stored; the first "
                f"is line {first.line}: {first.reason}"
            )
        row_point = pa.array(self.row_point, pa.int64())
        columns = self._tag_columns()
        labels = sorted(columns)
        arrays = [
            pa.array(self.metrics, pa.string()),
            pa.array(self.point_ts, pa.int64()).take(row_point),
            pa.array(self.values, pa.float64()),
        ]
        arrays += [columns[label].take(row_point) for label in labels]
        table = pa.Table.from_arrays(arrays, schema=long_schema(labels))
        return DecodedLines(table, len(self.point_ts), len(self.metrics), tuple(self.rejected))

    def _tag_columns(self) -> dict[str, pa.Array]:
        """One value per point for each label, visiting only the tags the points have: asking
        every point for every label cost points x labels."""
        points_of: dict[str, list[int]] = {}
        values_of: dict[str, list[str]] = {}
        for point, tags in enumerate(self.point_tags):
            for label, value in tags.items():
                if label not in points_of:
                    points_of[label], values_of[label] = [], []
                points_of[label].append(point)
                values_of[label].append(value)
        columns = {}
        for label, points in points_of.items():
            picks = np.full(len(self.point_tags), -1, dtype=np.int64)
            picks[points] = np.arange(len(points))
            values = pa.array(values_of[label], pa.string())
            columns[label] = values.take(pa.array(picks, mask=picks < 0))
        return columns


def long_schema(labels: list[str]) -> pa.Schema:
    """metric, timestamp (epoch ms), value, then one nullable string column per label."""
    return pa.schema(
        [
            pa.field("metric", pa.string(), nullable=False),
            pa.field("timestamp", pa.int64(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
            *(pa.field(label, pa.string()) for label in labels),
        ]
    )


def _metric_name(known: dict[str, str], measurement: str, key: str) -> str:
    name = _METRIC_BAD_CHARS.sub("_", f"{measurement}_{key}")
    if name[0] in DIGITS:
        name = "_" + name
    known[key] = name
    return name


def _duplicate(what: str, keys: list[str], name: str) -> str:
    if len(set(keys)) == 1:
        return f"{what} {q(keys[0])} appears more than once; give each {what} once per line"
    return (
        f"{what}s {' and '.join(q(k) for k in keys)} all become {q(name)} after replacing "
        f"characters outside Prometheus' name alphabet with '_'; rename one of them"
    )


def _string_reason(keys: list[str]) -> str:
    names = ", ".join(q(k) for k in keys)
    field = "field" if len(keys) == 1 else "fields"
    it = "it" if len(keys) == 1 else "them"
    return (
        f"string {field} {names} not stored: metricvault keeps numbers; send {it} as a tag or "
        "a log (the line's other fields were left out with it)"
    )


def _absurd_timestamp(raw: int, ms: int, precision: str) -> str:
    try:
        when = datetime.fromtimestamp(ms / 1000, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        when = f"{ms} ms since the epoch"
    fits = [
        unit
        for unit in ("ns", "us", "ms", "s")
        if MIN_TS_MS <= raw * PRECISIONS[unit] // 1_000_000 <= MAX_TS_MS
    ]
    hint = f"; it looks like {fits[0]} — send precision={fits[0]}" if fits else ""
    return (
        f"timestamp {raw} in precision {q(precision)} is {when}, outside "
        f"the years 1990-2200 that metricvault accepts{hint}"
    )


def _shown(line: str) -> str:
    line = line.rstrip("\r")
    if len(line) <= SHOWN_LINE_CHARS:
        return line
    return line[: SHOWN_LINE_CHARS - 1] + "…"
