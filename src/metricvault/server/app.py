"""The gateway (``metricvault serve``): an ASGI app over a store, and what every API shares.

:class:`Gateway` is the plumbing every route uses: authentication and the caller's tenant
(:meth:`Gateway.handle`), the body limit, refusals worded from :mod:`metricvault.errors`, and
the one write path into the store. The APIs themselves (write protocols, the Prometheus query
API, remote_read, OTLP, experiments, health) are modules listed in
:data:`metricvault.server.apis.APIS`; :func:`create_app` mounts each one's routes and starts
its background tasks.

Every write request is atomic: it is decoded completely (decoders are pure functions in
``ingest/protocols/``), validated, and then written to the durable ingest buffer in one
transaction; the 2xx is sent only after that. Any problem refuses the whole request and stores
nothing. Status codes follow the remote_write spec: 204 stored; 400 never retry; 401
credentials; 413 too large; 415 wrong encoding/content type; 429/503 with Retry-After: retry
later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from metricvault.config import Settings
from metricvault.credentials import Principal
from metricvault.durations import parse_duration_ms
from metricvault.errors import MetricVaultError, RetryLater, TooLargeError
from metricvault.ingest.protocols.remote_write import DecodedWrite, ResolvedSamples
from metricvault.open import open as open_store
from metricvault.protocols import ServingStore
from metricvault.redact import redact_logs
from metricvault.redact import remember as remember_secrets
from metricvault.server.apis import APIS
from metricvault.server.auth import authenticate_request
from metricvault.server.connections import quiet_accept_errors
from metricvault.server.limits import NewSeriesLimiter
from metricvault.server.metrics import GatewayMetrics
from metricvault.server.ui_common import freeze_startup_heap
from metricvault.store.layout import worker_buffer_name
from metricvault.store.vault import Vault

log = logging.getLogger("metricvault.gateway")
T = TypeVar("T")
# threads for remote_write's decode + store: as many as anyio's default pool lends
WRITE_THREADS = 40


class Gateway:
    def __init__(
        self, vault: ServingStore, settings: Settings, metrics: GatewayMetrics | None = None
    ) -> None:
        self.vault = vault
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.limiter = NewSeriesLimiter(settings.max_new_series_per_minute)
        self.ready = False
        self._decode_limits: dict[str, Any] | None = None
        self._writers: concurrent.futures.ThreadPoolExecutor | None = None

    async def in_write_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the gateway's own write threads (a plain executor hop, cheaper
        on the event loop than anyio's). As with anyio's hand-off, a cancelled request still
        waits for its thread to finish, so nothing is written after the gateway drains."""
        if self._writers is None:
            self._writers = concurrent.futures.ThreadPoolExecutor(
                WRITE_THREADS, thread_name_prefix="metricvault-write"
            )
        job = self._writers.submit(fn, *args)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            if not job.cancel():  # queued work is dropped; running work ends first
                ended = asyncio.wrap_future(job)
                while not ended.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([ended])  # returns, never raises the job's error
                if not ended.cancelled():
                    ended.exception()  # retrieved: the request's cancellation is what ends it
            raise

    def close_write_threads(self) -> None:
        """Wait for the write threads' work to end (blocking) and stop them."""
        writers, self._writers = self._writers, None
        if writers is not None:
            writers.shutdown(wait=True)

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
        """The per-request limits both decoders enforce, each a 413 (read once: the
        settings of a gateway do not change)."""
        if self._decode_limits is None:
            self._decode_limits = {
                "max_series": self.settings.max_series_per_request,
                "max_label_names": self.settings.max_label_names_per_request,
                "time_budget_s": parse_duration_ms(self.settings.decode_time_budget) / 1000,
            }
        return self._decode_limits

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
        # staleness markers and NaN/±Inf samples are stored like any other
        self.metrics.received.labels(protocol).inc(decoded.samples)
        if decoded.kinds:  # metadata usually arrives in requests of its own (OTLP: in each)
            self._apply_kinds(decoded.kinds)
        if decoded.histograms:
            self.metrics.dropped.labels("histogram").inc(decoded.histograms)
        resolved = self._resolved(decoded, who)
        if resolved is not None:
            # series the decoder already knew: no table to build, no series to find again
            stored = await run_in_threadpool(self._store_resolved, resolved, who, protocol)
            return stored
        stored = 0
        if decoded.table.num_rows:
            stored = await run_in_threadpool(
                self.store, decoded.table, decoded.kinds, who, protocol
            )
            if stored < decoded.table.num_rows:  # InfluxDB holds no NaN, ±Inf or markers
                self.metrics.dropped.labels("non_finite").inc(decoded.table.num_rows - stored)
        return stored

    def store_known(self, decoded: DecodedWrite, who: Principal, protocol: str) -> int | None:
        """:meth:`store_decoded` for the usual request (series the decoder resolved, no
        metadata, no tenant) on the calling worker thread, so the request takes one thread
        hop for decoding and storing: the samples stored, or None to take that method."""
        resolved = None if decoded.histograms else self._resolved(decoded, who)
        if resolved is None:
            return None
        self.metrics.received.labels(protocol).inc(decoded.samples)
        if decoded.kinds:  # OTLP's types, in every request
            self._apply_kinds(decoded.kinds)
        return self._store_resolved(resolved, who, protocol)

    def _apply_kinds(self, kinds: dict[str, str]) -> None:
        update = self.vault.set_metric_kinds(kinds)
        for change in update.applied:
            self.metrics.kind_changes.labels(change.old, change.new, "applied").inc()
        for change in update.refused:
            self.metrics.kind_changes.labels(change.old, change.new, "refused").inc()

    def _resolved(self, decoded: DecodedWrite, who: Principal) -> ResolvedSamples | None:
        """The request's samples as the decoder resolved them, where the embedded vault can
        store them as they are (no tenant label to add); None: build and write the table."""
        if who.tenant or not isinstance(self.vault, Vault):
            return None
        return decoded.prepared()

    def _store_resolved(self, resolved: ResolvedSamples, who: Principal, protocol: str) -> int:
        assert isinstance(self.vault, Vault)
        stored = self.vault.write_resolved(
            resolved.series_ids,
            resolved.timestamps,
            resolved.values,
            resolved.series,
            admit_new_series=lambda n: self.limiter.admit(who.tenant, n),
        )
        self.metrics.stored.labels(protocol).inc(stored)
        return stored

    async def handle(
        self, request: Request, endpoint: str, work: Callable[[Request, Principal], Any]
    ) -> Response:
        started = time.perf_counter()
        try:
            who = authenticate_request(self, request)  # the header, else the UI's session
            return await work(request, who)  # type: ignore[no-any-return]
        except MetricVaultError as exc:
            return self.refuse(exc)
        except ClientDisconnect:  # gone, or its body's framing was invalid (the server said so)
            return PlainTextResponse("the client disconnected before its body was read\n", 400)
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
# liveness and readiness for orchestrators, Influx clients' ping, the self-metrics scrape,
# the UI's login form (its POST, /ui/session, checks the credential it is given)
PUBLIC_ROUTES = frozenset({"/ping", "/-/healthy", "/-/ready", "/metrics", "/ui/login"})


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
    app = create_app(vault, settings, close_vault=True, metrics=metrics)
    freeze_startup_heap()  # as `metricvault ui` does, before this worker listens
    return app


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
        tasks = [
            asyncio.create_task(task()) for api in APIS for task in api.background_tasks(gateway)
        ]
        quiet_accept_errors()  # in this worker's loop: one line per burst, not a traceback each
        if not logging.getLogger().handlers:  # a spawned worker: log as the serve process does
            logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
        remember_secrets(settings)
        redact_logs()
        await run_in_threadpool(_warm_write_path)
        gateway.ready = True
        try:
            yield
        finally:
            gateway.ready = False
            for task in tasks:
                task.cancel()
            try:
                await run_in_threadpool(gateway.close_write_threads)
                await run_in_threadpool(vault.close if close_vault else vault.flush)  # drain all
            finally:
                gateway.metrics.close()

    routes = [route for api in APIS for route in api.routes(gateway)]
    # Every route authenticates (Gateway.handle) except these, which read no body and
    # answer GET/HEAD only (a test walks the route table and checks both)
    assert {r.path for r in routes} >= PUBLIC_ROUTES
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app


