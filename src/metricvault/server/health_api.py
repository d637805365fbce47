"""Liveness, readiness and the gateway's own metrics: ``GET /-/healthy``, ``GET /-/ready``,
``GET /metrics``. These read no body and need no credential (``PUBLIC_ROUTES``)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from metricvault.server.api import BackgroundTask, ServerAPI
from metricvault.store.buffer import quarantined_batches
from metricvault.wire.remote_write import SERVER_TIME_HEADER

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

log = logging.getLogger("metricvault.gateway")
GAUGE_INTERVAL_S = 1.0


class HealthAPI(ServerAPI):
    name = "health"
    summary = "`GET /-/healthy`, `GET /-/ready` and `GET /metrics` (the gateway's own metrics)"

    def routes(self, gateway: Gateway) -> list[Route]:
        health = Health(gateway)
        return [
            Route("/-/healthy", healthy, methods=["GET", "HEAD"]),
            Route("/-/ready", health.ready_check, methods=["GET", "HEAD"]),
            Route("/metrics", health.metrics_page, methods=["GET"]),
        ]

    def background_tasks(self, gateway: Gateway) -> list[BackgroundTask]:
        if gateway.metrics.multiprocess_dir is None:
            return []
        return [Health(gateway).gauge_updater]


API = HealthAPI()


async def healthy(request: Request) -> Response:
    # The server's clock in ms: agents estimate their clock offset from it (round trip);
    # the Date header has only one-second resolution.
    headers = {SERVER_TIME_HEADER: str(time.time_ns() // 1_000_000)}
    return PlainTextResponse("metricvault gateway is healthy\n", headers=headers)


class Health:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def ready_check(self, request: Request) -> Response:
        if not self.gateway.ready:
            return PlainTextResponse("starting\n", 503)
        return PlainTextResponse("metricvault gateway is ready\n")

    async def metrics_page(self, request: Request) -> Response:
        body, content_type = await run_in_threadpool(self.scrape)
        return Response(body, media_type=content_type)

    def scrape(self) -> tuple[bytes, str]:
        """Update this process's gauges and render every worker's metrics (blocking)."""
        self.update_gauges()
        return self.gateway.metrics.render()

    def update_gauges(self) -> None:
        vault, metrics = self.gateway.vault, self.gateway.metrics
        samples, size = vault.buffered()
        metrics.buffer_samples.set(samples)
        metrics.buffer_bytes.set(size)
        metrics.series.set(vault.series_count())
        metrics.quarantined.set(quarantined_batches(vault.state_dir))

    async def gauge_updater(self) -> None:
        """With several workers a scrape reads the gauges every worker last wrote, so each
        keeps its own up to date (its buffer depth, the series it knows)."""
        while True:
            try:
                await run_in_threadpool(self.update_gauges)
            except OSError as exc:  # no file descriptor left: the next round tries again
                if self.gateway.ready:
                    log.error("updating the gateway's gauges failed: %s", exc)
            except Exception:
                if self.gateway.ready:  # not the vault closing under it at shutdown
                    log.exception("updating the gateway's gauges failed")
            await asyncio.sleep(GAUGE_INTERVAL_S)
