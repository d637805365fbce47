"""Issue 14 (OTel out): the inference middleware and ``track`` recording through the
OpenTelemetry metrics API, read back with the SDK's InMemoryMetricReader: names, units,
attributes, values, trace-id exemplars, and the names Prometheus's OTLP translation makes of
them, which must equal the Prometheus path's."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics._internal.exemplar import AlwaysOnExemplarFilter
from opentelemetry.sdk.metrics.export import (
    Histogram,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
    Sum,
)
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from metricvault.collect import otel, training
from metricvault.collect.inference import LATENCY_BUCKETS, MetricsMiddleware
from metricvault.collect.training import track
from metricvault.errors import MissingDependencyError, NotFoundError
from metricvault.store.vault import Vault
from tests.clocks import Clocks
from tests.otlp_names import prometheus_name
from tests.unit.test_collect_inference import CHUNK_GAP_S, TRACE, client, make_app

SPAN = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{SPAN}-01"
NOT_SAMPLED = f"00-{TRACE}-{SPAN}-00"
ID = "otel-run"
pytestmark = [
    pytest.mark.usefixtures("no_nvml"),
    pytest.mark.filterwarnings("ignore::metricvault.collect.training.SeriesNamesNotice"),
]
REQUESTS = ("/hello", "/items/1", "/items/2", "/stream", "/boom", "/unavailable", "/nope")


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    mp = MeterProvider(metric_readers=[reader])  # the default exemplar filter: trace_based
    yield mp
    mp.shutdown()


def metrics_of(reader: InMemoryMetricReader) -> dict[str, Metric]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def points(metric: Metric) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {tuple(sorted((p.attributes or {}).items())): p for p in metric.data.data_points}


def key(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def get(app: Any, *paths: str, headers: dict[str, str] | None = None) -> list[int]:
    async def main() -> list[int]:
        async with client(app) as c:
            return [(await c.get(p, headers=headers)).status_code for p in paths]

    return asyncio.run(main())


# ---------------------------------------------------------------------------- the middleware
def test_middleware_counts_and_latency_histograms(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    app = MetricsMiddleware(make_app(), meter_provider=provider)
    assert get(app, *REQUESTS) == [200, 200, 200, 200, 500, 503, 404]
    got = metrics_of(reader)
    assert {name: (m.unit, type(m.data).__name__) for name, m in got.items()} == {
        "http_request_duration": ("s", "Histogram"),
        "http_time_to_first_byte": ("s", "Histogram"),
        "http_requests": ("{request}", "Sum"),
        "http_request_errors": ("{request}", "Sum"),
        "http_requests_in_flight": ("{request}", "Sum"),
    }
    requests = got["http_requests"].data
    assert isinstance(requests, Sum) and requests.is_monotonic
    counts = {k: p.value for k, p in points(got["http_requests"]).items()}
    g = {"method": "GET"}
    assert counts == {
        key(**g, route="/hello", status="200"): 1,
        key(**g, route="/items/{item_id}", status="200"): 2,
        key(**g, route="/stream", status="200"): 1,
        key(**g, route="/boom", status="500"): 1,
        key(**g, route="/unavailable", status="503"): 1,
        key(**g, route="other", status="404"): 1,
    }
    errors = {k: p.value for k, p in points(got["http_request_errors"]).items()}
    assert errors == {
        key(**g, route="/boom", status="500"): 1,
        key(**g, route="/unavailable", status="503"): 1,
    }
    in_flight = got["http_requests_in_flight"].data
    assert isinstance(in_flight, Sum) and not in_flight.is_monotonic
    assert {k: p.value for k, p in points(got["http_requests_in_flight"]).items()} == {
        key(method="GET"): 0
    }
    duration = got["http_request_duration"]
    assert isinstance(duration.data, Histogram)
    streamed = points(duration)[key(**g, route="/stream", status="200")]
    first_byte = points(got["http_time_to_first_byte"])[key(**g, route="/stream", status="200")]
    assert tuple(streamed.explicit_bounds) == LATENCY_BUCKETS
    assert streamed.count == first_byte.count == 1
    assert streamed.sum >= 2 * CHUNK_GAP_S
    assert 0 < first_byte.sum < CHUNK_GAP_S
    assert points(duration)[key(**g, route="/items/{item_id}", status="200")].count == 2


def test_in_flight_while_streaming(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    app = MetricsMiddleware(make_app(), meter=provider.get_meter("test"))

    def in_flight() -> float:
        return float(points(metrics_of(reader)["http_requests_in_flight"])[key(method="GET")].value)

    async def scenario() -> list[float]:
        async with client(app) as c:
            request = asyncio.create_task(c.get("/stream"))
            await asyncio.sleep(CHUNK_GAP_S / 2)
            during = in_flight()
            await request
        return [during, in_flight()]

    assert asyncio.run(scenario()) == [1.0, 0.0]


def _exemplars(reader: InMemoryMetricReader, name: str = "http_request_duration") -> list[Any]:
    found = metrics_of(reader)
    return [e for p in found[name].data.data_points for e in p.exemplars]


def test_a_sampled_traceparent_becomes_an_exemplar(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    app = MetricsMiddleware(make_app(), meter_provider=provider)
    get(app, "/hello", headers={"traceparent": SAMPLED})
    get(app, "/items/1")  # no header: no trace
    found = metrics_of(reader)
    for name in ("http_request_duration", "http_time_to_first_byte"):
        by_route = {
            dict(p.attributes or {})["route"]: p.exemplars for p in found[name].data.data_points
        }
        assert [(e.trace_id, e.span_id) for e in by_route["/hello"]] == [
            (int(TRACE, 16), int(SPAN, 16))
        ]
        assert by_route["/items/{item_id}"] == []  # trace_based: no span, no exemplar


@pytest.mark.parametrize(
    ("header", "always_on", "expected"),
    [
        (NOT_SAMPLED, False, []),  # trace_based keeps sampled spans only
        (NOT_SAMPLED, True, [int(TRACE, 16)]),  # always_on keeps it, with the trace id
        (f"ff-{TRACE}-{SPAN}-01", True, [None]),  # version ff: invalid, no trace id
        (f"00-{TRACE}-{'0' * 16}-01", True, [None]),  # all-zero parent id: invalid
    ],
)
def test_exemplar_filters_and_invalid_traceparents(
    header: str, always_on: bool, expected: list[int | None]
) -> None:
    reader = InMemoryMetricReader()
    mp = MeterProvider(
        metric_readers=[reader], exemplar_filter=AlwaysOnExemplarFilter() if always_on else None
    )
    get(MetricsMiddleware(make_app(), meter_provider=mp), "/hello", headers={"traceparent": header})
    assert [e.trace_id for e in _exemplars(reader)] == expected
    mp.shutdown()


def test_an_active_span_wins_over_the_header(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    """An app that traces with OpenTelemetry: the exemplar is the server span's."""
    tracer = TracerProvider().get_tracer("test")
    app = MetricsMiddleware(make_app(), meter_provider=provider)
    with tracer.start_as_current_span("server") as span:
        get(app, "/hello", headers={"traceparent": SAMPLED})
    context = span.get_span_context()
    assert context.trace_id != int(TRACE, 16)
    assert [(e.trace_id, e.span_id) for e in _exemplars(reader)] == [
        (context.trace_id, context.span_id)
    ]
    assert not trace.get_current_span().get_span_context().is_valid


