"""The store's upkeep inside ``serve``: the buffer flushed every ``flush_interval``, and
maintenance (compaction, rollups, retention, then the configured online anomaly scores) every
``maintain_interval`` in one worker at a time. Background tasks only; no routes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from metricvault.analysis.online_step import OnlineScoring
from metricvault.durations import parse_duration_ms
from metricvault.server.api import BackgroundTask, ServerAPI
from metricvault.store.upkeep import MaintenanceLoop

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
        except OSError as exc:  # no file descriptor left, a full disk: not a bug, no traceback
            log.error("flush failed (%s); buffered samples are kept and retried", exc)
        except Exception:  # samples stay in the durable buffer; try again next round
            log.exception("flush failed; buffered samples are kept and retried")


async def maintainer(gateway: Gateway) -> None:
    """The store's maintenance loop (store/upkeep.py) in a thread of this worker: one worker
    of all (and no ``maintain --loop`` beside them) maintains each round, by its lock."""
    interval = parse_duration_ms(gateway.settings.maintain_interval) / 1000
    # the anomaly_score_* settings' online scores, after each round (as maintain --loop)
    scoring = OnlineScoring.from_settings(gateway.settings)
    steps = [scoring.as_step(gateway.vault)] if scoring.enabled else []
    loop = MaintenanceLoop(gateway.vault, interval, steps=steps)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop, False), name="maintainer", daemon=True)
    thread.start()
    try:
        await asyncio.Event().wait()  # until the app shuts down and cancels this task
    finally:
        stop.set()
        # a round in progress ends before the vault closes (each of its steps commits whole)
        await asyncio.to_thread(thread.join)
