"""Prometheus remote-write 1.0 request bodies, encoded: the mirror of the gateway's decoder
(``ingest/protocols/remote_write.py``), and the protocol's names both sides use.

Imports no pyarrow, numpy or protobuf: the agent encodes with it, and its memory budget is
small. The encoder writes the protobuf wire format itself (a ``WriteRequest`` is three nested
messages of strings, doubles and varints): building the message classes
(``metricvault.wire.proto.messages``) costs ~4 MB of RSS, a sixth of the edge agent's budget.
Its bytes are those protobuf's own serialiser writes (a unit test compares them).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence

import cramjam

from metricvault.model import (
    METRIC_NAME_LABEL,
    label_name_problem,
    metric_name_problem,
)

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
    body = bytearray()
    for labels, points in _group_series(samples).items():
        series = bytearray(_labels_field(labels))
        points.sort(key=lambda point: point[0])  # stable: equal timestamps keep their order
        for timestamp, sample_value in points:
            series += _sample_field(timestamp, sample_value)
        body += _TIMESERIES_TAG
        body += _varint(len(series))
        body += series
    return bytes(cramjam.snappy.compress_raw(bytes(body)))


# The wire format (protobuf encoding) of remote-write 1.0's WriteRequest {1: repeated TimeSeries
# timeseries}, TimeSeries {1: repeated Label labels, 2: repeated Sample samples}, Label
# {1: string name, 2: string value}, Sample {1: double value, 2: int64 timestamp}: a field is
# its tag (number << 3 | wire type) then its value; proto3 leaves out fields holding 0 (a value
# whose bits are all zero: +0.0 is left out, -0.0 is written, as protobuf does).
_TIMESERIES_TAG = b"\x0a"  # field 1, length-delimited
_LABEL_TAG, _NAME_TAG, _VALUE_TAG = b"\x0a", b"\x0a", b"\x12"
_SAMPLE_TAG = b"\x12"  # field 2, length-delimited
_DOUBLE_TAG, _TIMESTAMP_TAG = b"\x09", b"\x10"  # field 1, 64-bit; field 2, varint
_ZERO_DOUBLE = bytes(8)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_pack_double = struct.Struct("<d").pack


def _varint(number: int) -> bytes:
    """An unsigned varint: 7 bits a byte, low bits first (negative int64s arrive as 2**64+n)."""
    if number < 0x80:
        return bytes((number,))
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _string(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8")  # a lone surrogate raises, as protobuf's serialiser does
    return tag + _varint(len(data)) + data


@functools.lru_cache(maxsize=2048)
def _labels_field(labels: tuple[tuple[str, str], ...]) -> bytes:
    """A series' labels, encoded (the same label sets recur every push)."""
    out = bytearray()
    for name, value in labels:  # names and values are never empty here: both are written
        label = _string(_NAME_TAG, name) + _string(_VALUE_TAG, value)
        out += _LABEL_TAG + _varint(len(label)) + label
    return bytes(out)


def _sample_field(timestamp: int, value: float) -> bytes:
    if not _INT64_MIN <= timestamp <= _INT64_MAX:
        raise ValueError(f"timestamp {timestamp} is outside int64")
    sample = b""
    packed = _pack_double(value)
    if packed != _ZERO_DOUBLE:
        sample = _DOUBLE_TAG + packed
    if timestamp:
        sample += _TIMESTAMP_TAG + _varint(timestamp & 0xFFFF_FFFF_FFFF_FFFF)
    return _SAMPLE_TAG + _varint(len(sample)) + sample


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
