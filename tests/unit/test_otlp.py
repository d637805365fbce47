"""OTLP metrics into the gateway (issue 14): the translation rules Prometheus's OTLP receiver
follows, one test per rule, DELTA accumulation, and a corpus of bad requests answered over
HTTP (Starlette's in-process client over a real vault) with what was refused and why.

The real OpenTelemetry SDK exporting to a real ``metricvault serve`` is in
tests/e2e/test_gateway_otlp.py.
"""

from __future__ import annotations

import gzip
import json
import math
import struct
from typing import Any

import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from metricvault import Vault
from metricvault.config import BearerToken
from metricvault.credentials import hash_secret
from metricvault.ingest.protocols.otlp import OtlpStreams, decode_otlp, to_write
from metricvault.ingest.protocols.otlp_names import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    NON_MONOTONIC,
    SUMMARY,
    label_name,
    metric_name,
)
from metricvault.model import STALE_NAN_BITS
from tests.unit.otlp_requests import (
    DELTA,
    JSON,
    NO_RECORDED_VALUE,
    PROTOBUF,
    T0,
    T0_MS,
    S,
    body,
    counter,
    gauge,
    hist_point,
    histogram,
    number,
    partial,
    request,
)

Rows = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, float]]]


def translate(
    content: bytes, streams: OtlpStreams | None = None, content_type: str = PROTOBUF["Content-Type"]
) -> tuple[Rows, Any]:
    """{(metric, labels): [(ts_ms, value)]} of one request, through the stream state."""
    decoded = decode_otlp(content, content_type=content_type, content_encoding=None)
    (streams or OtlpStreams()).apply(decoded.points, "").commit()
    table = to_write(decoded).table.to_pylist()
    rows: Rows = {}
    for row in table:
        labels = tuple(
            sorted(
                (k, v)
                for k, v in row.items()
                if k not in ("metric", "timestamp", "value") and v is not None
            )
        )
        rows.setdefault((row["metric"], labels), []).append((row["timestamp"], row["value"]))
    return rows, decoded


SVC = (("job", "svc"),)


def bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


# ---------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [  # the UnderscoreEscapingWithSuffixes cases of otlptranslator's metric_namer_test.go
        ("requests", "", COUNTER, "requests_total"),
        ("cpu_usage", "1", GAUGE, "cpu_usage_ratio"),
        ("items", "1", COUNTER, "items_total"),
        ("response_time", "ms", GAUGE, "response_time_milliseconds"),
        ("requests", "1/s", GAUGE, "requests_per_second"),
        ("throughput", "By/s", GAUGE, "throughput_bytes_per_second"),
        ("custom_metric", "custom_unit", GAUGE, "custom_metric_custom_unit"),
        ("custom_metric", "{custom}", GAUGE, "custom_metric"),
        ("custom_metric", "By/{custom}", GAUGE, "custom_metric_bytes"),
        ("requests_total", "", COUNTER, "requests_total"),
        ("cpu_usage_ratio", "1", GAUGE, "cpu_usage_ratio"),
        ("response_time_seconds", "s", GAUGE, "response_time_seconds"),
        # and the rules one by one
        ("http.server.request.duration", "s", HISTOGRAM, "http_server_request_duration_seconds"),
        ("system.memory.usage", "By", NON_MONOTONIC, "system_memory_usage_bytes"),
        ("http.requests", "{request}", COUNTER, "http_requests_total"),
        ("total.requests", "", COUNTER, "requests_total"),
        ("gpu.utilization", "1", NON_MONOTONIC, "gpu_utilization"),  # _ratio: gauges only
        ("rpc.latency", "ms", SUMMARY, "rpc_latency_milliseconds"),
        ("2xx.responses", "", COUNTER, "_2xx_responses_total"),
        ("foo..bar__baz-", "", GAUGE, "foo_bar_baz"),
        ("node:cpu", "", GAUGE, "node:cpu"),
        ("energy", "J", COUNTER, "energy_joules_total"),
        ("temp", "Cel", GAUGE, "temp_celsius"),
    ],
)
def test_metric_names_are_prometheus_otlp_names(name, unit, kind, expected):
    assert metric_name(name, unit, kind) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("http.method", "http_method"),
        ("service_version", "service_version"),
        ("1code", "key_1code"),
        ("a..b", "a_b"),
        ("a__b", "a_b"),
        ("_private", "_private"),
        ("__meta__", "__meta__"),
        ("k8s.pod-name", "k8s_pod_name"),
        ("ünï", "_n_"),
    ],
)
def test_label_names_are_sanitised_as_prometheus_does(key, expected):
    assert label_name(key) == expected


