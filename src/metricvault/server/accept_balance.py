"""Spreading connections over the gateway's worker processes (``gateway_workers > 1``).

The workers share one listening socket. asyncio's accept callback takes every connection
waiting on it in one go, so the worker woken first takes a burst of new connections whole:
a sender opening its keep-alive connections at once (Prometheus' remote_write shards, the
ingest benchmark's six) often had all of them served by one process while the other idled
(measured: six of six in two of three runs), one GIL and one core doing the work of two.

:class:`BalancedEventLoop` accepts one connection per wake-up of the listening socket, and a
worker already holding connections waits ``ACCEPT_STEP_S`` per connection held (at most
``ACCEPT_MAX_HELD`` of them) before it accepts, so the worker holding the fewest takes the
next one: every worker is woken for each connection, and the least loaded answers first. A
worker left alone still accepts after its wait; established connections are never moved.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sized
from typing import Any

ACCEPT_STEP_S = 0.002  # the wait per connection this worker holds
ACCEPT_MAX_HELD = 16  # so a new connection waits at most 32 ms


class BalancedEventLoop(asyncio.SelectorEventLoop):
    """The selector event loop of one gateway worker process; ``held``: the connections it
    serves (uvicorn's set of live connections, :func:`hold`)."""

    held: Sized = ()
    accepting = 0  # accepted, their protocol not made yet
    step_s: float = ACCEPT_STEP_S

    def accept_delay(self) -> float:
        return min(len(self.held) + self.accepting, ACCEPT_MAX_HELD) * self.step_s

    # asyncio's reader callback for a listening socket, with the arguments its
    # _start_serving registers (the same in Python 3.11 to 3.13): one accept per call
    # (backlog 1), after this worker's wait
    def _accept_connection(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        accept = (protocol_factory, sock, sslcontext, server, 1, *timeouts)
        delay = self.accept_delay()
        if delay <= 0:
            self._accept_one(accept)
            return
        self._remove_reader(sock.fileno())  # type: ignore[attr-defined]
        self.call_later(delay, self._resume, accept)

    def _resume(self, accept: tuple[Any, ...]) -> None:
        sock, server = accept[1], accept[3]
        if sock.fileno() == -1 or (server is not None and not server.is_serving()):
            return  # closed while this worker waited
        self._add_reader(sock.fileno(), self._accept_connection, *accept)  # type: ignore[attr-defined]
        self._accept_one(accept)

    def _accept_one(self, accept: tuple[Any, ...]) -> None:
        """Accept one waiting connection, counted as held until its protocol is made."""
        ready = len(self._ready)  # type: ignore[attr-defined]
        super()._accept_connection(*accept)  # type: ignore[misc]
        # an accepted connection schedules the task that makes its transport and protocol
        self.accepting += len(self._ready) - ready  # type: ignore[attr-defined]


def hold(loop: asyncio.AbstractEventLoop, connections: Sized) -> None:
    """Tell a :class:`BalancedEventLoop` which connections it serves, on each new
    connection's ``connection_made`` (other loops: nothing to do)."""
    if isinstance(loop, BalancedEventLoop):
        loop.held = connections
        loop.accepting = max(loop.accepting - 1, 0)