def test_middlewares_on_one_meter_share_instruments(
    provider: MeterProvider, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    meter = provider.get_meter("shared")
    first = MetricsMiddleware(make_app(), meter=meter, route_label=False)
    second = MetricsMiddleware(make_app(), meter=meter)
    get(first, "/hello")
    get(second, "/hello")
    counts = {k: p.value for k, p in points(metrics_of(reader)["http_requests"]).items()}
    assert counts == {
        key(method="GET", route="*", status="200"): 1,
        key(method="GET", route="/hello", status="200"): 1,
    }
    assert "has been created already" not in caplog.text


def test_bad_arguments_are_refused(provider: MeterProvider) -> None:
    with pytest.raises(ValueError, match="registry= is prometheus-client's"):
        MetricsMiddleware(make_app(), CollectorRegistry(), meter_provider=provider)
    with pytest.raises(ValueError, match="pass meter= or meter_provider=, not both"):
        MetricsMiddleware(make_app(), meter=provider.get_meter("x"), meter_provider=provider)
    with pytest.raises(TypeError, match="meter_provider= must be an opentelemetry"):
        MetricsMiddleware(make_app(), meter_provider="http://gateway:9201")


# ---------------------------------------------------------------------------- the names
@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        # otlptranslator's own examples
        ("http.server.request.duration", "s", "histogram", "http_server_request_duration_seconds"),
        ("requests.count", "1", "counter", "requests_count_total"),
        ("memory.usage", "By", "gauge", "memory_usage_bytes"),
        ("cpu.utilization", "1", "gauge", "cpu_utilization_ratio"),
        ("throughput", "{token}/s", "gauge", "throughput_per_second"),
        ("latency_seconds", "s", "histogram", "latency_seconds"),  # the suffix once
        ("hits_total", "", "counter", "hits_total"),
        # ours (metricvault.collect.otel.HTTP_INSTRUMENTS and track's instruments)
        *((i.name, i.unit, i.kind, i.prometheus) for i in otel.HTTP_INSTRUMENTS),
        ("train_tokens", "", "counter", "train_tokens_total"),
        ("mfu", "", "gauge", "mfu"),
        ("tokens_per_second", "", "gauge", "tokens_per_second"),
    ],
)
def test_prometheus_translation_table(name: str, unit: str, kind: str, expected: str) -> None:
    assert prometheus_name(name, unit, kind) == expected


