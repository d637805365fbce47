"""The store's upkeep inside ``serve``: the buffer flushed every ``flush_interval``, and
maintenance (compaction, rollups, retention) every ``maintain_interval`` in one worker at a
time. Background tasks only; no routes."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import time
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from metricvault.durations import parse_duration_ms
from metricvault.server.api import BackgroundTask, ServerAPI
from metricvault.store.layout import MAINTAIN_LOCK

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

log = logging.getLogger("metricvault.gateway")


class UpkeepAPI(ServerAPI):
    name = "upkeep"
    summary = "flushes the ingest buffer and, with gateway_maintain, maintains the vault"

    def background_tasks(self, gateway: Gateway) -> list[BackgroundTask]:
        tasks = [lambda: flusher(gateway)]
        if gateway.settings.gateway_maintain:
            tasks.append(lambda: maintainer(gateway))
        return tasks


API = UpkeepAPI()


async def flusher(gateway: Gateway) -> None:
    """Flush every flush_interval (the vault also flushes early on big buffers)."""
    interval = parse_duration_ms(gateway.settings.flush_interval) / 1000
    while True:
        await asyncio.sleep(interval)
        started = time.perf_counter()
        try:
            await run_in_threadpool(gateway.vault.flush)
            gateway.metrics.flush.observe(time.perf_counter() - started)
        except Exception:  # samples stay in the durable buffer; try again next round
            log.exception("flush failed; buffered samples are kept and retried")


async def maintainer(gateway: Gateway) -> None:
    """Maintenance in one worker at a time (the first to take ``maintain.lock``)."""
    interval = parse_duration_ms(gateway.settings.maintain_interval) / 1000
    path = gateway.vault.state_dir / MAINTAIN_LOCK
    with open(path, "a+") as lock_file:
        while True:
            await asyncio.sleep(interval)
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another worker maintains this round
            try:
                await run_in_threadpool(gateway.vault.maintain)
            except Exception:
                log.exception("maintenance failed; it is retried next round")
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