def _warm_write_path() -> None:
    """Before a worker takes requests: the store's first ``pa.array`` of a numpy array makes
    pyarrow import pandas (~0.5 s, seconds on a busy machine), which the first write would
    otherwise wait for."""
    pa.array(np.zeros(1, dtype=np.int64))
    prepare_server()


def prepare_server() -> None:
    """Start loading the server's numba-compiled code on threads: remote_write's decoder and
    the rollup-row kernel of PromQL (requests use numpy until each is ready); and keep the
    large blocks queries free for the next one (:mod:`metricvault.allocator`)."""
    from metricvault import allocator, compiled
    from metricvault.ingest.protocols.remote_write_known import start_compiling
    from metricvault.promql import tiers

    allocator.keep_freed_memory()
    start_compiling()
    compiled.start(tiers.KERNEL)


READ_METHODS = frozenset({"GET", "HEAD"})
# logging in and out changes no data: the read-only UI keeps their POST
SESSION_ROUTES = frozenset({"/ui/session", "/ui/logout"})


def create_ui_app(vault: Any, settings: Any) -> Any:
    """``metricvault ui``: the UI and the read APIs over ``vault``, read-only. No write,
    OTLP, remote_read, rules or upkeep routes are mounted, and the routes that are mounted
    answer GET and HEAD only (anything else: 405; logging in and out of the UI excepted), so
    nothing reached through it can change the vault or the registry."""
    from metricvault.server import experiments_api, health_api, prometheus_api, ui_api

    gateway = Gateway(vault, settings)
    gateway.ready = True
    prepare_server()  # PromQL's rollup-row kernel, the allocator's thresholds
    routes: list[Route] = []
    for api in (ui_api.API, experiments_api.API, health_api.API, prometheus_api.API):
        for route in api.routes(gateway):
            # the Prometheus API's catch-all (a subclass) answers not_found to any method
            if type(route) is Route and route.methods and route.path not in SESSION_ROUTES:
                methods = sorted(set(route.methods) & READ_METHODS)
                route = Route(route.path, route.endpoint, methods=methods)
            routes.append(route)
    app = Starlette(routes=routes)
    app.state.gateway = gateway
    return app