GATEWAY_KINDS = {"histogram": "histogram", "counter": "counter", "gauge": "gauge"}
GATEWAY_KINDS["updowncounter"] = "non_monotonic_sum"


@pytest.mark.parametrize(
    "instrument",
    [
        *otel.HTTP_INSTRUMENTS,
        *(otel.instrument_for(s, "gauge") for s in ("train_step", "mfu", "tokens_per_second")),
        otel.instrument_for("train_tokens_total", "counter"),
    ],
    ids=lambda i: i.name,
)
def test_the_gateways_translation_gives_the_documented_names(instrument: otel.Instrument) -> None:
    """The same table through the gateway's own translator (what /v1/metrics applies)."""
    from metricvault.ingest.protocols.otlp_names import metric_name

    kind = GATEWAY_KINDS[instrument.kind]
    assert metric_name(instrument.name, instrument.unit, kind) == instrument.prometheus


def translated(metrics: dict[str, Metric]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(series name, labels) of every series Prometheus's translation makes of ``metrics``."""
    out: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for metric in metrics.values():
        data = metric.data
        if isinstance(data, Histogram):
            base = prometheus_name(metric.name, metric.unit or "", "histogram")
            names: Sequence[str] = (f"{base}_bucket", f"{base}_sum", f"{base}_count")
        else:
            kind = "counter" if isinstance(data, Sum) and data.is_monotonic else "updowncounter"
            kind = kind if isinstance(data, Sum) else "gauge"
            names = (prometheus_name(metric.name, metric.unit or "", kind),)
        for point in data.data_points:
            labels = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
            out.update((n, labels) for n in names)
    return out


def prometheus_series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    out = set()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):  # prometheus-client's, no OTLP counterpart
                continue
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            out.add((sample.name, tuple(sorted(labels.items()))))
    return out


