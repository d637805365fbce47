"""Prometheus remote-write 1.0 request bodies, encoded: the mirror of the gateway's decoder
(``ingest/protocols/remote_write.py``), and the protocol's names both sides use.

Imports no pyarrow or numpy: the agent encodes with it, and its memory budget is small.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import cramjam

from metricvault.model import (
    METRIC_NAME_LABEL,
    label_name_problem,
    metric_name_problem,
)
from metricvault.wire.proto import messages

__all__ = [
    "CONTENT_TYPE_V1",
    "CONTENT_TYPE_V2",
    "MEDIA_TYPE",
    "PROTO_V1",
    "PROTO_V2",
    "SERVER_TIME_HEADER",
    "SampleTuple",
    "encode_write_request",
]

SampleTuple = tuple[str, Mapping[str, str], int, float]  # metric, labels, timestamp ms, value

# The gateway's clock in epoch milliseconds, on GET /-/healthy (Date has 1 s resolution); the
# agent estimates its clock offset from it.
SERVER_TIME_HEADER = "X-Metricvault-Server-Time-Ms"
PROTO_V1 = "prometheus.WriteRequest"
PROTO_V2 = "io.prometheus.write.v2.Request"
MEDIA_TYPE = "application/x-protobuf"
CONTENT_TYPE_V1 = MEDIA_TYPE
CONTENT_TYPE_V2 = f"{MEDIA_TYPE};proto={PROTO_V2}"


def encode_write_request(samples: Sequence[SampleTuple]) -> bytes:
    """A snappy-compressed remote-write 1.0 ``WriteRequest`` holding ``samples``.

    One time series per distinct (metric, labels), in order of first appearance; labels sorted
    by name (byte order, which the spec requires and the gateway checks: ``__name__`` is first
    unless a label name starts with an upper-case letter); samples sorted by time within a
    series. A label with an empty value is left out (the same as no label). Raises ValueError
    for a name the gateway would refuse (the rule of ``metricvault.model``, with its message),
    since one bad series gets the whole request refused.
    """
    request = messages.WriteRequest()
    for labels, points in _group_series(samples).items():
        series = request.timeseries.add()
        for name, value in labels:
            series.labels.add(name=name, value=value)
        points.sort(key=lambda point: point[0])  # stable: equal timestamps keep their order
        for timestamp, sample_value in points:
            series.samples.add(value=sample_value, timestamp=timestamp)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _group_series(
    samples: Sequence[SampleTuple],
) -> dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]:
    groups: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for metric, labels, timestamp, value in samples:
        key = _series_key(metric, labels)
        groups.setdefault(key, []).append((int(timestamp), float(value)))
    return groups


def _series_key(metric: str, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    problem = _metric_problem(metric)
    if problem is not None:
        raise ValueError(problem)
    pairs = [(METRIC_NAME_LABEL, metric)]
    for name, value in labels.items():
        problem = label_name_problem(name)
        if problem is not None:
            raise ValueError(f"metric {metric!r}: {problem}")
        if value:
            pairs.append((name, value))
    return tuple(sorted(pairs))


@functools.lru_cache(maxsize=4096)
def _metric_problem(name: str) -> str | None:
    return metric_name_problem(name)
