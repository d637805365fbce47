"""ASGI middleware recording an inference server's latency, time to first byte, QPS and errors.

    app = Starlette(routes=[...])
    app.add_middleware(MetricsMiddleware)            # or: app = MetricsMiddleware(app)
    app.mount("/metrics", metrics_app())             # Prometheus scrapes it

Series, by ``method``, ``route`` (the route's path template) and ``status``:

- ``http_request_duration_seconds`` (histogram): until the response's last byte is sent;
  observations carry the W3C ``traceparent`` trace id as an exemplar (OpenMetrics scrapes).
- ``http_time_to_first_byte_seconds`` (histogram): until the first body bytes are sent — for a
  streaming LLM response, the time to its first token(s).
- ``http_requests_total`` (counter): QPS is ``rate(http_requests_total[1m])``.
- ``http_request_errors_total`` (counter): 5xx responses and exceptions.
- ``http_requests_in_flight`` (gauge, by ``method`` only: the route is known after routing).

Through OpenTelemetry instead: ``MetricsMiddleware(app, otel=True)`` (the global meter provider),
``meter_provider=`` or ``meter=``: the same series after Prometheus's OTLP translation
(``metricvault.collect.otel``; needs ``pip install 'metricvault[otel]'``), latencies recorded in
the request's span context so the SDK attaches its trace id as an exemplar.

Label values stay bounded: routes are Starlette's path templates (``/v1/models/{name}``, not
the concrete path); requests no route matched (404s) are ``other``; apps without Starlette
routing get their raw path for the first ``max_paths`` distinct paths, ``other`` after that;
unknown HTTP methods are ``other``. A route under a ``Mount`` with path parameters shows the
mount's concrete prefix.
"""

from __future__ import annotations

import re
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, NamedTuple, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from starlette.routing import Mount

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OTHER = "other"
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}
)
# Prometheus' default buckets stop at 10 s; LLM completions stream for minutes.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# W3C Trace Context: version-traceid-parentid-flags; version ff and an all-zero id are invalid.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_NO_TRACE = "0" * 32
_NO_SPAN = "0" * 16
CLIENT_CLOSED = "499"  # nginx's code for a request the client abandoned before a response


class TraceParent(NamedTuple):
    """A valid W3C ``traceparent``: the trace id, the parent (span) id, the flags (bit 0:
    sampled)."""

    trace_id: str
    span_id: str
    flags: int


class HttpRecorder(Protocol):
    """Where the middleware records: prometheus-client (:class:`HttpMetrics`) or an
    OpenTelemetry meter (``metricvault.collect.otel.OtelHttpMetrics``)."""

    def request_started(self, method: str) -> None: ...

    def request_ended(self, method: str) -> None: ...

    def observe(
        self,
        labels: Mapping[str, str],
        elapsed_s: float,
        first_byte_s: float | None,
        error: bool,
        parent: TraceParent | None,
    ) -> None: ...


