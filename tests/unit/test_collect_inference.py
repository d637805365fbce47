"""MetricsMiddleware: latency, time to first byte, routes, status, errors, in-flight, exemplars."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from metricvault.collect.inference import MetricsMiddleware, metrics_app, trace_id

CHUNK_GAP_S = 0.15
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


async def hello(request: Request) -> Response:
    return PlainTextResponse("hi")


async def item(request: Request) -> Response:
    return JSONResponse({"id": request.path_params["item_id"]})


async def model(request: Request) -> Response:
    return JSONResponse({"model": request.path_params["name"]})


async def stream(request: Request) -> Response:
    async def tokens() -> AsyncIterator[bytes]:
        yield b"first "
        for word in (b"second ", b"third"):
            await asyncio.sleep(CHUNK_GAP_S)
            yield word

    return StreamingResponse(tokens(), media_type="text/plain")


async def boom(request: Request) -> Response:
    raise RuntimeError("boom")


async def unavailable(request: Request) -> Response:
    return PlainTextResponse("overloaded", status_code=503)


def make_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/hello", hello),
            Route("/items/{item_id}", item),
            Route("/stream", stream),
            Route("/boom", boom),
            Route("/unavailable", unavailable),
            Mount("/v1", routes=[Route("/models/{name}", model)]),
        ]
    )


def client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def openmetrics(registry: CollectorRegistry) -> str:
    text: bytes = exposition.generate_latest(registry)
    return text.decode()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def _get(app: Any, *paths: str, headers: dict[str, str] | None = None) -> list[int]:
    async with client(app) as c:
        return [(await c.get(p, headers=headers)).status_code for p in paths]


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main())


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_routes_statuses_and_counts(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    paths = ("/hello", "/items/1", "/items/2", "/v1/models/llama", "/nope", "/nope/deeper")
    assert run(_get(app, *paths)) == [200, 200, 200, 200, 404, 404]
    get = {"method": "GET"}
    assert value(registry, "http_requests_total", **get, route="/hello", status="200") == 1
    assert (
        value(registry, "http_requests_total", **get, route="/items/{item_id}", status="200") == 2
    )
    mounted = {"route": "/v1/models/{name}", "status": "200"}
    assert value(registry, "http_requests_total", **get, **mounted) == 1
    assert value(registry, "http_requests_total", **get, route="other", status="404") == 2
    assert value(registry, "http_request_duration_seconds_count", **get, **mounted) == 1
    assert value(registry, "http_request_duration_seconds_sum", **get, **mounted) > 0
    assert value(registry, "http_requests_in_flight", method="GET") == 0
    assert value(registry, "http_request_errors_total", **get, route="/hello", status="200") == 0


def test_time_to_first_byte_is_before_the_end_of_a_stream(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    assert run(_get(app, "/stream")) == [200]
    labels = {"method": "GET", "route": "/stream", "status": "200"}
    ttfb = value(registry, "http_time_to_first_byte_seconds_sum", **labels)
    total = value(registry, "http_request_duration_seconds_sum", **labels)
    assert value(registry, "http_time_to_first_byte_seconds_count", **labels) == 1
    assert 0 < ttfb < CHUNK_GAP_S
    assert total >= 2 * CHUNK_GAP_S
    assert ttfb < total


def test_in_flight_while_streaming_then_zero(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)

    async def scenario() -> list[float]:
        seen = []
        async with client(app) as c:
            request = asyncio.create_task(c.get("/stream"))
            await asyncio.sleep(CHUNK_GAP_S / 2)  # the stream is waiting between chunks
            seen.append(value(registry, "http_requests_in_flight", method="GET"))
            await request
        seen.append(value(registry, "http_requests_in_flight", method="GET"))
        return seen

    assert run(scenario()) == [1.0, 0.0]


def test_errors_exceptions_and_5xx(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    assert run(_get(app, "/boom", "/unavailable", "/hello")) == [500, 503, 200]
    errors = "http_request_errors_total"
    assert value(registry, errors, method="GET", route="/boom", status="500") == 1
    assert value(registry, errors, method="GET", route="/unavailable", status="503") == 1
    assert value(registry, errors, method="GET", route="/hello", status="200") == 0
    assert value(registry, "http_requests_total", method="GET", route="/boom", status="500") == 1
    assert value(registry, "http_requests_in_flight", method="GET") == 0


def test_exception_before_any_response_counts_as_500(registry: CollectorRegistry) -> None:
    inner = make_app()
    inner.add_middleware(MetricsMiddleware, registry=registry)  # inside Starlette's 500 handler
    assert run(_get(inner, "/boom")) == [500]
    assert value(registry, "http_request_errors_total", method="GET", route="/boom", status="500")
    assert value(registry, "http_requests_in_flight", method="GET") == 0


def test_trace_id_becomes_an_exemplar(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    run(_get(app, "/hello", headers={"traceparent": TRACEPARENT}))
    text = openmetrics(registry)
    line = next(ln for ln in text.splitlines() if f'trace_id="{TRACE}"' in ln)
    assert line.startswith("http_request_duration_seconds_bucket{")
    assert 'route="/hello"' in line


def test_no_exemplar_without_a_valid_traceparent(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    run(_get(app, "/hello", headers={"traceparent": f"ff-{TRACE}-00f067aa0ba902b7-01"}))
    run(_get(app, "/hello"))
    assert "trace_id" not in openmetrics(registry)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (TRACEPARENT, TRACE),
        (TRACEPARENT.upper(), TRACE),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),  # all-zero trace id
        (f"00-{TRACE}-{'0' * 16}-01", None),  # all-zero parent id (W3C: ignore the header)
        ("00-xyz-00f067aa0ba902b7-01", None),
        ("", None),
    ],
)
def test_trace_id_parsing(header: str, expected: str | None) -> None:
    assert trace_id({"headers": [(b"traceparent", header.encode())]}) == expected


def test_metrics_app_serves_openmetrics(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(make_app(), registry)
    run(_get(app, "/hello", headers={"traceparent": TRACEPARENT}))

    async def scrape() -> httpx.Response:
        async with client(metrics_app(registry)) as c:
            accept = "application/openmetrics-text; version=1.0.0"
            return await c.get("/", headers={"Accept": accept})

    response = run(scrape())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert f'trace_id="{TRACE}"' in response.text
    assert 'http_requests_total{method="GET",route="/hello",status="200"} 1.0' in response.text


def test_route_label_off_and_shared_registry(registry: CollectorRegistry) -> None:
    first = MetricsMiddleware(make_app(), registry, route_label=False)
    second = MetricsMiddleware(make_app(), registry)  # same families, no duplicate error
    run(_get(first, "/items/1", "/hello"))
    run(_get(second, "/hello"))
    assert value(registry, "http_requests_total", method="GET", route="*", status="200") == 2
    assert value(registry, "http_requests_total", method="GET", route="/hello", status="200") == 1


async def raw_app(scope: Any, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """An ASGI app without Starlette routing."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_raw_paths_are_bounded(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(raw_app, registry, max_paths=2)
    run(_get(app, "/a", "/b", "/c", "/a"))
    assert value(registry, "http_requests_total", method="GET", route="/a", status="200") == 2
    assert value(registry, "http_requests_total", method="GET", route="/b", status="200") == 1
    assert value(registry, "http_requests_total", method="GET", route="other", status="200") == 1


def test_unknown_method_and_non_http_scopes(registry: CollectorRegistry) -> None:
    app = MetricsMiddleware(raw_app, registry)

    async def scenario() -> None:
        async with client(app) as c:
            await c.request("BREW", "/pot")
        calls = []

        async def lifespan(scope: Any, receive: Any, send: Any) -> None:
            calls.append(scope["type"])

        await MetricsMiddleware(lifespan, registry)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
        assert calls == ["lifespan"]

    run(scenario())
    assert value(registry, "http_requests_total", method="other", route="/pot", status="200") == 1