# ---------------------------------------------------------------------------- types
def test_gauges_keep_int_and_double_values_and_times_become_ms():
    rows, _ = translate(
        body(
            gauge("gpu.temp", number(71, T0 + 1_999_999), unit="Cel"),
            gauge("load", number(0.25, T0, {"cpu": "0"}), unit="1"),
        )
    )
    assert rows[("gpu_temp_celsius", SVC)] == [(T0_MS + 1, 71.0)]
    assert rows[("load_ratio", (("cpu", "0"), *SVC))] == [(T0_MS, 0.25)]


def test_monotonic_sums_are_counters_and_non_monotonic_ones_gauges():
    rows, decoded = translate(
        body(
            counter("http.requests", number(5), unit="{request}"),
            counter("queue.depth", number(-3), unit="{item}", monotonic=False),
        )
    )
    assert rows[("http_requests_total", SVC)] == [(T0_MS, 5.0)]
    assert rows[("queue_depth", SVC)] == [(T0_MS, -3.0)]
    assert decoded.points.kinds == {"http_requests_total": "counter", "queue_depth": "gauge"}


def test_explicit_histograms_become_cumulative_buckets_sum_and_count():
    point = hist_point([0.1, 1, 10], [1, 2, 0, 3], total=42.5)
    rows, decoded = translate(body(histogram("rpc.duration", point, unit="s")))
    name = "rpc_duration_seconds"
    buckets = {dict(labels)["le"]: v for (m, labels), v in rows.items() if m == f"{name}_bucket"}
    assert buckets == {
        "0.1": [(T0_MS, 1.0)],
        "1": [(T0_MS, 3.0)],
        "10": [(T0_MS, 3.0)],
        "+Inf": [(T0_MS, 6.0)],
    }
    assert rows[(f"{name}_sum", SVC)] == [(T0_MS, 42.5)]
    assert rows[(f"{name}_count", SVC)] == [(T0_MS, 6.0)]
    assert decoded.points.kinds[f"{name}_bucket"] == "counter"


def test_a_histogram_without_sum_has_no_sum_series():
    rows, _ = translate(body(histogram("h", hist_point([1], [1, 1]))))
    assert ("h_sum", SVC) not in rows and rows[("h_count", SVC)] == [(T0_MS, 2.0)]


def _exponential(scale: int, offset: int, counts: list[int], zero: int = 0, negative=()):
    point = pb.ExponentialHistogramDataPoint(
        time_unix_nano=T0, scale=scale, zero_count=zero, sum=10.0
    )
    point.positive.offset = offset
    point.positive.bucket_counts.extend(counts)
    point.negative.bucket_counts.extend(negative)
    point.count = zero + sum(counts) + sum(negative)
    metric = pb.Metric(name="latency", unit="s")
    metric.exponential_histogram.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    metric.exponential_histogram.data_points.append(point)
    return metric


