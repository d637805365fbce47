"""Recording through the OpenTelemetry metrics API instead of prometheus-client or the vault.

Imported only when a user asks for it (``MetricsMiddleware(app, otel=True)``,
``track(..., meter_provider=...)``): ``opentelemetry-api`` is the optional extra ``otel``
(``pip install 'metricvault[otel]'``, which brings the SDK and the OTLP/HTTP exporter too).

The instruments are named so that Prometheus's OTLP translation (what ``metricvault serve``'s
``POST /v1/metrics`` applies) gives back exactly the series names of the Prometheus path: the
unit ``s`` adds ``_seconds``, a monotonic sum (a Counter) gets ``_total``, a histogram is
stored as ``_bucket{le}``, ``_sum`` and ``_count``, a non-monotonic sum (an UpDownCounter)
and a gauge keep their name; units in braces (``{request}``) are annotations and add nothing.
``HTTP_INSTRUMENTS`` and :func:`instrument_for` are that mapping; docs/agent.md shows it.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from metricvault.errors import MissingDependencyError

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
except ImportError as exc:  # the extra is optional: say which one to install
    raise MissingDependencyError(
        "recording through OpenTelemetry needs the opentelemetry packages, which are not "
        "installed: pip install 'metricvault[otel]'"
    ) from exc

INSTALL = "pip install 'metricvault[otel]'"
# OpenTelemetry's instrument-name syntax (API spec): other names get a no-op instrument.
_INSTRUMENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-/]{0,254}$")


class Instrument(NamedTuple):
    """One OpenTelemetry instrument and the series Prometheus's OTLP translation makes of it."""

    name: str
    kind: str  # "histogram", "counter", "updowncounter" or "gauge"
    unit: str
    prometheus: str  # the base name in the vault (a histogram adds _bucket/_sum/_count)


HTTP_DURATION = Instrument(
    "http_request_duration", "histogram", "s", "http_request_duration_seconds"
)
HTTP_TTFB = Instrument(
    "http_time_to_first_byte", "histogram", "s", "http_time_to_first_byte_seconds"
)
HTTP_REQUESTS = Instrument("http_requests", "counter", "{request}", "http_requests_total")
HTTP_ERRORS = Instrument("http_request_errors", "counter", "{request}", "http_request_errors_total")
HTTP_IN_FLIGHT = Instrument(
    "http_requests_in_flight", "updowncounter", "{request}", "http_requests_in_flight"
)
HTTP_INSTRUMENTS = (HTTP_DURATION, HTTP_TTFB, HTTP_REQUESTS, HTTP_ERRORS, HTTP_IN_FLIGHT)


def resolve_meter(scope: str, meter_provider: Any = None, meter: Any = None) -> metrics.Meter:
    """``meter``, else a meter of ``meter_provider``, else of the global provider
    (``opentelemetry.metrics.get_meter_provider()``, a proxy until the app sets one)."""
    if meter is not None and meter_provider is not None:
        raise ValueError("pass meter= or meter_provider=, not both")
    if meter is not None:
        if not isinstance(meter, metrics.Meter):
            raise TypeError(f"meter= must be an opentelemetry.metrics.Meter, not {meter!r}")
        return meter
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    if not isinstance(provider, metrics.MeterProvider):
        raise TypeError(
            f"meter_provider= must be an opentelemetry.metrics.MeterProvider, not {provider!r}"
        )
    from metricvault import __version__

    return provider.get_meter(scope, __version__)


def trace_context(parent: tuple[str, str, int] | None) -> Context | None:
    """The context a latency is recorded in, for the SDK's exemplars: an active span (the app
    traces with OpenTelemetry) wins, else the request's ``traceparent`` (trace id, parent id,
    flags) as a remote span, else None (the current context).

    The SDK's default exemplar filter, ``trace_based``, keeps only measurements in a *sampled*
    span: a ``traceparent`` whose flags say not sampled (``-00``) gives no exemplar unless
    ``OTEL_METRICS_EXEMPLAR_FILTER=always_on``."""
    if parent is None or trace.get_current_span().get_span_context().is_valid:
        return None
    trace_id, span_id, flags = parent
    remote = trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(flags),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))


