"""BalancedEventLoop: worker loops sharing one listening socket take turns by the connections
each holds; a loop alone still accepts every connection; closing while waiting is clean."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from metricvault.server.accept_balance import BalancedEventLoop, hold

STEP_S = 0.2  # long beside a thread's scheduling delay, so the order of accepts is certain
WAIT_S = 30.0


class Holding(asyncio.Protocol):
    """Keeps its connection open and registers the loop's live connections, as uvicorn's
    protocol does through ``HeadGuard``."""

    def __init__(self, loop: BalancedEventLoop, live: set[Holding]) -> None:
        self.loop, self.live = loop, live

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.live.add(self)
        hold(self.loop, self.live)

    def connection_lost(self, exc: Exception | None) -> None:
        self.live.discard(self)


class Worker:
    """One BalancedEventLoop on its own thread serving ``listener``."""

    def __init__(self, listener: socket.socket) -> None:
        self.loop = BalancedEventLoop()
        self.loop.step_s = STEP_S
        self.live: set[Holding] = set()
        self.started = threading.Event()
        # each worker process has its own descriptor of the listening socket
        self.thread = threading.Thread(target=self._run, args=(listener.dup(),), daemon=True)
        self.thread.start()
        assert self.started.wait(WAIT_S)

    def _run(self, listener: socket.socket) -> None:
        listener.setblocking(False)

        async def serve() -> None:
            self.server = await self.loop.create_server(
                lambda: Holding(self.loop, self.live), sock=listener
            )
            self.started.set()

        self.loop.run_until_complete(serve())
        self.loop.run_forever()

    def held(self) -> int:
        return asyncio.run_coroutine_threadsafe(_count(self.live), self.loop).result(WAIT_S)

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(WAIT_S)
        self.loop.close()


async def _count(live: set[Holding]) -> int:
    return len(live)


@contextmanager
def listening() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield listener
    finally:
        listener.close()


@contextmanager
def cleaned_up() -> Iterator[tuple[list[Worker], list[socket.socket]]]:
    """Lists to put workers and client sockets in: all closed and stopped at the end."""
    workers: list[Worker] = []
    clients: list[socket.socket] = []
    try:
        yield workers, clients
    finally:
        for client in clients:
            client.close()
        for worker in workers:
            worker.stop()


def connect(listener: socket.socket, count: int) -> list[socket.socket]:
    return [socket.create_connection(listener.getsockname()) for _ in range(count)]


def wait_held(workers: list[Worker], total: int) -> list[int]:
    """The connections each worker holds, once they hold ``total`` together."""
    deadline = time.monotonic() + WAIT_S
    counts = [w.held() for w in workers]
    while sum(counts) < total and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = [w.held() for w in workers]
    return counts


def test_a_burst_of_connections_is_spread_over_the_workers():
    with listening() as listener, cleaned_up() as (workers, clients):
        workers += [Worker(listener), Worker(listener)]
        clients += connect(listener, 6)  # all waiting at once, as a sender's shards open
        counts = wait_held(workers, 6)
        assert sorted(counts) == [3, 3]


def test_the_worker_holding_fewer_connections_takes_the_next_one():
    with listening() as listener, cleaned_up() as (workers, clients):
        workers.append(Worker(listener))
        clients += connect(listener, 2)
        assert wait_held(workers, 2) == [2]
        workers.append(Worker(listener))  # a worker that starts late, holding none
        clients += connect(listener, 2)  # the first waits two steps, the new one none
        assert wait_held(workers, 4) == [2, 2]


def test_a_worker_alone_accepts_every_connection_after_its_waits():
    with listening() as listener, cleaned_up() as (workers, clients):
        worker = Worker(listener)
        workers.append(worker)
        worker.loop.step_s = 0.01
        clients += connect(listener, 5)
        assert wait_held([worker], 5) == [5]


def test_closing_the_server_while_a_worker_waits_stops_accepting_cleanly():
    with listening() as listener, cleaned_up() as (workers, clients):
        worker = Worker(listener)
        workers.append(worker)
        worker.loop.step_s = 1.0
        errors: list[object] = []
        worker.loop.set_exception_handler(lambda loop, context: errors.append(context))
        clients += connect(listener, 2)  # the first is taken, the second waits a step
        assert wait_held([worker], 1) == [1]
        closed = asyncio.run_coroutine_threadsafe(_close(worker), worker.loop)
        closed.result(WAIT_S)
        resumed = threading.Event()
        worker.loop.call_later(1.5, resumed.set)  # past the worker's wait
        assert resumed.wait(WAIT_S)
        assert worker.held() == 1
        assert errors == []


async def _close(worker: Worker) -> None:
    worker.server.close()
