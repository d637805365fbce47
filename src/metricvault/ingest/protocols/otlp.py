"""OTLP/HTTP metrics export requests -> the remote-write decoder's batch (``DecodedWrite``).

The entry point of the OTLP decoder, beside ``remote_write`` and ``influx_line``; pure
functions, no I/O, no store. The work is split by job:

- ``otlp_body``: content type, gzip, protobuf or OTLP/JSON -> the message; reply bodies;
- ``otlp_names``: Prometheus's metric, unit and label name rules (``otlptranslator``);
- ``otlp_points``: metric types -> samples, resource -> ``job``/``instance``/``target_info``;
- ``otlp_streams``: the state the gateway keeps per stream (DELTA totals, start times).

:func:`decode_otlp` returns :class:`OtlpDecoded`: the translated points (DELTA ones still
apart) and what was rejected; :func:`to_write` turns them, once the stream state has added the
totals, into a ``DecodedWrite`` that the gateway stores exactly as a remote-write request.
Limits, as for remote_write, each a 413 for the whole request: ``max_series`` (series after
translation), ``max_label_names``, ``time_budget_s``, ``max_decoded_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metricvault.ingest.protocols.decode_limits import DecodeBudget, check_label_names
from metricvault.ingest.protocols.influx_batch import long_schema
from metricvault.ingest.protocols.otlp_body import (
    check_content_type,
    inflate,
    parse_request,
    response_body,
    status_body,
)
from metricvault.ingest.protocols.otlp_points import Points, Translator
from metricvault.ingest.protocols.otlp_streams import OtlpStreams, Pending
from metricvault.ingest.protocols.remote_write_checks import check_series_count
from metricvault.ingest.protocols.remote_write_columns import DecodedWrite
from metricvault.model import STALE_NAN_BITS

__all__ = [
    "OtlpDecoded",
    "OtlpStreams",
    "Pending",
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
) -> OtlpDecoded:
    """Decode one OTLP metrics export body; raises a ``MetricVaultError`` (400, 413, 415)
    when the request as a whole is refused, and nothing is to be stored."""
    budget = DecodeBudget(time_budget_s)
    kind = check_content_type(content_type)
    raw = inflate(body, content_encoding, max_decoded_bytes)
    request = parse_request(raw, kind)
    budget.check("parsing the request")
    points = Translator(budget).request(request)
    check_series_count(len(points.series), max_series)
    names = sorted({name for _, labels in points.series for name, _ in labels})
    check_label_names(len(names), max_label_names, ", ".join(repr(n) for n in names[:3]))
    return OtlpDecoded(points, kind)


def to_write(decoded: OtlpDecoded) -> DecodedWrite:
    """The long-shape table of every row (after the stream state added its rows)."""
    points = decoded.points
    series_of: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    row_series = [
        series_of.setdefault(key, len(series_of))
        for key in zip(points.metrics, points.labels, strict=True)
    ]
    label_values: dict[str, list[str | None]] = {}
    for index, (_, labels) in enumerate(series_of):
        for name, value in labels:
            column = label_values.get(name)
            if column is None:
                column = label_values[name] = [None] * len(series_of)
            column[index] = value
    take = pa.array(row_series, pa.int64())
    names = sorted(label_values)
    values = np.array(points.values, dtype=np.float64)
    arrays = [
        pa.array(points.metrics, pa.string()),
        pa.array(points.timestamps, pa.int64()),
        pa.array(values, pa.float64()),
        *(pa.array(label_values[name], pa.string()).take(take) for name in names),
    ]
    table = pa.Table.from_arrays(arrays, schema=long_schema(names))
    stale = int(np.count_nonzero(values.view(np.uint64) == STALE_NAN_BITS))
    non_finite = len(values) - int(np.count_nonzero(np.isfinite(values))) - stale
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
        series=len(series_of),
    )