class OtelHttpMetrics:
    """The middleware's recorder on an OpenTelemetry meter (one per meter, see
    :func:`http_metrics`): the same series, labels and buckets as ``inference.HttpMetrics``."""

    def __init__(self, meter: metrics.Meter, buckets: Sequence[float]) -> None:
        self.duration = meter.create_histogram(
            HTTP_DURATION.name,
            unit=HTTP_DURATION.unit,
            description="HTTP request latency until the response's last byte",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.ttfb = meter.create_histogram(
            HTTP_TTFB.name,
            unit=HTTP_TTFB.unit,
            description="Time until the first response body bytes (first tokens of a stream)",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.requests = meter.create_counter(
            HTTP_REQUESTS.name, unit=HTTP_REQUESTS.unit, description="HTTP requests answered"
        )
        self.errors = meter.create_counter(
            HTTP_ERRORS.name,
            unit=HTTP_ERRORS.unit,
            description="HTTP requests that failed: 5xx responses or exceptions",
        )
        self.in_flight = meter.create_up_down_counter(
            HTTP_IN_FLIGHT.name, unit=HTTP_IN_FLIGHT.unit, description="HTTP requests being served"
        )

    def request_started(self, method: str) -> None:
        self.in_flight.add(1, {"method": method})

    def request_ended(self, method: str) -> None:
        self.in_flight.add(-1, {"method": method})

    def observe(
        self,
        labels: Mapping[str, str],
        elapsed_s: float,
        first_byte_s: float | None,
        error: bool,
        parent: tuple[str, str, int] | None,
    ) -> None:
        attributes = dict(labels)
        context = trace_context(parent)
        self.duration.record(elapsed_s, attributes, context=context)
        if first_byte_s is not None:
            self.ttfb.record(first_byte_s, attributes, context=context)
        self.requests.add(1, attributes)
        if error:
            self.errors.add(1, attributes)


_BY_METER: weakref.WeakKeyDictionary[metrics.Meter, OtelHttpMetrics] = weakref.WeakKeyDictionary()


def http_metrics(meter: metrics.Meter, buckets: Sequence[float]) -> OtelHttpMetrics:
    """The instruments of ``meter`` (made once: a second middleware on the same meter shares
    them; the SDK would warn about a duplicate instrument otherwise)."""
    if meter not in _BY_METER:
        _BY_METER[meter] = OtelHttpMetrics(meter, buckets)
    return _BY_METER[meter]


# ---------------------------------------------------------------------------- samples (track)
def instrument_for(series: str, kind: str) -> Instrument:
    """The instrument a vault series is recorded with: a counter ``x_total`` is the Counter
    ``x`` (Prometheus appends ``_total`` again), anything else a Gauge of its own name with no
    unit (a unit would add a suffix: ``1`` adds ``_ratio``)."""
    if kind == "counter" and series.endswith("_total"):
        return Instrument(series.removesuffix("_total"), "counter", "", series)
    return Instrument(series, "gauge", "", series)


def name_problem(series: str) -> str | None:
    """Why ``series`` would not reach the vault under that name through OTLP, or None.

    OpenTelemetry refuses instrument names outside ``[A-Za-z][A-Za-z0-9_.-/]*`` (a ``:``),
    and Prometheus's translation joins the name's parts with one ``_`` (``a__b`` -> ``a_b``)."""
    if not _INSTRUMENT_NAME.match(series):
        return f"{series!r} is not a valid OpenTelemetry instrument name"
    if "__" in series or series.endswith("_"):
        return f"{series!r} would be stored as {'_'.join(filter(None, series.split('_')))!r}"
    return None


class OtelSamples:
    """``track``'s recorder on an OpenTelemetry meter: each sample sets its Gauge, a counter's
    cumulative value adds its increase to a Counter. The SDK aggregates between exports, so the
    vault gets each series' last value per export interval, stamped at the export."""

    def __init__(self, meter: metrics.Meter, provider: Callable[[], Any] | None = None) -> None:
        self._meter = meter
        self._provider = provider  # whose force_flush() runs at close, when known
        self._gauges: dict[str, metrics._Gauge] = {}
        self._counters: dict[str, metrics.Counter] = {}
        self._cumulative: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def check(self, series: str) -> None:
        problem = name_problem(series)
        if problem is not None:
            raise ValueError(f"run.log: through OpenTelemetry, {problem}; rename it")

    def write(
        self, samples: Iterable[tuple[str, Mapping[str, str], int, float]], kinds: Mapping[str, str]
    ) -> None:
        for series, labels, _ts, value in samples:  # finite: Run skips NaN/Inf
            if kinds.get(series) == "counter":
                self._add(series, labels, value)
            else:
                self._gauge(series).set(value, dict(labels))

    def _add(self, series: str, labels: Mapping[str, str], cumulative: float) -> None:
        key = (series, tuple(sorted(labels.items())))
        increase = cumulative - self._cumulative.get(key, 0.0)
        self._cumulative[key] = cumulative
        if increase > 0:
            self._counter(series).add(increase, dict(labels))

    def _gauge(self, series: str) -> metrics._Gauge:
        if series not in self._gauges:
            inst = instrument_for(series, "gauge")
            self._gauges[series] = self._meter.create_gauge(inst.name, unit=inst.unit)
        return self._gauges[series]

    def _counter(self, series: str) -> metrics.Counter:
        if series not in self._counters:
            inst = instrument_for(series, "counter")
            self._counters[series] = self._meter.create_counter(inst.name, unit=inst.unit)
        return self._counters[series]

    def flush(self, timeout_s: float = 10.0) -> None:
        """Export now (the provider's ``force_flush``), so the last values are in the vault
        before the experiment's end is set; a bare ``meter=`` cannot be flushed."""
        provider = self._provider() if self._provider else None
        force_flush = getattr(provider, "force_flush", None)  # the SDK's; the API has none
        if callable(force_flush):
            force_flush(timeout_millis=int(timeout_s * 1000))


def samples_recorder(scope: str, meter_provider: Any = None, meter: Any = None) -> OtelSamples:
    """``track``'s recorder: flushes ``meter_provider`` (or the global provider as it is at
    close, when neither is given) at close; a bare ``meter=`` is never flushed."""
    found = resolve_meter(scope, meter_provider, meter)
    if meter is not None:
        return OtelSamples(found)
    if meter_provider is not None:
        return OtelSamples(found, lambda: meter_provider)
    return OtelSamples(found, metrics.get_meter_provider)
