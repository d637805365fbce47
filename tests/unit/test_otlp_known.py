"""The OTLP fast path (``otlp_known``) gives the general path's rows, series, kinds and counts,
and leaves every request it does not handle to the general path."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from metricvault.ingest.protocols.otlp import (
    OtlpDecoded,
    OtlpStreams,
    decode_general,
    decode_otlp,
    to_write,
)
from metricvault.ingest.protocols.otlp_known import OtlpSeriesCache
from metricvault.ingest.protocols.remote_write_columns import DecodedWrite, KnownDecodedWrite
from metricvault.model import admissible_write_kinds
from metricvault.store.normalize import normalize
from tests.unit.otlp_requests import (
    DELTA,
    JSON,
    NO_RECORDED_VALUE,
    PROTOBUF,
    T0,
    S,
    attrs,
    body,
    counter,
    gauge,
    hist_point,
    histogram,
    number,
)

GPU = {"gpu": "0", "UUID": "GPU-1", "Hostname": "node-1", "modelName": "H100"}


def _two_resources() -> bytes:
    request = ExportMetricsServiceRequest()
    for host in ("a", "b"):
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.CopyFrom(
            Resource(attributes=attrs({"service.name": "dcgm", "host.name": host}))
        )
        scope = resource_metrics.scope_metrics.add()
        scope.metrics.append(gauge("DCGM_FI_DEV_GPU_UTIL", number(50.0, T0, GPU)))
    return bytes(request.SerializeToString())


# request bodies the fast path takes
FAST: dict[str, bytes] = {
    "double gauge": body(gauge("g", number(1.5, T0, GPU), number(2.5, T0 + S, GPU))),
    "int gauge": body(gauge("g", number(7, T0, {"a": "x"}), number(-3, T0, {"a": "y"}))),
    "mixed int and double points": body(gauge("g", number(7, T0), number(0.25, T0 + S))),
    "special values": body(
        gauge("g", number(math.nan, T0), number(math.inf, T0 + S), number(-0.0, T0 + 2 * S))
    ),
    "counter with start times": body(
        counter(
            "requests",
            number(3, T0, {"a": "x"}, start_time_unix_nano=T0 - 10 * S),
            number(5, T0, {"a": "y"}, start_time_unix_nano=T0),  # its own millisecond
            number(9, T0 + S, {"a": "z"}),  # no start
            unit="1",
        )
    ),
    "non-monotonic sum": body(counter("queue", number(4, T0, GPU), monotonic=False)),
    "units and dots in names": body(gauge("gpu.memory.used", number(1e9, T0, GPU), unit="By")),
    "colliding attribute names and empty values": body(
        gauge("g", number(1.0, T0, {"a.b": "1", "a_b": "2", "empty": "", "c": "3"}))
    ),
    "non-string attribute values": body(
        gauge("g", number(1.0, T0, {"i": 5, "f": 0.5, "b": True, "l": ["x", 1]}))
    ),
    "resource with target_info": body(
        gauge("g", number(1.0, T0, GPU), number(2.0, T0 + 3 * S, GPU)),
        resource={
            "service.name": "svc",
            "service.namespace": "ns",
            "service.instance.id": "i-1",
            "host.name": "h",
        },
    ),
    "resource without identity": body(gauge("g", number(1.0, T0)), resource={"host.name": "h"}),
    "two resources": _two_resources(),
    "one series twice": body(gauge("g", number(1.0, T0, GPU), number(2.0, T0, GPU))),
    "dcgm counter sent as a gauge": body(gauge("DCGM_FI_DEV_POWER_VIOLATION", number(1.0, T0))),
}

# request bodies the general path decodes (the fast path says None)
GENERAL: dict[str, tuple[bytes, dict[str, str]]] = {
    "json": (
        b'{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"g","gauge":'
        b'{"dataPoints":[{"timeUnixNano":"1767225600000000000","asDouble":1}]}}]}]}]}',
        JSON,
    ),
    "histogram": (body(histogram("h", hist_point([1.0], [1, 2], 4.0))), PROTOBUF),
    "delta sum": (body(counter("d", number(1, T0), temporality=DELTA)), PROTOBUF),
    "no recorded value": (body(gauge("g", number(1.0, T0, flags=NO_RECORDED_VALUE))), PROTOBUF),
    "exemplar": (
        body(gauge("g", number(1.0, T0, exemplars=[pb.Exemplar(as_double=1.0)]))),
        PROTOBUF,
    ),
    "zero time": (body(gauge("g", number(1.0, 0), number(2.0, T0))), PROTOBUF),
    "time out of range": (body(gauge("g", number(1.0, 5), number(2.0, T0))), PROTOBUF),
    "no value": (body(gauge("g", pb.NumberDataPoint(time_unix_nano=T0))), PROTOBUF),
    "empty attribute key": (body(gauge("g", number(1.0, T0, {"": "x"}))), PROTOBUF),
    "invalid label value": (body(gauge("g", number(1.0, T0, {"a": "x\x00y"}))), PROTOBUF),
    "empty name": (body(gauge("", number(1.0, T0))), PROTOBUF),
    "metric without points": (body(gauge("g")), PROTOBUF),
    "not protobuf": (b"\xff\xff\xff", PROTOBUF),
}


def _decode(content: bytes, cache: OtlpSeriesCache, headers: dict[str, str] = PROTOBUF) -> Any:
    return decode_otlp(
        content,
        content_type=headers["Content-Type"],
        content_encoding=None,
        fast_cache=cache,
    )


def _general(content: bytes, headers: dict[str, str] = PROTOBUF) -> OtlpDecoded:
    return decode_general(content, content_type=headers["Content-Type"], content_encoding=None)


def _written(decoded: OtlpDecoded) -> DecodedWrite:
    OtlpStreams().apply(decoded.points, "")  # the zero samples at counter starts
    return to_write(decoded)


def _bits(table: pa.Table) -> pa.Table:
    """The table with values as their bits (NaN == NaN, -0.0 != 0.0)."""
    values = table.column("value").to_numpy().view(np.uint64)
    return table.set_column(2, "value", pa.array(values))


@pytest.mark.parametrize("name", sorted(FAST))
def test_usual_requests_decode_to_the_general_paths_rows(name: str) -> None:
    cache = OtlpSeriesCache()
    for _ in range(2):  # first sight (learns), then known
        fast, general = _decode(FAST[name], cache), _general(FAST[name])
        assert fast.fast is not None
        assert fast.points.starts == general.points.starts
        assert {(e.metric, e.labels) for e in fast.fast.distinct} == general.points.series
        for field in ("points", "rejected", "reasons", "exemplars", "kinds"):
            assert getattr(fast.points, field) == getattr(general.points, field), field
        fast_write, general_write = _written(fast), _written(general)
        assert isinstance(fast_write, KnownDecodedWrite)
        assert _bits(fast_write.table).equals(_bits(general_write.table))
        for field in ("samples", "stale_markers", "non_finite", "series", "kinds", "exemplars"):
            assert getattr(fast_write, field) == getattr(general_write, field), field


@pytest.mark.parametrize("name", sorted(FAST))
def test_resolved_series_are_the_ones_the_store_computes(name: str) -> None:
    fast, general = _decode(FAST[name], OtlpSeriesCache()), _general(FAST[name])
    fast_write, general_write = _written(fast), _written(general)
    resolved = fast_write.prepared()
    assert resolved is not None
    kinds = admissible_write_kinds(general_write.kinds, {})
    batch = normalize(general_write.table, kinds)
    assert np.array_equal(resolved.series_ids, batch.samples["series_id"].to_numpy())
    assert np.array_equal(resolved.timestamps, batch.samples["ts"].to_numpy())
    assert np.array_equal(
        resolved.values.view(np.uint64), batch.samples["value"].to_numpy().view(np.uint64)
    )
    assert sorted(set(resolved.series)) == sorted(batch.series)


def test_a_known_kind_stands_for_new_series() -> None:
    decoded = _decode(FAST["double gauge"], OtlpSeriesCache())
    write = to_write(decoded, {"g": "counter"}.get)
    resolved = write.prepared()
    assert resolved is not None
    assert {kind for *_, kind in resolved.series} == {"counter"}


@pytest.mark.parametrize("name", sorted(GENERAL))
def test_unusual_requests_are_left_to_the_general_path(name: str) -> None:
    content, headers = GENERAL[name]
    try:
        general = _general(content, headers)
    except Exception as exc:  # refused: the same error either way
        with pytest.raises(type(exc)) as raised:
            _decode(content, OtlpSeriesCache(), headers)
        assert str(raised.value) == str(exc)
        return
    decoded = _decode(content, OtlpSeriesCache(), headers)
    assert decoded.fast is None
    assert decoded.points == general.points


def test_the_series_cache_is_bounded() -> None:
    cache = OtlpSeriesCache(max_series=3)
    points = [number(1.0, T0, {"a": str(n)}) for n in range(10)]
    for _ in range(2):
        decoded = _decode(body(gauge("g", *points)), cache)
        assert decoded.fast is not None
        assert cache.size <= 3
        assert decoded.points.points == 10