def test_exponential_histograms_become_exact_power_of_two_buckets():
    # scale 1: bucket i covers (2^(i/2), 2^((i+1)/2)]; indexes 0..3 merge into (1,2] and (2,4]
    rows, decoded = translate(body(_exponential(1, 0, [1, 2, 3, 4], zero=5)))
    buckets = {
        dict(labels)["le"]: v[0][1]
        for (m, labels), v in rows.items()
        if m == "latency_seconds_bucket"
    }
    assert buckets == {"0": 5.0, "2": 8.0, "4": 15.0, "+Inf": 15.0}
    assert rows[("latency_seconds_count", SVC)] == [(T0_MS, 15.0)]
    assert decoded.points.rejected == 0
    # a negative scale keeps its own (coarser) bounds: scale -1 bucket 1 covers (4, 16]
    rows, _ = translate(body(_exponential(-1, 1, [7])))
    buckets = {
        dict(labels)["le"]: v[0][1]
        for (m, labels), v in rows.items()
        if m == "latency_seconds_bucket"
    }
    assert buckets == {"0": 0.0, "16": 7.0, "+Inf": 7.0}


def test_exponential_histograms_with_negative_observations_are_rejected():
    rows, decoded = translate(body(_exponential(2, 0, [1], negative=[2])))
    assert rows == {}
    assert decoded.points.rejected == 1
    assert "negative buckets" in decoded.error_message()


def test_summaries_become_quantile_sum_and_count_series():
    point = pb.SummaryDataPoint(time_unix_nano=T0, count=10, sum=4.5)
    point.quantile_values.add(quantile=0.5, value=0.3)
    point.quantile_values.add(quantile=0.99, value=1.2)
    metric = pb.Metric(name="gc.pause", unit="s", summary=pb.Summary(data_points=[point]))
    rows, decoded = translate(body(metric))
    assert rows[("gc_pause_seconds", (("job", "svc"), ("quantile", "0.5")))] == [(T0_MS, 0.3)]
    assert rows[("gc_pause_seconds", (("job", "svc"), ("quantile", "0.99")))] == [(T0_MS, 1.2)]
    assert rows[("gc_pause_seconds_sum", SVC)] == [(T0_MS, 4.5)]
    assert rows[("gc_pause_seconds_count", SVC)] == [(T0_MS, 10.0)]
    assert decoded.points.kinds["gc_pause_seconds"] == "gauge"


# ---------------------------------------------------------------------------- labels
def test_resource_attributes_give_job_instance_and_target_info():
    resource = {
        "service.namespace": "llm",
        "service.name": "vllm",
        "service.instance.id": "pod-7",
        "host.name": "gpu-node-3",
        "k8s.pod.uid": "abc",
    }
    content = body(
        gauge("a", number(1.0, T0)), gauge("b", number(2.0, T0 + 5 * S)), resource=resource
    )
    rows, _ = translate(content)
    ident = (("instance", "pod-7"), ("job", "llm/vllm"))
    assert rows[("a", ident)] == [(T0_MS, 1.0)]
    info_labels = (
        ("host_name", "gpu-node-3"),
        *ident[:1],
        ("job", "llm/vllm"),
        ("k8s_pod_uid", "abc"),
    )
    assert rows[("target_info", info_labels)] == [(T0_MS + 5000, 1.0)]  # the latest time
    # only identifying attributes: no target_info (Prometheus adds none)
    rows, _ = translate(body(gauge("a", number(1.0)), resource={"service.name": "x"}))
    assert [m for m, _ in rows] == ["a"]


def test_point_attributes_override_nothing_of_job_and_collisions_are_joined():
    point = number(
        1.0,
        T0,
        {
            "job": "mine",
            "a.b": "x",
            "a_b": "y",
            "flag": True,
            "n": 3,
            "ratio": 0.5,
            "big": 1e21,
            "list": ["p", 2],
        },
    )
    rows, _ = translate(body(gauge("m", point)))
    ((_metric, labels),) = rows
    assert dict(labels) == {
        "job": "svc",  # the resource's service.name wins, as in Prometheus
        "a_b": "x;y",  # keys that collide after sanitising, values in key order
        "flag": "true",
        "n": "3",
        "ratio": "0.5",
        "big": "1e+21",
        "list": '["p",2]',
    }


