"""Hand-made OTLP requests for the OTLP tests (built with opentelemetry-proto's messages)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

T0_MS = 1_767_225_600_000  # 2026-01-01
T0 = T0_MS * 1_000_000  # ns
S = 1_000_000_000  # one second in ns
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
CUMULATIVE = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = pb.AGGREGATION_TEMPORALITY_DELTA
NO_RECORDED_VALUE = pb.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue(string_value=value)


def attrs(mapping: dict[str, Any] | None) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in (mapping or {}).items()]


def number(value: float | int, t: int = T0, labels: dict | None = None, **kw: Any) -> Any:
    point = pb.NumberDataPoint(attributes=attrs(labels), time_unix_nano=t, **kw)
    if isinstance(value, int):
        point.as_int = value
    else:
        point.as_double = value
    return point


def gauge(name: str, *points: Any, unit: str = "") -> Any:
    return pb.Metric(name=name, unit=unit, gauge=pb.Gauge(data_points=points))


def counter(
    name: str, *points: Any, unit: str = "", monotonic: bool = True, temporality: Any = CUMULATIVE
) -> Any:
    data = pb.Sum(data_points=points, is_monotonic=monotonic, aggregation_temporality=temporality)
    return pb.Metric(name=name, unit=unit, sum=data)


def histogram(name: str, *points: Any, unit: str = "", temporality: Any = CUMULATIVE) -> Any:
    data = pb.Histogram(data_points=points, aggregation_temporality=temporality)
    return pb.Metric(name=name, unit=unit, histogram=data)


def hist_point(
    bounds: list[float], counts: list[int], total: float | None = None, t: int = T0, **kw: Any
) -> Any:
    point = pb.HistogramDataPoint(
        time_unix_nano=t, explicit_bounds=bounds, bucket_counts=counts, count=sum(counts), **kw
    )
    if total is not None:
        point.sum = total
    return point


def request(*metrics: Any, resource: dict[str, Any] | None = None) -> ExportMetricsServiceRequest:
    if resource is None:
        resource = {"service.name": "svc"}
    return ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=attrs(resource)),
                scope_metrics=[
                    pb.ScopeMetrics(scope=InstrumentationScope(name="test"), metrics=metrics)
                ],
            )
        ]
    )


def body(*metrics: Any, resource: dict[str, Any] | None = None) -> bytes:
    return bytes(request(*metrics, resource=resource).SerializeToString())


def partial(content: bytes) -> tuple[int, str]:
    """(rejected_data_points, error_message) of a protobuf reply."""
    reply = ExportMetricsServiceResponse.FromString(content)
    return reply.partial_success.rejected_data_points, reply.partial_success.error_message
