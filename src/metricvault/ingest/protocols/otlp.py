"""OTLP/HTTP metrics export requests -> the remote-write decoder's batch (``DecodedWrite``).

The entry point of the OTLP decoder, beside ``remote_write`` and ``influx_line``; pure
functions, no I/O, no store. The work is split by job:

- ``otlp_body``: content type, gzip, protobuf or OTLP/JSON -> the message; reply bodies;
- ``otlp_names``: Prometheus's metric, unit and label name rules (``otlptranslator``);
- ``otlp_points``: metric types -> samples, resource -> ``job``/``instance``/``target_info``;
- ``otlp_streams``: the state the gateway keeps per stream (DELTA totals, start times).
- ``otlp_known``: the fast path for the usual protobuf export (gauges, cumulative sums, series
  seen before): points read column-wise, series found by their attribute bytes; it hands
  anything else to ``otlp_points``, and gives the same rows, kinds and counts.

:func:`decode_otlp` returns :class:`OtlpDecoded`: the translated points (DELTA ones still
apart) and what was rejected; :func:`to_write` turns them, once the stream state has added the
totals, into a ``DecodedWrite`` that the gateway stores exactly as a remote-write request.
Limits, as for remote_write, each a 413 for the whole request: ``max_series`` (series after
translation), ``max_label_names``, ``time_budget_s``, ``max_decoded_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault.errors import InputError
from metricvault.ingest.protocols.decode_limits import DecodeBudget, check_label_names
from metricvault.ingest.protocols.influx_batch import long_schema
from metricvault.ingest.protocols.otlp_body import (
    PROTOBUF,
    check_content_type,
    inflate,
    parse_request,
    response_body,
    status_body,
)
from metricvault.ingest.protocols.otlp_known import (
    SERIES_CACHE,
    FastRows,
    OtlpSeries,
    OtlpSeriesCache,
    decode_fast,
    distinct_series,
)
from metricvault.ingest.protocols.otlp_points import Labels, Points, Translator
from metricvault.ingest.protocols.otlp_streams import OtlpStreams, Pending
from metricvault.ingest.protocols.remote_write_checks import check_series_count
from metricvault.ingest.protocols.remote_write_columns import (
    DecodedWrite,
    KnownDecodedWrite,
    ResolvedSamples,
    special_value_counts,
)
from metricvault.model import DCGM_COUNTERS, KINDS, DistinctSeriesRows, kind_from_name

__all__ = [
    "OtlpDecoded",
    "OtlpStreams",
    "Pending",
    "decode_general",
    "decode_otlp",
    "response_body",
    "status_body",
    "to_write",
]
VERSION = "otlp"


@dataclass(frozen=True)
class OtlpDecoded:
    points: Points
    content_type: str  # the request's media type: replies use it too
    fast: FastRows | None = None  # the rows, when the fast path (otlp_known) decoded them

    @property
    def has_deltas(self) -> bool:
        return bool(self.points.deltas)

    def error_message(self) -> str:
        """The reply's ``partial_success.error_message``: how many and the first reasons."""
        reasons = self.points.reasons
        if not reasons:
            return ""
        head = (
            f"{self.points.rejected} of {self.points.points} data point(s) rejected, not stored"
            if self.points.rejected
            else "accepted with warnings"
        )
        return f"{head}: " + "; ".join(reasons)


def decode_otlp(
    body: bytes,
    *,
    content_type: str | None,
    content_encoding: str | None,
    max_decoded_bytes: int = 64 * 1024**2,
    max_series: int | None = None,
    max_label_names: int | None = None,
    time_budget_s: float | None = None,
    fast_cache: OtlpSeriesCache | None = None,
) -> OtlpDecoded:
    """Decode one OTLP metrics export body; raises a ``MetricVaultError`` (400, 413, 415)
    when the request as a whole is refused, and nothing is to be stored.

    ``fast_cache``: where the fast path (``otlp_known``) remembers series; by default the
    process's own; :func:`decode_general` is the general path alone."""
    budget = DecodeBudget(time_budget_s)
    kind = check_content_type(content_type)
    raw = inflate(body, content_encoding, max_decoded_bytes)
    fast = None
    if kind == PROTOBUF:
        fast = decode_fast(raw, budget, fast_cache or SERIES_CACHE)
    if fast is None:
        return _general(raw, kind, budget, max_series, max_label_names)
    points, rows = fast
    budget.check("parsing the request")
    check_series_count(len(rows.distinct), max_series)
    names = sorted(set().union(*{entry.names for entry in rows.distinct}))
    check_label_names(len(names), max_label_names, ", ".join(repr(n) for n in names[:3]))
    return OtlpDecoded(points, kind, rows)


def decode_general(
    body: bytes,
    *,
    content_type: str | None,
    content_encoding: str | None,
    max_decoded_bytes: int = 64 * 1024**2,
    max_series: int | None = None,
    max_label_names: int | None = None,
    time_budget_s: float | None = None,
) -> OtlpDecoded:
    """:func:`decode_otlp` without the fast path: every point walked by ``Translator``
    (what the fast path must agree with, row for row)."""
    budget = DecodeBudget(time_budget_s)
    kind = check_content_type(content_type)
    raw = inflate(body, content_encoding, max_decoded_bytes)
    return _general(raw, kind, budget, max_series, max_label_names)


def _general(
    raw: bytes,
    kind: str,
    budget: DecodeBudget,
    max_series: int | None,
    max_label_names: int | None,
) -> OtlpDecoded:
    request = parse_request(raw, kind)
    budget.check("parsing the request")
    points = Translator(budget).request(request)
    _check_limits(points, max_series, max_label_names)
    return OtlpDecoded(points, kind)


