"""An application instrumented with the OpenTelemetry SDK exports OTLP to a real
``metricvault serve``; the vault then holds exactly what the SDK exported (issue 14).

The SDK's metrics are read with an ``InMemoryMetricReader`` in this process, and the very
``MetricsData`` it returned is sent with the SDK's own ``OTLPMetricExporter`` (protobuf, gzip),
so the test knows each exported point. The expected series are written out here from the
Prometheus OTLP compatibility rules for the instruments used (names, ``job``/``instance``,
``target_info``, ``le``, a zero sample at a cumulative stream's start time), independent of the
gateway's translation code. A restart of the application is a new ``MeterProvider`` (counters
from zero, new start times); DELTA temporality is added up by the gateway into the cumulative
sum; a JSON body is sent by hand.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from metricvault import Vault
from tests.e2e.conftest import GatewayProcess

pytestmark = pytest.mark.e2e
RESOURCE = {
    "service.namespace": "llm",
    "service.name": "chat",
    "service.instance.id": "pod-1",
    "deployment.environment": "test",
}
JOB_INSTANCE = (("instance", "pod-1"), ("job", "llm/chat"))
BOUNDS = (0.1, 1.0, 10.0)
# OTLP name -> (Prometheus base name, gets a zero sample at its start time)
NAMES = {
    "llm.tokens": ("llm_tokens_total", True),  # monotonic counter, unit {token}
    "llm.request.duration": ("llm_request_duration_seconds", True),  # histogram, unit s
    "llm.queue.depth": ("llm_queue_depth", False),  # up-down counter: a gauge
    "gpu.utilization": ("gpu_utilization_ratio", False),  # gauge, unit 1
}
ATTRIBUTE_LABELS = {"model": "model", "gpu.index": "gpu_index"}
Key = tuple[str, tuple[tuple[str, str], ...], int]
DELTA: dict[type, AggregationTemporality] = {
    Counter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
}


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import os

    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    yield


class App:
    """The instrumented application: a counter, a histogram, an up-down counter, a gauge."""

    def __init__(self, temporality: dict[type, AggregationTemporality] | None = None) -> None:
        self.reader = InMemoryMetricReader(preferred_temporality=temporality)
        view = View(
            instrument_name="llm.request.duration",
            aggregation=ExplicitBucketHistogramAggregation(BOUNDS),
        )
        self.provider = MeterProvider(
            resource=Resource.create(RESOURCE), metric_readers=[self.reader], views=[view]
        )
        meter = self.provider.get_meter("chat.server", "1.0")
        self.tokens = meter.create_counter("llm.tokens", unit="{token}")
        self.duration = meter.create_histogram("llm.request.duration", unit="s")
        self.queue = meter.create_up_down_counter("llm.queue.depth", unit="{request}")
        self.utilization = 0.5
        meter.create_observable_gauge("gpu.utilization", callbacks=[self._observe], unit="1")

    def _observe(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self.utilization, {"gpu.index": 0})]

    def collect(self) -> MetricsData:
        time.sleep(0.02)  # distinct milliseconds between start, records and collections
        data = self.reader.get_metrics_data()
        assert data is not None
        return data

    def shutdown(self) -> None:
        self.provider.shutdown()


def exporter(gw: GatewayProcess) -> OTLPMetricExporter:
    return OTLPMetricExporter(
        endpoint=f"{gw.url}/v1/metrics",
        compression=Compression.Gzip,
        timeout=10,
        preferred_temporality=DELTA,
    )


def export(gw: GatewayProcess, data: MetricsData, via: OTLPMetricExporter | None = None) -> None:
    result = (via or exporter(gw)).export(data)
    assert result is MetricExportResult.SUCCESS, gw.log_tail()


def points(data: MetricsData) -> Iterator[tuple[str, Any, Any]]:
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    yield metric.name, metric.data, point


def labels_of(point: Any, extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    pairs = {ATTRIBUTE_LABELS[k]: str(v) for k, v in (point.attributes or {}).items()}
    return tuple(sorted([*pairs.items(), *JOB_INSTANCE, *extra]))


def le(bound: float) -> str:
    return repr(bound).removesuffix(".0")


def expected_cumulative(data: MetricsData) -> dict[Key, float]:
    """What Prometheus's translation gives for one export of cumulative data."""
    out: dict[Key, float] = {}
    latest = 0
    for name, _, point in points(data):
        base, has_start = NAMES[name]
        ts = point.time_unix_nano // 1_000_000
        latest = max(latest, ts)
        start = (point.start_time_unix_nano or 0) // 1_000_000
        rows = list(_rows(base, point))
        for metric, labels, value in rows:
            out[(metric, labels, ts)] = value
            if has_start and start < ts:  # created-timestamp zero sample
                out[(metric, labels, start)] = 0.0
    resource = dict(data.resource_metrics[0].resource.attributes)
    info = {
        k.replace(".", "_"): str(v)
        for k, v in resource.items()
        if k not in ("service.name", "service.namespace", "service.instance.id")
    }
    out[("target_info", tuple(sorted([*info.items(), *JOB_INSTANCE])), latest)] = 1.0
    return out


def _rows(base: str, point: Any) -> Iterator[tuple[str, tuple[tuple[str, str], ...], float]]:
    if not hasattr(point, "bucket_counts"):
        yield base, labels_of(point), float(point.value)
        return
    running = 0
    for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
        running += count
        yield f"{base}_bucket", labels_of(point, (("le", le(bound)),)), float(running)
    yield f"{base}_bucket", labels_of(point, (("le", "+Inf"),)), float(point.count)
    yield f"{base}_sum", labels_of(point), float(point.sum)
    yield f"{base}_count", labels_of(point), float(point.count)


