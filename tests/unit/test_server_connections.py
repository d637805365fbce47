"""The gateway's HTTP protocol: which parser serves, and the 400's words for either parser."""

from __future__ import annotations

import pickle

import h11
import httptools
import pytest

from metricvault.config import Settings
from metricvault.server.connections import (
    HTTP_PROTOCOL,
    GuardedH11Protocol,
    HeadGuard,
    invalid_http_message,
    uvicorn_options,
)


def test_httptools_serves_when_installed() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert issubclass(HTTP_PROTOCOL, HeadGuard) and issubclass(HTTP_PROTOCOL, HttpToolsProtocol)
    assert issubclass(GuardedH11Protocol, HeadGuard)


def test_the_protocol_option_pickles_for_spawned_workers() -> None:
    http = uvicorn_options(Settings())["http"]
    again = pickle.loads(pickle.dumps(http))
    assert again.func is HTTP_PROTOCOL and again.keywords == http.keywords


def _llhttp_error(request: bytes) -> str:
    parser = httptools.HttpRequestParser(object())
    with pytest.raises(httptools.HttpParserError) as caught:
        parser.feed_data(request)
    return str(caught.value)


HEAD = b"POST /api/v1/write HTTP/1.1\r\nHost: h\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "fix"),
    [
        (HEAD + b"Content-Length: -5\r\n\r\n", "Content-Length must be the body's size"),
        (HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab", "send one Content-Length"),
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "each chunk of a chunked body"),
        (HEAD + b"Transfer-Encoding: gzip\r\n\r\n", "Content-Length or Transfer-Encoding"),
        (b"GARBAGE\r\n\r\n", "a well-formed HTTP/1.1 request"),
    ],
)
def test_llhttp_refusals_say_what_to_fix(request_bytes: bytes, fix: str) -> None:
    error = _llhttp_error(request_bytes)
    message = invalid_http_message(error)
    assert message.startswith(f"the request is not valid HTTP/1.1: {error}; "), message
    assert fix in message and message.isascii()


def test_h11_refusals_say_what_to_fix() -> None:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(HEAD + b"Content-Length: -5\r\n\r\n")
    with pytest.raises(h11.RemoteProtocolError) as caught:
        connection.next_event()
    assert "Content-Length must be the body's size" in invalid_http_message(str(caught.value))


def test_a_missing_host_is_refused_in_h11s_words_saying_what_to_fix() -> None:
    from metricvault.server.connections import MISSING_HOST

    connection = h11.Connection(h11.SERVER)
    connection.receive_data(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(h11.RemoteProtocolError) as caught:
        connection.next_event()
    assert str(caught.value) == MISSING_HOST
    assert "send a Host header" in invalid_http_message(MISSING_HOST)
