"""remote_write's hop to the gateway's own write threads: the answer comes back, a cancelled
request waits for its thread's work to end (nothing is written after the gateway drains),
and closing joins the threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from metricvault.config import Settings
from metricvault.server.app import Gateway


def _gateway() -> Gateway:
    return Gateway(vault=None, settings=Settings())  # type: ignore[arg-type]


def test_work_runs_on_a_write_thread_and_returns_its_answer():
    gateway = _gateway()

    async def main() -> tuple[int, str]:
        return await gateway.in_write_thread(
            lambda a, b: (a + b, threading.current_thread().name), 2, 3
        )

    try:
        total, thread = asyncio.run(main())
    finally:
        gateway.close_write_threads()
    assert total == 5
    assert thread.startswith("metricvault-write")


def test_an_error_in_the_thread_reaches_the_request():
    gateway = _gateway()

    def fails() -> None:
        raise ValueError("bad body")

    try:
        with pytest.raises(ValueError, match="bad body"):
            asyncio.run(gateway.in_write_thread(fails))
    finally:
        gateway.close_write_threads()


def test_a_cancelled_request_waits_for_its_thread_to_finish():
    gateway = _gateway()
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow_store() -> str:
        started.set()
        release.wait(30)
        finished.set()
        return "stored"

    async def main() -> bool:
        task = asyncio.create_task(gateway.in_write_thread(slow_store))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        still_waiting = not task.done()  # the cancel must not return before the store ends
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return still_waiting

    try:
        assert asyncio.run(main())
    finally:
        release.set()
        gateway.close_write_threads()
    assert finished.is_set()


def test_closing_waits_for_work_in_flight():
    gateway = _gateway()
    release, finished = threading.Event(), threading.Event()

    def store() -> None:
        release.wait(30)
        finished.set()

    async def main() -> None:
        task = asyncio.create_task(gateway.in_write_thread(store))
        await asyncio.sleep(0)
        timer = threading.Timer(0.05, release.set)
        timer.start()
        gateway.close_write_threads()  # blocks until the store ends
        assert finished.is_set()
        await task

    asyncio.run(main())


def test_a_cancelled_request_stays_cancelled_when_its_store_then_fails():
    gateway = _gateway()
    started, release = threading.Event(), threading.Event()

    def failing_store() -> None:
        started.set()
        release.wait(30)
        raise ValueError("disk full")

    async def main() -> None:
        task = asyncio.create_task(gateway.in_write_thread(failing_store))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        release.set()
        gateway.close_write_threads()