def _check_limits(points: Points, max_series: int | None, max_label_names: int | None) -> None:
    check_series_count(len(points.series), max_series)
    names = sorted({name for _, labels in points.series for name, _ in labels})
    check_label_names(len(names), max_label_names, ", ".join(repr(n) for n in names[:3]))


def to_write(
    decoded: OtlpDecoded, known_kind: Callable[[str], str | None] | None = None
) -> DecodedWrite:
    """The long-shape table of every row (after the stream state added its rows); from the
    fast path, the rows as resolved samples (the table is built only if someone asks).

    ``known_kind``: the store's kind of a metric (None if it has none), for the kinds of the
    series this write creates, as ``Vault.write`` decides them (a known kind stands)."""
    if decoded.fast is not None:
        return _resolved_write(decoded, decoded.fast, known_kind)
    points = decoded.points
    table = _long_table(points.metrics, points.labels, points.timestamps, points.values)
    values = table.column("value").to_numpy()
    stale, non_finite = special_value_counts(values)
    return DecodedWrite(
        table=table,
        kinds=dict(points.kinds),
        metadata=(),
        version=VERSION,
        samples=len(values),
        histograms=0,
        exemplars=points.exemplars,
        stale_markers=stale,
        non_finite=non_finite,
        series=len({*zip(points.metrics, points.labels, strict=True)}),
    )


def _resolved_write(
    decoded: OtlpDecoded, rows: FastRows, known_kind: Callable[[str], str | None] | None
) -> DecodedWrite:
    points = decoded.points
    entries = list(rows.entries)
    timestamps, values = rows.timestamps, rows.values
    if points.metrics:  # rows the stream state added (zero samples at counter starts)
        for metric, labels in zip(points.metrics, points.labels, strict=True):
            entry = SERIES_CACHE.labelled_series(metric, labels)
            if entry is None:  # labels of a series this request already holds: valid
                raise InputError(f"series {metric}{dict(labels)} breaks a label rule")
            entries.append(entry)
        timestamps = np.concatenate([timestamps, np.array(points.timestamps, dtype=np.int64)])
        values = np.concatenate([values, np.array(points.values, dtype=np.float64)])
    distinct = distinct_series(entries) if points.metrics else rows.distinct
    kind_of = {
        metric: _new_series_kind(metric, points.kinds.get(metric), known_kind)
        for metric in {entry.metric for entry in distinct}
    }
    series = _series_rows(distinct, kind_of)
    series_ids = np.fromiter((e.series_id for e in entries), np.int64, len(entries))
    stale, non_finite = special_value_counts(values)

    def build() -> pa.Table:
        return _long_table(
            [e.metric for e in entries], [e.labels for e in entries], timestamps, values
        )

    return KnownDecodedWrite(
        table=None,
        kinds=dict(points.kinds),
        metadata=(),
        version=VERSION,
        samples=len(values),
        histograms=0,
        exemplars=points.exemplars,
        stale_markers=stale,
        non_finite=non_finite,
        series=len(distinct),
        resolved=ResolvedSamples(series_ids, timestamps, values, series, build),
    )


def _series_rows(distinct: list[OtlpSeries], kind_of: dict[str, str]) -> list[Any]:
    """(series_id, metric, labels_json, kind) of each series (ids distinct), with the keys
    the store remembers checked rows by (SeriesRows) where every kind is one of KINDS."""
    rows = DistinctSeriesRows(
        [(e.series_id, e.metric, e.labels_json, kind_of[e.metric]) for e in distinct]
    )
    if not set(kind_of.values()) <= _KIND_INDEX.keys():
        return list(rows)
    keys = np.fromiter((2 * e.key + _KIND_INDEX[kind_of[e.metric]] for e in distinct), np.int64)
    rows.keys = keys
    return rows


_KIND_INDEX: dict[str, int] = {kind: number for number, kind in enumerate(KINDS)}
assert len(_KIND_INDEX) <= 2  # OtlpSeries.key's rows: 2 * key + the kind's index


def _new_series_kind(
    metric: str, proposed: str | None, known_kind: Callable[[str], str | None] | None
) -> str:
    """The kind ``Vault.write`` gives a new series of ``metric`` for the write's ``kinds``
    (``model.admissible_write_kinds``, then ``normalize``'s name rule)."""
    known = known_kind(metric) if known_kind is not None else None
    if known is not None:
        return known
    if proposed is None or (proposed == "gauge" and metric in DCGM_COUNTERS):
        return kind_from_name(metric)
    return proposed


def _long_table(
    metrics: Sequence[str], labels: Sequence[Labels], timestamps: Any, values: Any
) -> pa.Table:
    series_of: dict[tuple[str, Labels], int] = {}
    row_series = [
        series_of.setdefault(key, len(series_of)) for key in zip(metrics, labels, strict=True)
    ]
    label_values: dict[str, list[str | None]] = {}
    for index, (_, row_labels) in enumerate(series_of):
        for name, value in row_labels:
            column = label_values.get(name)
            if column is None:
                column = label_values[name] = [None] * len(series_of)
            column[index] = value
    take = pa.array(row_series, pa.int64())
    names = sorted(label_values)
    arrays = [
        pa.array(metrics, pa.string()),
        pa.array(timestamps, pa.int64()),
        pa.array(np.asarray(values, dtype=np.float64), pa.float64()),
        *(pa.array(label_values[name], pa.string()).take(take) for name in names),
    ]
    return pa.Table.from_arrays(arrays, schema=long_schema(names))
