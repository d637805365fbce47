"""``POST /api/v1/read`` under hostile requests: the decompressed body, the matcher type enum
and the whole request's time are bounded, each refusal saying what and which limit."""

from __future__ import annotations

import sys

import cramjam
import pytest

from metricvault.wire.proto.remote_read import ReadRequest, ReadResponse

T0 = 1_767_225_600_000


def _body(request: ReadRequest) -> bytes:
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _read(name: str, *, matcher_type: int = 0, queries: int = 1) -> ReadRequest:
    request = ReadRequest()
    for _ in range(queries):
        query = request.queries.add(start_timestamp_ms=T0, end_timestamp_ms=T0 + 600_000)
        query.matchers.add(type=matcher_type, name="__name__", value=name)
    return request


def _write(client, lines: str) -> None:
    assert client.post("/write?precision=ms", content=lines).status_code == 204


def test_a_body_that_decompresses_past_max_body_bytes_is_413_before_decompressing(make_client):
    client, _ = make_client(max_body_bytes=10_000)
    request = _read("x" * 50_000)  # compresses to a few hundred bytes
    body = _body(request)
    assert len(body) < 10_000
    reply = client.post("/api/v1/read", content=body)
    assert reply.status_code == 413, reply.text
    declared = f"{request.ByteSize():,}"
    assert declared in reply.text and "10,000" in reply.text and "max_body_bytes" in reply.text


@pytest.mark.parametrize("matcher_type", [4, 7, -1, 2**31 - 1])
def test_a_matcher_type_outside_the_enum_is_400_naming_it(make_client, matcher_type):
    client, _ = make_client()
    _write(client, f"gpu,gpu=0 util=1 {T0}\n")
    reply = client.post("/api/v1/read", content=_body(_read("gpu_util", matcher_type=matcher_type)))
    assert reply.status_code == 400, reply.text
    assert f"type {matcher_type}," in reply.text and "0 (=), 1 (!=), 2 (=~), 3 (!~)" in reply.text


@pytest.mark.parametrize(("matcher_type", "found"), [(0, 1), (1, 0), (2, 1), (3, 0)])
def test_each_matcher_type_of_the_enum_reads_as_its_operator(make_client, matcher_type, found):
    client, _ = make_client()
    _write(client, f"gpu,gpu=0 util=1 {T0}\n")
    reply = client.post("/api/v1/read", content=_body(_read("gpu_util", matcher_type=matcher_type)))
    assert reply.status_code == 200, reply.text
    answer = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(reply.content)))
    assert len(answer.results[0].timeseries) == found


def _reading_threads() -> list[str]:
    """Threads now inside RemoteRead.read_samples."""
    return [
        str(ident)
        for ident, frame in sys._current_frames().items()
        if any(f.f_code.co_name == "read_samples" for f in _stack(frame))
    ]


def _stack(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def test_many_queries_in_one_request_are_bounded_by_query_timeout_and_stop(make_client):
    client, _ = make_client(query_timeout="1ms")
    _write(client, "".join(f"gpu,gpu={i} util=1 {T0 + i}\n" for i in range(50)))
    reply = client.post("/api/v1/read", content=_body(_read("gpu_util", queries=1000)))
    assert reply.status_code == 503, reply.text
    assert "query timed out in expression evaluation" in reply.text
    assert not _reading_threads(), "the read went on after its 503"
    # the worker is free: the next request is answered
    assert client.get("/-/ready").status_code == 200


def test_the_samples_answered_are_bounded_by_query_max_samples(make_client):
    client, _ = make_client(query_max_samples=10)
    _write(client, "".join(f"gpu,gpu=0 util={i} {T0 + i * 1000}\n" for i in range(20)))
    reply = client.post("/api/v1/read", content=_body(_read("gpu_util")))
    assert reply.status_code == 422, reply.text
    assert "too many samples" in reply.text