# ---------------------------------------------------------------------------- time
def test_no_recorded_value_becomes_the_staleness_marker():
    stale = number(0.0, T0, flags=NO_RECORDED_VALUE)
    hist = pb.HistogramDataPoint(time_unix_nano=T0, explicit_bounds=[1.0], flags=NO_RECORDED_VALUE)
    rows, decoded = translate(body(gauge("g", stale), histogram("h", hist)))
    assert [bits(v) for _, v in rows[("g", SVC)]] == [STALE_NAN_BITS]
    for metric in ("h_bucket", "h_count"):
        for (m, _), values in rows.items():
            if m == metric:
                assert [bits(v) for _, v in values] == [STALE_NAN_BITS]
    assert ("h_bucket", (("job", "svc"), ("le", "1"))) in rows
    assert to_write(decoded).stale_markers == 4  # g, h_bucket{le=1}, +Inf, h_count


def test_start_time_gives_one_zero_sample_per_start():
    streams = OtlpStreams()
    start = T0 - 10 * S

    def export(value: int, t: int, start: int) -> Rows:
        return translate(body(counter("c", number(value, t, start_time_unix_nano=start))), streams)[
            0
        ]

    assert export(3, T0, start) == {("c_total", SVC): [(T0_MS, 3.0), (T0_MS - 10_000, 0.0)]}
    assert export(9, T0 + S, start) == {("c_total", SVC): [(T0_MS + 1000, 9.0)]}
    # a restarted process: a new start time reads as a reset though 20 > 9
    rows = export(20, T0 + 5 * S, T0 + 2 * S)
    assert rows == {("c_total", SVC): [(T0_MS + 5000, 20.0), (T0_MS + 2000, 0.0)]}
    # gauges have no start
    rows, _ = translate(body(gauge("g", number(1.0, T0, start_time_unix_nano=start))), streams)
    assert rows == {("g", SVC): [(T0_MS, 1.0)]}


def test_a_start_in_the_first_points_millisecond_never_gets_a_zero_over_that_point():
    """Found by the OTel-export e2e test: a short run's first export landed in the counter's
    start millisecond; the next export wrote the start's zero over the real first sample."""
    streams = OtlpStreams()
    start = T0  # the first point comes 500 ns later: the same millisecond

    def export(value: int, t: int) -> Rows:
        content = body(counter("c", number(value, t, start_time_unix_nano=start)))
        return translate(content, streams)[0]

    assert export(3000, T0 + 500) == {("c_total", SVC): [(T0_MS, 3000.0)]}
    assert export(3500, T0 + S) == {("c_total", SVC): [(T0_MS + 1000, 3500.0)]}


def test_delta_sums_are_added_up_per_stream():
    streams = OtlpStreams()

    def export(value: int, t: int, labels=None) -> tuple[Rows, Any]:
        point = number(value, t, labels, start_time_unix_nano=t - S)
        return translate(body(counter("tokens", point, temporality=DELTA)), streams)

    assert export(5, T0)[0] == {("tokens_total", SVC): [(T0_MS, 5.0)]}
    assert export(2, T0 + S)[0] == {("tokens_total", SVC): [(T0_MS + 1000, 7.0)]}
    assert export(4, T0 + S, {"model": "b"})[0] == {
        ("tokens_total", (("job", "svc"), ("model", "b"))): [(T0_MS + 1000, 4.0)]
    }
    rows, decoded = export(2, T0 + S)  # a resend of a delta already added
    assert rows == {} and decoded.points.rejected == 1
    assert "not after the last one added up" in decoded.error_message()
    assert export(1, T0 + 2 * S)[0] == {("tokens_total", SVC): [(T0_MS + 2000, 8.0)]}


def test_delta_histograms_are_added_up_and_new_bounds_restart_them():
    streams = OtlpStreams()

    def export(bounds, counts, t) -> Rows:
        point = hist_point(bounds, counts, total=float(sum(counts)), t=t)
        return translate(body(histogram("h", point, temporality=DELTA)), streams)[0]

    export([1.0], [1, 2], T0)
    rows = export([1.0], [3, 0], T0 + S)
    assert rows[("h_bucket", (("job", "svc"), ("le", "1")))] == [(T0_MS + 1000, 4.0)]
    assert rows[("h_count", SVC)] == [(T0_MS + 1000, 6.0)]
    assert rows[("h_sum", SVC)] == [(T0_MS + 1000, 6.0)]
    rows = export([2.0], [1, 0], T0 + 2 * S)  # other bounds: the total starts again
    assert rows[("h_count", SVC)] == [(T0_MS + 2000, 1.0)]