def vault_samples(vault: Vault) -> dict[Key, float]:
    table = vault.query("{__name__=~'.+'}", "2000-01-01", "2100-01-01", output="arrow")
    names = [c for c in table.column_names if c not in ("timestamp", "metric", "value")]
    ts = table["timestamp"].cast(pa.int64()).to_pylist()
    columns = {n: table[n].to_pylist() for n in names}
    out: dict[Key, float] = {}
    rows = zip(table["metric"].to_pylist(), ts, table["value"].to_pylist(), strict=True)
    for i, (metric, t, value) in enumerate(rows):
        labels = tuple((n, columns[n][i]) for n in names if columns[n][i] is not None)
        assert (metric, labels, t) not in out, f"stored twice: {metric}{labels} at {t}"
        out[(metric, labels, t)] = value
    return out


def check_equal(expected: dict[Key, float], actual: dict[Key, float]) -> None:
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing, f"{len(missing)} of {len(expected)} samples missing, e.g. {missing[:4]}"
    assert not extra, f"{len(extra)} samples the SDK never exported, e.g. {extra[:4]}"
    wrong = [(k, expected[k], actual[k]) for k in expected if expected[k] != actual[k]]
    assert not wrong, f"{len(wrong)} values differ (key, SDK, vault), e.g. {wrong[:4]}"


def test_sdk_export_is_stored_exactly_across_an_application_restart(gateway: Any) -> None:
    gw: GatewayProcess = gateway()
    expected: dict[Key, float] = {}
    app = App()
    app.tokens.add(5, {"model": "m-1"})
    app.duration.record(0.05, {"model": "m-1"})
    app.duration.record(3.0, {"model": "m-1"})
    app.queue.add(4)
    for step in range(2):
        data = app.collect()
        export(gw, data)
        expected.update(expected_cumulative(data))
        app.tokens.add(7, {"model": "m-1"})
        app.duration.record(0.5, {"model": "m-1"})
        app.queue.add(-1)
        app.utilization = 0.75 + step / 10
    app.shutdown()  # the application stops: 12 tokens counted, the last 7 never exported

    restarted = App()  # a new process: counters start from zero with a new start time
    restarted.tokens.add(30, {"model": "m-1"})  # more than before the restart
    restarted.duration.record(20.0, {"model": "m-1"})
    data = restarted.collect()
    export(gw, data)
    expected.update(expected_cumulative(data))
    restarted.shutdown()
    gw.stop_gracefully()

    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        check_equal(expected, vault_samples(vault))
        # 0 -> 5 -> 12 before the restart, 0 -> 30 after it: the zero sample at the new start
        # makes the reset visible although 30 > 12
        increase = vault.query(
            '{__name__="llm_tokens_total"}',
            "2000-01-01",
            "2100-01-01",
            step="all",
            aggs=("increase",),
        )
        assert list(increase["increase"]) == [12.0 + 30.0]
        end_ms = max(t for _, _, t in expected) + 1
        resets = vault.promql("resets(llm_tokens_total[1h])", start=end_ms)
        assert list(resets["value"]) == [1.0]


def test_delta_temporality_is_stored_as_the_cumulative_sum(gateway: Any) -> None:
    gw: GatewayProcess = gateway()
    app = App(DELTA)
    # One exporter, as an application has: its keep-alive connection reaches one gateway
    # worker, which holds the DELTA totals (a worker's own memory: docs/gateway.md). A new
    # connection per export could land on the other worker and start a second total.
    via = exporter(gw)
    totals: dict[Key, float] = {}
    running_tokens = 0
    running_hist: dict[str, float] = {}
    for adds in ([3, 4], [], [2]):
        for n in adds:
            app.tokens.add(n, {"model": "m-2"})
            app.duration.record(n / 2, {"model": "m-2"})
        data = app.collect()
        export(gw, data, via)
        for name, metric_data, point in points(data):
            if name not in ("llm.tokens", "llm.request.duration"):
                continue
            assert metric_data.aggregation_temporality == AggregationTemporality.DELTA
            ts = point.time_unix_nano // 1_000_000
            if name == "llm.tokens":
                running_tokens += point.value
                totals[("llm_tokens_total", labels_of(point), ts)] = float(running_tokens)
                continue
            for metric, labels, value in _rows("llm_request_duration_seconds", point):
                key = metric + repr(labels)
                running_hist[key] = running_hist.get(key, 0.0) + value
                totals[(metric, labels, ts)] = running_hist[key]
    app.shutdown()
    gw.stop_gracefully()
    assert running_tokens == 9
    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        actual = {
            k: v
            for k, v in vault_samples(vault).items()
            if k[0].startswith(("llm_tokens", "llm_request_duration"))
        }
    check_equal(totals, actual)
    assert [
        v
        for (m, _, _), v in sorted(actual.items(), key=lambda kv: kv[0][2])
        if m == "llm_tokens_total"
    ] == [7.0, 9.0]


def test_a_json_export_is_stored_like_protobuf(gateway: Any) -> None:
    gw: GatewayProcess = gateway()
    app = App()
    app.tokens.add(11, {"model": "m-3"})
    app.duration.record(0.2, {"model": "m-3"})
    data = app.collect()
    app.shutdown()
    document = json_format.MessageToDict(encode_metrics(data))  # int64 as strings
    request = urllib.request.Request(
        f"{gw.url}/v1/metrics",
        data=json.dumps(document).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        assert json.loads(response.read()) == {}
    gw.stop_gracefully()
    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        check_equal(expected_cumulative(data), vault_samples(vault))