class HttpMetrics:
    """The metric families of one registry (shared by every middleware using it, so a second
    app or a rebuilt middleware stack does not register duplicates)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("method", "route", "status")
        self.duration = Histogram(
            "http_request_duration_seconds",
            "HTTP request latency until the response's last byte",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttfb = Histogram(
            "http_time_to_first_byte_seconds",
            "Time until the first response body bytes (first tokens of a streamed answer)",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "http_requests_total", "HTTP requests answered", labels, registry=registry
        )
        self.errors = Counter(
            "http_request_errors_total",
            "HTTP requests that failed: 5xx responses or exceptions",
            labels,
            registry=registry,
        )
        self.in_flight = Gauge(
            "http_requests_in_flight", "HTTP requests being served", ("method",), registry=registry
        )

    def request_started(self, method: str) -> None:
        self.in_flight.labels(method).inc()

    def request_ended(self, method: str) -> None:
        self.in_flight.labels(method).dec()

    def observe(
        self,
        labels: Mapping[str, str],
        elapsed_s: float,
        first_byte_s: float | None,
        error: bool,
        parent: TraceParent | None,
    ) -> None:
        exemplar = {"trace_id": parent.trace_id} if parent else None
        self.duration.labels(**labels).observe(elapsed_s, exemplar)
        if first_byte_s is not None:
            self.ttfb.labels(**labels).observe(first_byte_s)
        self.requests.labels(**labels).inc()
        if error:
            self.errors.labels(**labels).inc()


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, HttpMetrics] = (
    weakref.WeakKeyDictionary()
)


def http_metrics(registry: CollectorRegistry | None = None) -> HttpMetrics:
    """The HTTP metric families in ``registry`` (default: prometheus-client's global one)."""
    registry = REGISTRY if registry is None else registry
    if registry not in _BY_REGISTRY:
        _BY_REGISTRY[registry] = HttpMetrics(registry)
    return _BY_REGISTRY[registry]


def traceparent(scope: Scope) -> TraceParent | None:
    """The request's W3C ``traceparent`` header when valid (version ff and all-zero ids are
    not), else None."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"traceparent":
            match = _TRACEPARENT.match(value.decode("latin-1").strip().lower())
            if match and match[1] != "ff" and match[2] != _NO_TRACE and match[3] != _NO_SPAN:
                return TraceParent(match[2], match[3], int(match[4], 16))
            return None
    return None


def trace_id(scope: Scope) -> str | None:
    """The trace id of a valid W3C ``traceparent`` request header, else None."""
    parent = traceparent(scope)
    return parent.trace_id if parent else None


def route_template(scope: Scope, root_path_before: str) -> str | None:
    """The path template of the route Starlette matched (None when none did).

    Starlette's router leaves the innermost matched route in ``scope["route"]``; a ``Mount``
    adds the prefix it matched to ``root_path``, which is how routes under mounts get theirs.
    """
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return None
    prefix = str(scope.get("root_path", ""))[len(root_path_before) :]
    if isinstance(route, Mount):  # a mounted app (not a router): its prefix is the route
        return prefix or path or "/"
    return prefix + path


class _Exchange:
    """One request's timing: wraps ``send`` to see the status and the first body bytes."""

    def __init__(self, send: Send) -> None:
        self.start = time.perf_counter()
        self.status: int | None = None
        self.first_byte_s: float | None = None
        self._send = send

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
        elif kind == "http.response.body" and self.first_byte_s is None:
            if message.get("body") or not message.get("more_body", False):
                self.first_byte_s = time.perf_counter() - self.start
        elif kind == "http.response.pathsend" and self.first_byte_s is None:
            self.first_byte_s = time.perf_counter() - self.start
        await self._send(message)


class MetricsMiddleware:
    """Records latency, time to first byte, request and error counts of any ASGI app.

    ``registry``: where the metrics live (default: prometheus-client's global registry);
    ``otel=True``, ``meter_provider=`` or ``meter=``: record through OpenTelemetry instead (the
    global meter provider, that provider, or that meter; see ``metricvault.collect.otel``);
    ``route_label``: label requests by route (False: every route is ``*``, for apps whose
    routes are not worth telling apart); ``max_paths``: distinct raw paths kept as labels for
    apps without Starlette routing."""

    def __init__(
        self,
        app: ASGIApp,
        registry: CollectorRegistry | None = None,
        *,
        otel: bool = False,
        meter_provider: Any = None,
        meter: Any = None,
        route_label: bool = True,
        max_paths: int = 100,
    ) -> None:
        self.app = app
        self.metrics = recorder(registry, otel=otel, meter_provider=meter_provider, meter=meter)
        self.route_label = route_label
        self.max_paths = max_paths
        self._raw_paths: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # websockets and lifespan pass through untouched
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method"))
        method = method if method in METHODS else OTHER
        root_path = str(scope.get("root_path", ""))
        exchange = _Exchange(send)
        failed = False
        self.metrics.request_started(method)
        try:
            await self.app(scope, receive, exchange.send)
        except Exception:
            failed = True
            raise
        finally:
            self.metrics.request_ended(method)
            self._record(scope, root_path, method, exchange, failed)

    def _record(
        self, scope: Scope, root_path: str, method: str, exchange: _Exchange, failed: bool
    ) -> None:
        elapsed = time.perf_counter() - exchange.start
        status = _status(exchange.status, failed)
        labels = {"method": method, "route": self._route(scope, root_path, status)}
        labels["status"] = status
        error = failed or status.startswith("5")
        parent = traceparent(scope)
        self.metrics.observe(labels, elapsed, exchange.first_byte_s, error, parent)

    def _route(self, scope: Scope, root_path: str, status: str) -> str:
        if not self.route_label:
            return "*"
        template = route_template(scope, root_path)
        if template is not None:
            return template
        path = str(scope.get("path", ""))
        if status == "404" or not self._keep_raw_path(path):
            return OTHER
        return path

    def _keep_raw_path(self, path: str) -> bool:
        if path in self._raw_paths:
            return True
        if len(self._raw_paths) >= self.max_paths:
            return False
        self._raw_paths.add(path)
        return True


def recorder(
    registry: CollectorRegistry | None = None,
    *,
    otel: bool = False,
    meter_provider: Any = None,
    meter: Any = None,
) -> HttpRecorder:
    """prometheus-client's families in ``registry``, or, when OpenTelemetry is asked for, the
    instruments of ``meter`` / ``meter_provider``'s / the global provider's meter."""
    if not (otel or meter_provider is not None or meter is not None):
        return http_metrics(registry)
    if registry is not None:
        raise ValueError(
            "MetricsMiddleware: registry= is prometheus-client's; with OpenTelemetry "
            "(otel=, meter_provider=, meter=) the exporter decides where metrics go"
        )
    from metricvault.collect.otel import http_metrics as otel_metrics  # the extra, only here
    from metricvault.collect.otel import resolve_meter

    return otel_metrics(resolve_meter(__name__, meter_provider, meter), LATENCY_BUCKETS)


def _status(sent: int | None, failed: bool) -> str:
    """The status the client got; 500 for an exception before any response (what servers
    answer then), 499 for a request abandoned (cancelled) before one."""
    if sent is not None:
        return str(sent)
    return "500" if failed else CLIENT_CLOSED


def metrics_app(registry: CollectorRegistry | None = None) -> ASGIApp:
    """An ASGI app serving ``registry`` (text format, or OpenMetrics with exemplars when the
    scraper asks for it)."""
    app: ASGIApp = make_asgi_app(REGISTRY if registry is None else registry)
    return app