def test_a_refused_request_changes_no_stream():
    streams = OtlpStreams()
    content = body(counter("c", number(5, T0, start_time_unix_nano=T0 - S), temporality=DELTA))
    decoded = decode_otlp(content, content_type="application/x-protobuf", content_encoding=None)
    streams.apply(decoded.points, "")  # not committed: as if storing it failed
    rows, _ = translate(content, streams)
    assert rows == {("c_total", SVC): [(T0_MS, 5.0)]}


# ---------------------------------------------------------------------------- encodings
def test_json_bodies_with_hex_ids_and_string_int64():
    document = {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]
                },
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "requests",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        {
                                            "asInt": "12",
                                            "timeUnixNano": str(T0),
                                            "exemplars": [
                                                {
                                                    "asDouble": 1.0,
                                                    "timeUnixNano": str(T0),
                                                    "traceId": "5b8efff798038103d269b633813fc60c",
                                                    "spanId": "eee19b7ec3c1b174",
                                                }
                                            ],
                                        }
                                    ],
                                },
                                "someFutureField": {"x": 1},
                            }
                        ]
                    }
                ],
            }
        ]
    }
    rows, decoded = translate(json.dumps(document).encode(), content_type="application/json")
    assert rows == {("requests_total", SVC): [(T0_MS, 12.0)]}
    assert decoded.points.exemplars == 1


# ---------------------------------------------------------------------------- over HTTP


def stored(vault: Vault) -> dict[str, list[float]]:
    """{metric: [values]} of everything in the vault (staleness markers included)."""
    vault.flush()
    frame = vault.query(
        '{__name__=~".+"}', start=T0_MS - 3_600_000, end=T0_MS + 3_600_000, stale_markers=True
    )
    out: dict[str, list[float]] = {}
    for metric, value in zip(frame["metric"], frame["value"], strict=True):
        out.setdefault(metric, []).append(float(value))
    return out


