"""Issue 14 (OTel out), end to end: an ASGI app with ``MetricsMiddleware(meter_provider=...)``
and a ``track(..., meter_provider=...)`` run export with the real OTLP/HTTP exporter to a real
``metricvault serve``'s ``POST /v1/metrics``; the vault then holds the Prometheus path's
series names, with the values an in-memory reader in the same process saw; the sent requests
carry the trace-id exemplar (the gateway counts exemplars, it does not store them)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricExportResult,
    NumberDataPoint,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from metricvault.collect.inference import MetricsMiddleware
from metricvault.collect.training import track
from metricvault.store.vault import Vault
from tests.otlp_names import prometheus_name
from tests.unit.test_collect_inference import TRACE, client, make_app
from tests.unit.test_collect_otel import SAMPLED, metrics_of, prometheus_series

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.usefixtures("no_nvml"),
    pytest.mark.filterwarnings("ignore::metricvault.collect.training.SeriesNamesNotice"),
]
REQUESTS = ("/hello", "/items/1", "/items/2", "/stream", "/unavailable", "/nope")
SERVICE = "llm-server"
ID = "otel-e2e"
ADDED = {"job", "instance"}  # from the resource, not the Prometheus path's labels


def _requests(app: Any) -> None:
    async def main() -> None:
        async with client(app) as c:
            for path in REQUESTS:
                await c.get(path)
            await c.get("/hello", headers={"traceparent": SAMPLED})

    asyncio.run(main())


def _stored(vault: Vault) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The last value of every stored series of the service, by (name, labels but job,
    instance and le); buckets are summed over le (their count must match too)."""
    frame = vault.query(f'{{job="{SERVICE}"}}', "-1h", "+1h")
    frame = frame.sort_values("timestamp", kind="stable")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    label_columns = [c for c in frame.columns if c not in ("timestamp", "metric", "value")]
    last = frame.groupby(["metric", *label_columns], dropna=False, sort=False).tail(1)
    for row in last.to_dict("records"):
        labels = {
            k: str(row[k])
            for k in label_columns
            if k not in ADDED | {"le"} and isinstance(row[k], str)
        }
        key = (str(row["metric"]), tuple(sorted(labels.items())))
        out[key] = out.get(key, 0.0) + float(row["value"])
    return out


class Sent(OTLPMetricExporter):
    """The OTLP/HTTP exporter, keeping the protobuf requests it sent (what the gateway got)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.sent: list[Any] = []

    def export(self, metrics_data: Any, timeout_millis: float | None = None, **kw: Any) -> Any:
        result = super().export(metrics_data, timeout_millis, **kw)
        if result is MetricExportResult.SUCCESS:
            self.sent.append(encode_metrics(metrics_data))
        return result


def _exemplar_trace_ids(requests: list[Any], name: str) -> set[str]:
    return {
        e.trace_id.hex()
        for request in requests
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.histogram.data_points
        for e in p.exemplars
    }


def test_otlp_export_to_the_gateway_stores_the_prometheus_paths_series(
    gateway: Any, tmp_path: Path
) -> None:
    gw = gateway()
    exporter = Sent(endpoint=f"{gw.url}/v1/metrics", timeout=10)
    memory = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[memory, PeriodicExportingMetricReader(exporter, 3_600_000)],
        resource=Resource.create({"service.name": SERVICE}),
    )
    try:
        _requests(MetricsMiddleware(make_app(), meter_provider=provider))
        # the system clocks: the end is stamped after close()'s export, by the same clock
        with track(ID, data=gw.url, git=False, meter_provider=provider) as run:
            run.log(1, loss=4.0, tokens=1000)
            run.flush()  # the counter starts here
            for step in range(2, 4):
                run.log(step, loss=4.0 / step, tokens=1000)
        # close() flushed the provider: everything went out before the end was set
        seen = metrics_of(memory)
    finally:
        provider.shutdown()
    gw.stop_gracefully()
    # the request with a sampled traceparent: its trace id went out as an exemplar
    assert _exemplar_trace_ids(exporter.sent, "http_request_duration") == {TRACE}

    registry = CollectorRegistry()
    _requests(MetricsMiddleware(make_app(), registry))  # the Prometheus path, same requests
    with Vault.open_local(str(gw.data_dir)) as vault:
        stored = _stored(vault)
        experiment = vault.experiments.get(ID)
        tokens = vault.query(f'train_tokens_total{{experiment="{ID}"}}', "-1h", "+1h")
        series = vault.query(f'{{experiment="{ID}"}}', "-1h", "+1h")
    http = {k: v for k, v in stored.items() if k[0].startswith("http_")}
    assert set(http) == prometheus_series(registry)
    assert experiment.end_ms is not None
    assert tokens["value"].tolist()[-1] == 3000.0
    # close() flushed before it set the end (the provider's shutdown exports them once more)
    end = pd.Timestamp(experiment.end_ms, unit="ms", tz="UTC")
    series = series.sort_values("timestamp", kind="stable")
    before_end = series[series["timestamp"] <= end].groupby("metric")["value"].last()
    assert before_end.to_dict() == {
        "train_step": 3.0,
        "train_loss": 4.0 / 3,
        "train_tokens_total": 3000.0,
        "tokens_per_second": pytest.approx(before_end["tokens_per_second"]),
    }

    # every value equals what the SDK exported (the in-memory reader's view)
    for metric in seen.values():
        for point in metric.data.data_points:
            labels = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
            if isinstance(point, HistogramDataPoint):
                base = prometheus_name(metric.name, metric.unit or "", "histogram")
                assert stored[(f"{base}_count", labels)] == point.count
                assert math.isclose(stored[(f"{base}_sum", labels)], point.sum)
                counts = list(point.bucket_counts)
                cumulative = sum(sum(counts[: i + 1]) for i in range(len(counts)))
                assert stored[(f"{base}_bucket", labels)] == cumulative  # summed over le
            else:
                assert isinstance(point, NumberDataPoint)
                kind = "counter" if getattr(metric.data, "is_monotonic", False) else "gauge"
                name = prometheus_name(metric.name, metric.unit or "", kind)
                assert stored[(name, labels)] == point.value, name
