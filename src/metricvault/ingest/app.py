"""The ingest gateway (``metricvault serve``): an ASGI app over a :class:`Vault`.

Every write request is atomic: it is decoded completely (decoders are pure functions in
``protocols/``), validated, and then written to the durable ingest buffer in one transaction;
the 2xx is sent only after that. Any problem refuses the whole request and stores nothing.
Status codes follow the remote_write spec: 204 stored; 400 never retry; 401 credentials; 413
too large; 415 wrong encoding/content type; 429/503 with Retry-After: retry later.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs

import pyarrow as pa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from metricvault.config import Settings
from metricvault.credentials import Principal, authenticate
from metricvault.durations import parse_duration_ms
from metricvault.errors import (
    InputError,
    MetricVaultError,
    NotFoundError,
    RetryLater,
    TooLargeError,
)
from metricvault.experiment import Experiment, unknown_message
from metricvault.ingest.connections import quiet_accept_errors
from metricvault.ingest.experiments_api import (
    CREATE_FIELDS,
    UPDATE_FIELDS,
    checked_fields,
    confine,
    visible,
)
from metricvault.ingest.limits import NewSeriesLimiter
from metricvault.ingest.metrics import GatewayMetrics
from metricvault.ingest.otlp_api import OtlpAPI
from metricvault.ingest.prometheus_api import PrometheusAPI
from metricvault.ingest.protocols.influx_line import decode_line_protocol
from metricvault.ingest.protocols.remote_write import DecodedWrite, decode_remote_write
from metricvault.open import open as open_store
from metricvault.protocols import ServingStore
from metricvault.redact import redact_logs
from metricvault.redact import remember as remember_secrets
from metricvault.store.buffer import quarantined_batches
from metricvault.store.layout import MAINTAIN_LOCK, worker_buffer_name
from metricvault.wire.remote_write import SERVER_TIME_HEADER  # defined once: issue 12

log = logging.getLogger("metricvault.gateway")
PRECISIONS = {"ns", "n", "us", "u", "ms", "s", "m", "h"}


class Gateway:
    def __init__(
        self, vault: ServingStore, settings: Settings, metrics: GatewayMetrics | None = None
    ) -> None:
        self.vault = vault
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.limiter = NewSeriesLimiter(settings.max_new_series_per_minute)
        self.ready = False

    # ------------------------------------------------------------------ plumbing
    async def body(self, request: Request) -> bytes:
        """The request body, refused with 413 as soon as it passes max_body_bytes."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise TooLargeError(_too_large(int(declared), limit))
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLargeError(_too_large(size, limit))
            chunks.append(chunk)
        return b"".join(chunks)

    def decode_limits(self) -> dict[str, Any]:
        """The per-request limits both decoders enforce (issue 10), each a 413."""
        return {
            "max_series": self.settings.max_series_per_request,
            "max_label_names": self.settings.max_label_names_per_request,
            "time_budget_s": parse_duration_ms(self.settings.decode_time_budget) / 1000,
        }

    def store(self, table: pa.Table, kinds: dict[str, str], who: Principal, protocol: str) -> int:
        """Write one decoded request (blocking; run in a worker thread)."""
        if who.tenant:
            table = _with_tenant(table, self.settings.tenant_label, who.tenant)
        stored = self.vault.write(
            table, kinds, admit_new_series=lambda n: self.limiter.admit(who.tenant, n)
        )
        self.metrics.stored.labels(protocol).inc(stored)
        return stored

    async def store_decoded(self, decoded: DecodedWrite, who: Principal, protocol: str) -> int:
        """Store one decoded remote-write (or OTLP) request; the samples stored."""
        # staleness markers and NaN/±Inf samples are stored like any other (issue 13)
        self.metrics.received.labels(protocol).inc(decoded.samples)
        if decoded.kinds:  # metadata usually arrives in requests of its own
            self.vault.set_metric_kinds(decoded.kinds)
        if decoded.histograms:
            self.metrics.dropped.labels("histogram").inc(decoded.histograms)
        stored = 0
        if decoded.table.num_rows:
            stored = await run_in_threadpool(
                self.store, decoded.table, decoded.kinds, who, protocol
            )
            if stored < decoded.table.num_rows:  # InfluxDB holds no NaN, ±Inf or markers
                self.metrics.dropped.labels("non_finite").inc(decoded.table.num_rows - stored)
        return stored

    async def handle(
        self, request: Request, endpoint: str, work: Callable[[Request, Principal], Any]
    ) -> Response:
        started = time.perf_counter()
        try:
            who = authenticate(self.settings, request.headers.get("authorization"))
            return await work(request, who)  # type: ignore[no-any-return]
        except MetricVaultError as exc:
            return self.refuse(exc)
        except Exception:  # a bug must not take the gateway down or look like a client error
            log.exception("internal error on %s", endpoint)
            self.metrics.rejected.labels("internal").inc()
            return PlainTextResponse("internal error; the request was not stored\n", 500)
        finally:
            self.metrics.duration.labels(endpoint).observe(time.perf_counter() - started)

    def refuse(self, exc: MetricVaultError) -> Response:
        self.metrics.rejected.labels(type(exc).__name__).inc()
        headers = {}
        if isinstance(exc, RetryLater):  # rate limits, backpressure, a full disk
            headers["Retry-After"] = str(exc.retry_after_s)
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="metricvault", Basic realm="metricvault"'
        return PlainTextResponse(exc.message + "\n", exc.status, headers=headers)

    # ------------------------------------------------------------------ endpoints
    async def remote_write(self, request: Request) -> Response:
        async def work(req: Request, who: Principal) -> Response:
            body = await self.body(req)
            decoded = await run_in_threadpool(
                decode_remote_write,
                body,
                content_type=req.headers.get("content-type"),
                content_encoding=req.headers.get("content-encoding"),
                version_header=req.headers.get("x-prometheus-remote-write-version"),
                max_decoded_bytes=self.settings.max_body_bytes,
                **self.decode_limits(),
            )
            stored = await self.store_decoded(decoded, who, "remote_write")
            headers = {}
            if decoded.version == "2.0":
                headers = {
                    "X-Prometheus-Remote-Write-Samples-Written": str(stored),
                    "X-Prometheus-Remote-Write-Histograms-Written": "0",
                    "X-Prometheus-Remote-Write-Exemplars-Written": "0",
                }
            return Response(status_code=204, headers=headers)

        return await self.handle(request, "/api/v1/write", work)

    async def influx_write(self, request: Request) -> Response:
        async def work(req: Request, who: Principal) -> Response:
            precision = req.query_params.get("precision", "ns")
            if precision not in PRECISIONS:
                return PlainTextResponse(
                    f"precision={precision!r} is not one of {', '.join(sorted(PRECISIONS))}\n", 400
                )
            body = await self.body(req)
            decoded = await run_in_threadpool(
                decode_line_protocol,
                body,
                precision=precision,
                content_encoding=req.headers.get("content-encoding"),
                max_decoded_bytes=self.settings.max_body_bytes,
                **self.decode_limits(),
            )
            self.metrics.received.labels("influx").inc(decoded.samples)
            if decoded.table.num_rows:
                await run_in_threadpool(self.store, decoded.table, {}, who, "influx")
            if decoded.rejected:
                self.metrics.rejected.labels("string_field_line").inc(len(decoded.rejected))
                first = decoded.rejected[0]
                message = (
                    f"partial write: {len(decoded.rejected)} line(s) not stored, e.g. line "
                    f"{first.line}: {first.reason}; all other lines were stored\n"
                )
                return PlainTextResponse(message, 400)
            return Response(status_code=204)

        return await self.handle(request, request.url.path, work)

    async def experiments(self, request: Request) -> Response:
        """The experiment registry over HTTP, for training jobs that reach only the gateway:
        ``GET /api/v1/experiments[/{id}]``, ``POST /api/v1/experiments`` (a new record: id,
        selector and the optional fields), ``PATCH /api/v1/experiments/{id}`` (changed fields).
        Errors answer with the registry's own status and message."""

        async def work(req: Request, who: Principal) -> Response:
            registry, tenant = self.vault.experiments, who.tenant
            experiment_id = req.path_params.get("experiment_id")
            if req.method == "GET" and experiment_id is None:
                records = visible(await run_in_threadpool(registry.list), tenant)
                return JSONResponse([e.to_record() for e in records])
            if req.method == "POST":
                fields = checked_fields(await self.json_body(req), CREATE_FIELDS)
                new_id, selector = fields.pop("id", None), fields.pop("selector", None)
                if new_id is None or selector is None:
                    raise InputError("a new experiment needs 'id' and 'selector' (strings)")
                selector = confine(selector, self.settings.tenant_label, tenant)
                exp = await run_in_threadpool(
                    lambda: registry.create(new_id, selector, tenant=tenant, **fields)
                )
                return JSONResponse(exp.to_record(), status_code=201)
            # the body first: an oversized one is 413 whoever owns the id
            changes = {} if req.method == "GET" else await self.json_body(req)
            exp = await run_in_threadpool(self.owned_experiment, str(experiment_id), tenant)
            if req.method == "GET":
                return JSONResponse(exp.to_record())
            changes = checked_fields(changes, UPDATE_FIELDS)
            if "selector" in changes:
                changes["selector"] = confine(
                    changes["selector"], self.settings.tenant_label, tenant
                )
            exp = await run_in_threadpool(lambda: registry.update(exp.id, **changes))
            return JSONResponse(exp.to_record())

        return await self.handle(request, "/api/v1/experiments", work)

    async def json_body(self, request: Request) -> dict[str, Any]:
        try:
            fields = json.loads(await self.body(request) or b"{}")
        except json.JSONDecodeError as exc:
            raise InputError(f"the request body is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise InputError("the request body must be a JSON object of experiment fields")
        return fields

    def owned_experiment(self, experiment_id: str, tenant: str) -> Experiment:
        """The experiment if ``tenant`` owns it; another tenant's answers 404 exactly as an
        unknown id does, listing only the caller's ids (blocking)."""
        registry = self.vault.experiments
        try:
            exp = registry.get(experiment_id)
            if exp.tenant == tenant:
                return exp
        except NotFoundError:
            pass
        ids = [e.id for e in visible(registry.list(), tenant)]
        raise NotFoundError(unknown_message(experiment_id, ids, "this gateway"))

    async def influx_ping(self, request: Request) -> Response:
        """InfluxDB clients (the `influx` CLI, Telegraf) ping before writing."""
        return Response(status_code=204, headers={"X-Influxdb-Version": INFLUX_VERSION})

    async def influx_query(self, request: Request) -> Response:
        """Accept the DDL InfluxDB clients send before writing (CREATE DATABASE / RETENTION
        POLICY) as no-ops; metricvault has no databases. Anything else is refused clearly."""

        async def work(req: Request, who: Principal) -> Response:
            form = parse_qs((await self.body(req)).decode(errors="replace"))
            text = (req.query_params.get("q") or (form.get("q") or [""])[0]).strip()
            statements = [part.strip() for part in text.split(";") if part.strip()]
            if statements and all(_is_ddl(stmt) for stmt in statements):
                results = [{"statement_id": i} for i in range(len(statements))]
                return JSONResponse(
                    {"results": results}, headers={"X-Influxdb-Version": INFLUX_VERSION}
                )
            return JSONResponse(
                {
                    "error": "the metricvault gateway only accepts writes (and CREATE DATABASE/"
                    "RETENTION POLICY as no-ops); read data with 'metricvault query' or "
                    "Vault.query"
                },
                status_code=400,
            )

        return await self.handle(request, "/query", work)

    async def healthy(self, request: Request) -> Response:
        # The server's clock in ms: agents estimate their clock offset from it (round trip);
        # the Date header has only one-second resolution.
        headers = {SERVER_TIME_HEADER: str(time.time_ns() // 1_000_000)}
        return PlainTextResponse("metricvault gateway is healthy\n", headers=headers)

    async def ready_check(self, request: Request) -> Response:
        if not self.ready:
            return PlainTextResponse("starting\n", 503)
        return PlainTextResponse("metricvault gateway is ready\n")

    async def metrics_page(self, request: Request) -> Response:
        body, content_type = await run_in_threadpool(self.scrape)
        return Response(body, media_type=content_type)

    def scrape(self) -> tuple[bytes, str]:
        """Update this process's gauges and render every worker's metrics (blocking)."""
        self.update_gauges()
        return self.metrics.render()

    def update_gauges(self) -> None:
        samples, size = self.vault.buffered()
        self.metrics.buffer_samples.set(samples)
        self.metrics.buffer_bytes.set(size)
        self.metrics.series.set(self.vault.series_count())
        self.metrics.quarantined.set(quarantined_batches(self.vault.state_dir))

    # ------------------------------------------------------------------ background
    async def flusher(self) -> None:
        """Flush every flush_interval (the vault also flushes early on big buffers)."""
        interval = parse_duration_ms(self.settings.flush_interval) / 1000
        while True:
            await asyncio.sleep(interval)
            started = time.perf_counter()
            try:
                await run_in_threadpool(self.vault.flush)
                self.metrics.flush.observe(time.perf_counter() - started)
            except Exception:  # samples stay in the durable buffer; try again next round
                log.exception("flush failed; buffered samples are kept and retried")

    async def gauge_updater(self) -> None:
        """With several workers a scrape reads the gauges every worker last wrote, so each
        keeps its own up to date (its buffer depth, the series it knows)."""
        while True:
            try:
                await run_in_threadpool(self.update_gauges)
            except Exception:
                if self.ready:  # not the vault closing under it at shutdown
                    log.exception("updating the gateway's gauges failed")
            await asyncio.sleep(GAUGE_INTERVAL_S)

    async def maintainer(self) -> None:
        """Maintenance in one worker at a time (the first to take ``maintain.lock``)."""
        interval = parse_duration_ms(self.settings.maintain_interval) / 1000
        path = self.vault.state_dir / MAINTAIN_LOCK
        with open(path, "a+") as lock_file:
            while True:
                await asyncio.sleep(interval)
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another worker maintains this round
                try:
                    await run_in_threadpool(self.vault.maintain)
                except Exception:
                    log.exception("maintenance failed; it is retried next round")
                finally:
                    fcntl.flock(lock_file, fcntl.LOCK_UN)


INFLUX_VERSION = "1.8-metricvault"
GAUGE_INTERVAL_S = 1.0


def _is_ddl(statement: str) -> bool:
    words = statement.upper().split()
    return words[:2] in (["CREATE", "DATABASE"], ["CREATE", "RETENTION"])


def _too_large(size: int, limit: int) -> str:
    return (
        f"request body is {size} bytes, over the limit of {limit} bytes (max_body_bytes): "
        "send smaller batches (Prometheus: queue_config.max_samples_per_send) or raise the limit"
    )


def _with_tenant(table: pa.Table, label: str, tenant: str) -> pa.Table:
    """Set the tenant label on every row; a payload's own value for it is overwritten."""
    column = pa.array([tenant] * table.num_rows, pa.string())
    if label in table.column_names:
        return table.set_column(table.column_names.index(label), label, column)
    return table.append_column(label, column)


SETTINGS_ENV = "METRICVAULT_GATEWAY_SETTINGS_JSON"
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
# liveness and readiness for orchestrators, Influx clients' ping, the self-metrics scrape
PUBLIC_ROUTES = frozenset({"/ping", "/-/healthy", "/-/ready", "/metrics"})


def app_from_environment() -> Starlette:
    """Factory for gateway worker processes (``gateway_workers > 1``): each opens the vault
    itself from the settings the parent serialised, and closes it when it stops."""
    _die_with_parent()
    settings = Settings.load(env={}, **json.loads(os.environ[SETTINGS_ENV]))
    # each worker appends to its own buffer file, so workers never wait on each other's
    # SQLite write lock; maintenance (and every worker's start) flushes all of them
    vault = open_store(
        settings.data, settings, need="serve", buffer_name=worker_buffer_name(os.getpid())
    )
    vault.flush_other_buffers()
    # the workers' self-metrics go to files shared by this serve run (prometheus-client's
    # multiprocess mode), so /metrics counts every worker whichever one answers
    metrics = GatewayMetrics.for_worker(vault.state_dir)
    return create_app(vault, settings, close_vault=True, metrics=metrics)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when its parent dies (even by SIGKILL), so a killed
    gateway never leaves workers holding the port; their buffers are flushed on restart."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def create_app(
    vault: ServingStore,
    settings: Settings,
    close_vault: bool = False,
    metrics: GatewayMetrics | None = None,
) -> Starlette:
    """The gateway over ``vault``; ``metrics``: a worker's (:meth:`GatewayMetrics.for_worker`),
    closed with the app, or by default a private in-process registry."""
    gateway = Gateway(vault, settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(gateway.flusher())]
        if settings.gateway_maintain:
            tasks.append(asyncio.create_task(gateway.maintainer()))
        if gateway.metrics.multiprocess_dir is not None:
            tasks.append(asyncio.create_task(gateway.gauge_updater()))
        quiet_accept_errors()  # in this worker's loop: one line per burst, not a traceback each
        if not logging.getLogger().handlers:  # a spawned worker: log as the serve process does
            logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
        remember_secrets(settings)
        redact_logs()
        gateway.ready = True
        try:
            yield
        finally:
            gateway.ready = False
            for task in tasks:
                task.cancel()
            try:
                await run_in_threadpool(vault.close if close_vault else vault.flush)  # drain all
            finally:
                gateway.metrics.close()

    # Every route authenticates (Gateway.handle) except these, which read no body and
    # answer GET/HEAD only (a test walks the route table and checks both)
    routes = [
        Route("/api/v1/write", gateway.remote_write, methods=["POST"]),
        Route("/write", gateway.influx_write, methods=["POST"]),
        Route("/api/v2/write", gateway.influx_write, methods=["POST"]),
        Route("/v1/metrics", OtlpAPI(gateway).export, methods=["POST"]),  # OpenTelemetry
        Route("/ping", gateway.influx_ping, methods=["GET", "HEAD"]),
        Route("/query", gateway.influx_query, methods=["GET", "POST"]),
        Route("/api/v1/experiments", gateway.experiments, methods=["GET", "POST"]),
        Route("/api/v1/experiments/{experiment_id}", gateway.experiments, methods=["GET", "PATCH"]),
        Route("/-/healthy", gateway.healthy, methods=["GET", "HEAD"]),
        Route("/-/ready", gateway.ready_check, methods=["GET", "HEAD"]),
        Route("/metrics", gateway.metrics_page, methods=["GET"]),
        *PrometheusAPI(gateway).routes(),  # the read side: PromQL and what Grafana asks
    ]
    assert {r.path for r in routes} >= PUBLIC_ROUTES
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app