def test_an_export_is_stored_and_answered_with_an_empty_response(make_client):
    client, vault = make_client()
    content = body(counter("tokens", number(7)), gauge("gpu.util", number(0.5), unit="1"))
    r = client.post("/v1/metrics", content=content, headers=PROTOBUF)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    assert ExportMetricsServiceResponse.FromString(r.content).HasField("partial_success") is False
    assert stored(vault) == {"tokens_total": [7.0], "gpu_util_ratio": [0.5]}
    page = client.get("/metrics").text
    assert 'metricvault_samples_received_total{protocol="otlp"} 2.0' in page
    assert 'metricvault_samples_stored_total{protocol="otlp"} 2.0' in page
    # gzip and JSON, answered in JSON
    r = client.post(
        "/v1/metrics",
        content=gzip.compress(
            json.dumps(json_format.MessageToDict(request(gauge("x", number(1.0))))).encode()
        ),
        headers={**JSON, "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {}
    assert stored(vault)["x"] == [1.0]


def _good() -> Any:
    return gauge("good", number(1.0))


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


TRUNCATED = body(_good(), counter("c", number(5)))[:-7]


def _nested_attribute(levels: int, kind: str) -> bytes:
    """An export whose one data point's attribute value nests ``levels`` deep (as text: the
    document is too deep for json.dumps itself)."""
    if kind == "kvlistValue":
        opening, closing = '{"kvlistValue": {"values": [{"key": "k", "value": ', "}]}}"
    else:
        opening, closing = '{"arrayValue": {"values": [', "]}}"
    value = opening * levels + '{"intValue": "1"}' + closing * levels
    point = '{"timeUnixNano": "1767225600000000000", "asDouble": 1, "attributes": ' + (
        '[{"key": "deep", "value": ' + value + "}]}"
    )
    return (
        '{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "g", "gauge": '
        '{"dataPoints": [' + point + "]}}]}]}]}"
    ).encode()


# (id, headers, body, status, message part, data points rejected (200 only))
BAD: list[tuple[str, dict[str, str], bytes, int, str, int]] = [
    (
        "JSON kvlistValue 5,000 deep",
        JSON,
        _nested_attribute(5000, "kvlistValue"),
        400,
        "deeper than 100 levels",
        0,
    ),
    (
        "JSON arrayValue 5,000 deep",
        JSON,
        _nested_attribute(5000, "arrayValue"),
        400,
        "deeper than 100 levels",
        0,
    ),
    ("JSON [ 100,000 deep", JSON, b"[" * 100_000, 400, "deeper than 100 levels", 0),
    ("JSON {[ 100,000 deep", JSON, b'{"a": ' + b"[" * 100_000, 400, "deeper than 100 levels", 0),
    ("truncated protobuf", PROTOBUF, TRUNCATED, 400, "not a valid protobuf", 0),
    ("garbage protobuf", PROTOBUF, b"\xff\xff\xff\xff", 400, "not a valid protobuf", 0),
    (
        "wrong content type",
        {"Content-Type": "text/plain"},
        body(_good()),
        415,
        "not an OTLP/HTTP encoding",
        0,
    ),
    ("no content type", {}, body(_good()), 415, "Content-Type none", 0),
    (
        "bad gzip",
        {**PROTOBUF, "Content-Encoding": "gzip"},
        b"plain bytes, no gzip",
        400,
        "not valid gzip",
        0,
    ),
    (
        "truncated gzip",
        {**PROTOBUF, "Content-Encoding": "gzip"},
        gzip.compress(body(_good()))[:-9],
        400,
        "ends early",
        0,
    ),
    (
        "unknown encoding",
        {**PROTOBUF, "Content-Encoding": "br"},
        body(_good()),
        415,
        "Content-Encoding",
        0,
    ),
    ("not JSON", JSON, b"{resourceMetrics", 400, "not JSON", 0),
    ("JSON array", JSON, b"[]", 400, "not an object", 0),
    (
        "JSON wrong type",
        JSON,
        _json(
            {
                "resourceMetrics": [
                    {
                        "scopeMetrics": [
                            {
                                "metrics": [
                                    {"name": "a", "gauge": {"dataPoints": [{"asDouble": "lots"}]}}
                                ]
                            }
                        ]
                    }
                ]
            }
        ),
        400,
        "not a valid OTLP/JSON",
        0,
    ),
    (
        "JSON negative count",
        JSON,
        _json(
            {
                "resourceMetrics": [
                    {
                        "scopeMetrics": [
                            {
                                "metrics": [
                                    {
                                        "name": "h",
                                        "histogram": {
                                            "aggregationTemporality": 2,
                                            "dataPoints": [
                                                {"count": "-1", "timeUnixNano": str(T0)}
                                            ],
                                        },
                                    }
                                ]
                            }
                        ]
                    }
                ]
            }
        ),
        400,
        "not a valid OTLP/JSON",
        0,
    ),
    (
        "JSON bad trace id",
        JSON,
        _json(
            {
                "resourceMetrics": [
                    {
                        "scopeMetrics": [
                            {
                                "metrics": [
                                    {
                                        "name": "a",
                                        "gauge": {
                                            "dataPoints": [
                                                {"asDouble": 1, "exemplars": [{"traceId": "zz"}]}
                                            ]
                                        },
                                    }
                                ]
                            }
                        ]
                    }
                ]
            }
        ),
        400,
        "traceId",
        0,
    ),
    ("missing metric name", PROTOBUF, body(_good(), gauge("", number(2.0))), 200, "empty name", 1),
    (
        "name of punctuation",
        PROTOBUF,
        body(_good(), gauge("...", number(2.0))),
        200,
        "no character Prometheus",
        1,
    ),
    (
        "buckets vs bounds",
        PROTOBUF,
        body(_good(), histogram("h", hist_point([1, 2], [1, 1]))),
        200,
        "2 bucket_counts for 2 explicit_bounds",
        1,
    ),
    (
        "count vs buckets",
        PROTOBUF,
        body(
            _good(),
            histogram(
                "h",
                pb.HistogramDataPoint(
                    time_unix_nano=T0, explicit_bounds=[1], bucket_counts=[1, 1], count=5
                ),
            ),
        ),
        200,
        "add up to 2",
        1,
    ),
    (
        "non-monotonic bounds",
        PROTOBUF,
        body(_good(), histogram("h", hist_point([2, 1], [1, 1, 1]))),
        200,
        "not strictly increasing",
        1,
    ),
    (
        "NaN bound",
        PROTOBUF,
        body(_good(), histogram("h", hist_point([math.nan], [1, 1]))),
        200,
        "NaN",
        1,
    ),
    (
        "negative exponential",
        PROTOBUF,
        body(_good(), _exponential(0, 0, [1], negative=[1])),
        200,
        "negative buckets",
        1,
    ),
    (
        "control character",
        PROTOBUF,
        body(_good(), gauge("cc", number(1.0, T0, {"path": "a\x07b"}))),
        200,
        "control character U+0007",
        1,
    ),
    (
        "reserved label",
        PROTOBUF,
        body(_good(), gauge("r", number(1.0, T0, {"value": "x"}))),
        200,
        'invalid label name "value": it is reserved',
        1,
    ),
    (
        "__ label",
        PROTOBUF,
        body(_good(), gauge("r", number(1.0, T0, {"__x__": "x"}))),
        200,
        "reserved by Prometheus",
        1,
    ),
    (
        "empty attribute key",
        PROTOBUF,
        body(_good(), gauge("r", number(1.0, T0, {"": "x"}))),
        200,
        "empty key",
        1,
    ),
    ("no time", PROTOBUF, body(_good(), gauge("t", number(1.0, 0))), 200, "time_unix_nano is 0", 1),
    (
        "time in seconds",
        PROTOBUF,
        body(_good(), gauge("t", number(1.0, T0 // 10**9))),
        200,
        "outside the years",
        1,
    ),
    (
        "no value",
        PROTOBUF,
        body(_good(), gauge("v", pb.NumberDataPoint(time_unix_nano=T0))),
        200,
        "neither as_double nor as_int",
        1,
    ),
    (
        "unspecified temporality",
        PROTOBUF,
        body(_good(), counter("u", number(1), temporality=0)),
        200,
        "temporality 0",
        1,
    ),
    (
        "quantile over 1",
        PROTOBUF,
        body(
            _good(),
            pb.Metric(
                name="s",
                summary=pb.Summary(
                    data_points=[
                        pb.SummaryDataPoint(
                            time_unix_nano=T0,
                            quantile_values=[pb.SummaryDataPoint.ValueAtQuantile(quantile=1.5)],
                        )
                    ]
                ),
            ),
        ),
        200,
        "outside 0..1",
        1,
    ),
    (
        "long label value",
        PROTOBUF,
        body(_good(), gauge("l", number(1.0, T0, {"text": "x" * 5000}))),
        200,
        "5000 bytes",
        1,
    ),
]


@pytest.mark.parametrize(
    ("headers", "content", "status", "message", "rejected"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_otlp_requests_are_refused_or_partly_rejected(
    make_client, headers, content, status, message, rejected
):
    client, vault = make_client()
    r = client.post("/v1/metrics", content=content, headers=headers)
    assert r.status_code == status, r.text
    if status == 200:
        count, error = partial(r.content)
        assert count == rejected and message in error, error
        assert stored(vault) == {"good": [1.0]}  # the rest of the request, nothing of the bad
    else:
        assert message in r.text, r.text
        assert vault.buffer.depth() == (0, 0)


def test_nested_attribute_values_within_the_depth_limit_are_stored(make_client):
    client, vault = make_client()
    r = client.post("/v1/metrics", content=_nested_attribute(5, "kvlistValue"), headers=JSON)
    assert r.status_code == 200, r.text
    assert stored(vault) == {"g": [1.0]}


def test_refusals_carry_a_google_rpc_status_in_the_requests_encoding(make_client):
    client, _ = make_client()
    r = client.post("/v1/metrics", content=b"[]", headers=JSON)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["code"] == 3 and "not an object" in r.json()["message"]
    r = client.post("/v1/metrics", content=b"\xff\xff", headers=PROTOBUF)
    assert r.headers["content-type"] == "application/x-protobuf"
    assert r.content[:2] == b"\x08\x03" and b"not a valid protobuf" in r.content


def test_limits_of_the_other_protocols_apply(make_client):
    client, vault = make_client(max_series_per_request=3, max_body_bytes=4000)
    many = body(*(gauge(f"m{i}", number(1.0)) for i in range(4)))
    r = client.post("/v1/metrics", content=many, headers=PROTOBUF)
    assert r.status_code == 413 and b"max_series_per_request" in r.content
    big = body(gauge("g", number(1.0, T0, {"text": "y" * 4000})))
    r = client.post("/v1/metrics", content=big, headers=PROTOBUF)
    assert r.status_code == 413 and b"max_body_bytes" in r.content
    bomb = gzip.compress(
        body(*(gauge(f"m{i}", number(1.0, T0, {"pad": "z" * 900})) for i in range(2))) * 3
    )
    r = client.post("/v1/metrics", content=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and b"inflates to more" in r.content
    client, vault2 = make_client(max_label_names_per_request=2)
    r = client.post(
        "/v1/metrics",
        content=body(gauge("g", number(1.0, T0, {"a": "1", "b": "2"}))),
        headers=PROTOBUF,
    )
    assert r.status_code == 413 and b"max_label_names_per_request" in r.content  # a, b, job
    assert vault.buffer.depth() == (0, 0) and vault2.buffer.depth() == (0, 0)


def test_authentication_and_tenants_are_those_of_the_gateway(make_client):
    client, vault = make_client(auth_bearer_tokens=(BearerToken(hash_secret("s3cret"), "team-a"),))
    content = body(gauge("g", number(1.0)))
    r = client.post("/v1/metrics", content=content, headers=PROTOBUF)
    assert r.status_code == 401 and "WWW-Authenticate" in r.headers
    assert b"credentials" in r.content.lower() or b"authorization" in r.content.lower()
    assert vault.buffer.depth() == (0, 0)
    r = client.post(
        "/v1/metrics", content=content, headers={**PROTOBUF, "Authorization": "Bearer s3cret"}
    )
    assert r.status_code == 200
    vault.flush()
    frame = vault.query('{__name__="g"}', start=T0_MS - 1000, end=T0_MS + 1000)
    assert list(frame["tenant"]) == ["team-a"]


def test_new_series_limit_is_429_with_retry_after_and_counts_a_delta_once(make_client):
    client, vault = make_client(max_new_series_per_minute=2)
    r = client.post(
        "/v1/metrics",
        content=body(gauge("a", number(1.0)), gauge("b", number(1.0))),
        headers=PROTOBUF,
    )
    assert r.status_code == 200
    delta = body(counter("d", number(5, T0, start_time_unix_nano=T0 - S), temporality=DELTA))
    r = client.post("/v1/metrics", content=delta, headers=PROTOBUF)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert b"max_new_series_per_minute" in r.content
    assert "d_total" not in stored(vault)


def test_a_full_buffer_is_503_with_retry_after_in_a_status_body(make_client):
    client, vault = make_client(buffer_max_bytes=1, flush_interval="1h")
    first = client.post("/v1/metrics", content=body(gauge("a", number(1.0))), headers=PROTOBUF)
    assert first.status_code == 200
    r = client.post("/v1/metrics", content=body(gauge("a", number(2.0, T0 + S))), headers=PROTOBUF)
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
    assert r.content.startswith(b"\x08\x0e") and b"buffer_max_bytes" in r.content
    assert stored(vault) == {"a": [1.0]}
