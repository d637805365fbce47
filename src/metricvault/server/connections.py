"""Connection-level guards of the gateway's HTTP server (below the ASGI app).

uvicorn's HTTP protocols wait forever for a request head: a client that connects and sends
nothing, or half a header, holds a connection (and a file descriptor) for good, and a few
thousand of them (slowloris) exhaust the process's file limit, after which every accept fails
and asyncio logs a traceback for each failure. :class:`HeadGuard` closes a connection
whose request head is not complete ``header_timeout_s`` after its first byte (or after it
connected), closes new connections at once while the process holds more than its file limit
less :data:`FILES_RESERVE`, and answers a request that is not valid HTTP/1.1 (a negative
``Content-Length``, a chunk size that is not hex) with a 400 saying what was wrong.
:class:`GuardedHttpToolsProtocol` (uvicorn's httptools parser, llhttp in C) serves when
httptools is installed, :class:`GuardedH11Protocol` (pure Python) otherwise.
:func:`quiet_accept_errors` turns the accept-failure tracebacks into one line per burst;
:func:`raise_open_file_limit` lifts the soft file limit to the hard one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import resource
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency; h11 serves without it
    httptools = None  # type: ignore[assignment]

from metricvault.durations import parse_duration_ms
from metricvault.server.accept_balance import hold

if TYPE_CHECKING:
    from metricvault.config import Settings

log = logging.getLogger("metricvault.gateway")
ACCEPT_LOG_INTERVAL_S = 60.0


if TYPE_CHECKING:
    _Protocol = H11Protocol  # what the guard reads of either protocol has these types
else:
    _Protocol = object


class HeadGuard(_Protocol):
    """A mixin for uvicorn's HTTP protocols: a deadline for each request head, the open
    connection limit, TCP_NODELAY. Idle keep-alive time between requests stays uvicorn's
    ``timeout_keep_alive``; the deadline starts with the first byte of the next request."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        hold(self.loop, self.connections)  # a multi-worker gateway spreads its accepts
        _no_delay(transport)
        limit = open_connection_limit()
        if len(self.connections) > limit:
            # over the file limit's share for connections: close now, so the process keeps
            # descriptors for its buffer, data files and imports (and accept() keeps working)
            OVER_LIMIT_LOG.report(
                "closing new connections: %d open, the limit is %d (the file limit %d less %d "
                "kept for files); stalled clients are closed after gateway_header_timeout. "
                "Raise ulimit -n if this is real load",
                len(self.connections),
                limit,
                limit + FILES_RESERVE,
                FILES_RESERVE,
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.header_timer is None and self._awaiting_head():
            self._arm()
        super().data_received(data)
        if not self._awaiting_head():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this while it handles its parser's error, and says only "Invalid
        HTTP request received."; the error itself says what was wrong."""
        exc = sys.exc_info()[1]
        if httptools is not None and isinstance(exc, httptools.HttpParserCallbackError):
            exc = exc.__context__  # a refusal of our own callback (a missing Host)
        if isinstance(exc, _PARSER_ERRORS):
            msg = invalid_http_message(str(exc))
        super().send_400_response(msg)

    def _awaiting_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self.header_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _head_too_slow(self) -> None:
        self.header_timer = None
        if self._awaiting_head() and not self.transport.is_closing():
            # no answer: a stalled client is not reading, and a 408 would only fill buffers
            self.transport.close()


class GuardedH11Protocol(HeadGuard, H11Protocol):
    """uvicorn's h11 protocol (pure Python) with :class:`HeadGuard`."""


_PARSER_ERRORS: tuple[type[Exception], ...] = (h11.RemoteProtocolError,)
MISSING_HOST = "Missing mandatory Host: header"  # h11's words
HTTP_PROTOCOL: type[HeadGuard] = GuardedH11Protocol
if httptools is not None:

    class GuardedHttpToolsProtocol(HeadGuard, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol (llhttp, in C) with :class:`HeadGuard`; an HTTP/1.1
        request without a Host header is refused as h11 refuses it (RFC 9112, 3.2: llhttp
        lets it through)."""

        def on_headers_complete(self) -> None:
            if self.parser.get_http_version() == "1.1" and not any(
                name == b"host" for name, _ in self.headers
            ):
                raise httptools.HttpParserError(MISSING_HOST)
            super().on_headers_complete()

    _PARSER_ERRORS += (httptools.HttpParserError,)
    HTTP_PROTOCOL = GuardedHttpToolsProtocol


_CONTENT_LENGTH_FIX = "Content-Length must be the body's size in bytes, a decimal >= 0"
_CHUNK_FIX = "each chunk of a chunked body starts with its size in hex and CRLF"
_ENCODING_FIX = "send the body with Content-Length or Transfer-Encoding: chunked"
# what to do about each of the parsers' refusals (h11's, then llhttp's), by the words its
# message starts with
_HTTP_FIXES = (
    ("bad Content-Length", _CONTENT_LENGTH_FIX),
    ("conflicting Content-Length", "send one Content-Length header"),
    ("illegal chunk header", _CHUNK_FIX),
    ("Only Transfer-Encoding", _ENCODING_FIX),
    ("Missing mandatory Host", "send a Host header (HTTP/1.1 requires one)"),
    ("Invalid character in Content-Length", _CONTENT_LENGTH_FIX),
    ("Duplicate Content-Length", "send one Content-Length header"),
    ("Invalid character in chunk size", _CHUNK_FIX),
    ("Request has invalid `Transfer-Encoding`", _ENCODING_FIX),
)


def invalid_http_message(error: str) -> str:
    """The 400's body for a request the parser refused as invalid HTTP/1.1 (``error``: its
    words)."""
    fix = next((f for start, f in _HTTP_FIXES if error.startswith(start)), "")
    fix = fix or "send a well-formed HTTP/1.1 request (RFC 9112)"
    error = re.sub(r"bytearray\((b'.*')\)", r"\1", error)  # h11 shows the bytes it refused
    text = f"the request is not valid HTTP/1.1: {error}; {fix}\n"
    return text.encode("ascii", "backslashreplace").decode("ascii")  # uvicorn sends ASCII


def _no_delay(transport: asyncio.Transport) -> None:
    """Send each write at once. h11 writes a response's head and body separately; with Nagle
    on, the body waits for the client's delayed ACK of the head, ~40 ms per answer on every
    reused (keep-alive) connection: every Grafana panel and every remote_write batch paid it
    (measured: 44 ms vs 2.8 ms for /-/healthy on a reused connection)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


FILES_RESERVE = 64  # descriptors kept free of connections: buffer, data files, imports


def open_connection_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(soft - FILES_RESERVE, 1)


class BurstLog:
    """Log a recurring warning once per ``interval_s``, with how often it recurred since."""

    def __init__(self, interval_s: float = ACCEPT_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last_logged = float("-inf")
        self.suppressed = 0

    def report(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last_logged < self.interval_s:
            self.suppressed += 1
            return
        log.error(message + " (%d more since the last report)", *args, self.suppressed)
        self.last_logged, self.suppressed = now, 0


OVER_LIMIT_LOG = BurstLog()


class AcceptErrorLog:
    """An asyncio exception handler: a failed ``accept()`` (EMFILE, ENFILE, ENOBUFS) is logged
    as one line per burst (:class:`BurstLog`), without a traceback; anything else goes to
    asyncio's default handler."""

    def __init__(self, interval_s: float = ACCEPT_LOG_INTERVAL_S) -> None:
        self.burst = BurstLog(interval_s)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "accept" not in str(context.get("message", "")):
            loop.default_exception_handler(context)
            return
        self.burst.report(
            "cannot accept connections: %s; the file limit is %d open files (ulimit -n): too "
            "many open connections or files at once. Stalled ones are closed after "
            "gateway_header_timeout; raise the limit if this is real load",
            context.get("exception") or context.get("message"),
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )


def quiet_accept_errors() -> None:
    """Install :class:`AcceptErrorLog` on the running loop (a worker's, at app start)."""
    asyncio.get_running_loop().set_exception_handler(AcceptErrorLog())


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (workers inherit it); (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. an unlimited hard limit some kernels refuse
            pass
    return soft, hard


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` keyword arguments for the gateway (one worker or several)."""
    host, _, port = settings.listen.rpartition(":")
    header_timeout_s = parse_duration_ms(settings.gateway_header_timeout) / 1000
    return {
        "host": host.strip("[]"),
        "port": int(port),
        "log_level": "warning",
        "timeout_graceful_shutdown": 30,
        "ssl_certfile": settings.tls_cert or None,
        "ssl_keyfile": settings.tls_key or None,
        # longer than any sender's send interval: closing a connection a sender is about to
        # reuse makes its next request fail (reset, broken pipe) and be retried
        "timeout_keep_alive": parse_duration_ms(settings.gateway_keep_alive) / 1000,
        "limit_concurrency": settings.gateway_max_connections,
        # a partial of an importable class: it pickles into spawned worker processes
        "http": functools.partial(HTTP_PROTOCOL, header_timeout_s=header_timeout_s),
    }