def test_translated_names_equal_the_prometheus_paths(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    registry = CollectorRegistry()
    prometheus_app = MetricsMiddleware(make_app(), registry)
    otel_app = MetricsMiddleware(make_app(), meter_provider=provider)
    for app in (prometheus_app, otel_app):
        get(app, *REQUESTS)
        get(app, "/hello", headers={"traceparent": SAMPLED})
    expected = prometheus_series(registry)
    hello = key(method="GET", route="/hello", status="200")
    assert ("http_request_duration_seconds_bucket", hello) in expected
    assert translated(metrics_of(reader)) == expected


def _log_a_run(run: training.Run, clocks: Clocks) -> None:
    clocks[0] += 1.0
    run.log(1, loss=2.5, lr=3e-4, grad_norm=1.25, tokens=100, accuracy=0.5, eval_loss=3.0)
    clocks[0] += 2.0
    run.log(2, loss=2.0, lr=3e-4, grad_norm=1.0, tokens=300, accuracy=0.625, eval_loss=2.5)


def test_track_records_through_a_meter(
    tmp_path: Path, provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    clocks = Clocks()
    with Vault.open_local(str(tmp_path / "v")) as vault:
        with track(
            ID, **clocks.kw, data=vault, git=False, labels={"rank": "0"}, meter_provider=provider
        ) as run:
            _log_a_run(run, clocks)
            run.flush()
            got = metrics_of(reader)
        assert vault.experiments.get(ID).end_ms is not None  # registered and ended in data
        assert vault.query(f'{{experiment="{ID}"}}', "-1d", "+1d").empty  # series went by OTel
    labels = {"experiment": ID, "host": run.labels["host"], "rank": "0"}
    values = {
        name: [
            (dict(p.attributes or {}), p.value)
            for p in m.data.data_points
            if isinstance(p, NumberDataPoint)
        ]
        for name, m in got.items()
    }
    assert values == {
        "train_step": [(labels, 2.0)],
        "train_loss": [(labels, 2.0)],
        "learning_rate": [(labels, 3e-4)],
        "grad_norm": [(labels, 1.0)],
        "train_tokens": [(labels, 400.0)],
        "tokens_per_second": [(labels, 150.0)],
        "train_accuracy": [(labels, 0.625)],
        "eval_loss": [(labels, 2.5)],
    }
    tokens = got["train_tokens"].data
    assert isinstance(tokens, Sum) and tokens.is_monotonic
    assert run.written == 15  # 8 + 7: the first log has no previous call, so no tokens/s


def test_track_names_after_translation_equal_the_vault_paths(
    tmp_path: Path, provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        clocks = Clocks()
        with track(ID, **clocks.kw, data=vault, git=False, meter_provider=provider) as run:
            _log_a_run(run, clocks)
        clocks = Clocks()
        with track("vault-run", **clocks.kw, data=vault, git=False) as run:
            _log_a_run(run, clocks)
        stored = set(vault.query('{experiment="vault-run"}', "-1d", "+1d")["metric"])
    assert {name for name, _ in translated(metrics_of(reader))} == stored


class Exported(MetricExporter):
    """An exporter that keeps what the SDK exports (a real export, no collect by the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kw: Any) -> Any:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
        pass


def test_close_flushes_the_provider_before_the_end(tmp_path: Path) -> None:
    exporter = Exported()
    hourly = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    mp = MeterProvider(metric_readers=[hourly])
    try:
        vault = Vault.open_local(str(tmp_path / "v"))
        with vault, track(ID, data=vault, git=False, meter_provider=mp) as run:
            run.log(7, loss=1.5)
            run.flush()
            assert exporter.batches == []  # the next export would be an hour away
        names = {
            m.name
            for batch in exporter.batches
            for rm in batch.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }
        assert names == {"train_step", "train_loss"}
    finally:
        mp.shutdown()


def test_names_otlp_would_change_are_refused(tmp_path: Path, provider: MeterProvider) -> None:
    vault = Vault.open_local(str(tmp_path / "v"))
    with vault, track(ID, data=vault, git=False, meter_provider=provider) as run:
        with pytest.raises(ValueError, match="'train_a__b' would be stored as 'train_a_b'"):
            run.log(1, a__b=1.0)
        with pytest.raises(ValueError, match="not a valid OpenTelemetry instrument name"):
            run.log(1, **{"train_a:b": 1.0})
        run.log(1, loss=1.0)  # the run goes on


# ---------------------------------------------------------------------------- the optional extra
def test_a_missing_extra_names_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry fails
    monkeypatch.delitem(sys.modules, "metricvault.collect.otel")
    hint = r"pip install 'metricvault\[otel\]'"
    with pytest.raises(MissingDependencyError, match=hint):
        MetricsMiddleware(make_app(), otel=True)
    with Vault.open_local(str(tmp_path / "v")) as vault:
        with pytest.raises(MissingDependencyError, match=hint):
            track(ID, data=vault, git=False, otel=True)
        with pytest.raises(NotFoundError):  # refused before the experiment was registered
            vault.experiments.get(ID)


def test_opentelemetry_is_imported_only_when_asked_for() -> None:
    """In a fresh interpreter: the Prometheus path imports no opentelemetry; ``otel=True``
    records through the global meter provider."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        import httpx
        from starlette.applications import Starlette
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route
        import metricvault
        from metricvault.collect.inference import MetricsMiddleware

        app = Starlette(routes=[Route("/hi", lambda request: PlainTextResponse("hi"))])

        async def call(asgi):
            transport = httpx.ASGITransport(app=asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return (await c.get("/hi")).status_code

        assert asyncio.run(call(MetricsMiddleware(app))) == 200
        metricvault.track  # the training API, loaded
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        assert not loaded, loaded

        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert asyncio.run(call(MetricsMiddleware(app, otel=True))) == 200
        data = reader.get_metrics_data()
        names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics}
        assert "http_requests" in names, names
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
