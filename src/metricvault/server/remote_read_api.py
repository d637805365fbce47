"""remote_read on ``metricvault serve``: ``POST /api/v1/read`` (SAMPLES), so an unmodified
Prometheus with ``remote_read:`` pointed here answers PromQL over the vault's raw samples
beside its own.

Reads are narrowed to the caller's tenant first (:mod:`.reads`). A request is bounded as a
query is: its decompressed body by ``max_body_bytes`` (413, before anything is decompressed),
the samples it answers with by ``query_max_samples`` (422) and all of its queries together by
``query_timeout`` (503), checked between queries and series, so the work stops there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import cramjam
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.durations import parse_duration_ms
from metricvault.errors import InputError, SelectorError, TooLargeError
from metricvault.ingest.protocols.remote_write_framing import (
    decompress_snappy_block,
    snappy_declared_length,
)
from metricvault.promql.limits import Limits, timed_out
from metricvault.selector import Matcher
from metricvault.server.api import ServerAPI
from metricvault.server.reads import tenant_source

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

log = logging.getLogger("metricvault.gateway")
ENDPOINT = "/api/v1/read"
# how long past the request's deadline the route waits before answering 503 without it
BACKSTOP_GRACE_S = 1.0
Query = tuple[int, int, list[Matcher]]


class RemoteReadAPI(ServerAPI):
    name = "remote_read"
    summary = "`POST /api/v1/read` (Prometheus remote_read, SAMPLES)"

    def routes(self, gateway: Gateway) -> list[Route]:
        return [Route(ENDPOINT, RemoteRead(gateway).remote_read, methods=["POST"])]


API = RemoteReadAPI()


class RemoteRead:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.timeout_s = parse_duration_ms(gateway.settings.query_timeout) / 1000

    async def remote_read(self, request: Request) -> Response:
        async def run(req: Request, who: Principal) -> Response:
            body = await self.gateway.body(req)
            queries = decode_read_request(body, self.gateway.settings.max_body_bytes)
            limits = Limits(self.gateway.settings.query_max_samples, 0, self.timeout_s)
            try:  # the deadline inside read_samples stops the work; this only answers later
                answer = await asyncio.wait_for(
                    run_in_threadpool(self.read_samples, queries, who, limits),
                    self.timeout_s + BACKSTOP_GRACE_S,
                )
            except TimeoutError:
                log.warning("a remote read ran %.1f s past its deadline", BACKSTOP_GRACE_S)
                raise timed_out() from None
            return Response(
                bytes(cramjam.snappy.compress_raw(answer)),
                headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
            )

        return await self.gateway.handle(request, ENDPOINT, run)

    def read_samples(self, queries: list[Query], who: Principal, limits: Limits) -> bytes:
        """The ReadResponse bytes for the decoded queries (blocking): raw samples, and before
        the raw horizon each minute's first and last sample from the 1m rollups (real samples
        at their times; docs/promql.md, "remote_read")."""
        from metricvault.wire.proto.remote_read import ReadResponse

        source = tenant_source(self.gateway, who)
        response = ReadResponse()
        for start_ms, end_ms, matchers in queries:
            limits.check()
            result = response.results.add()
            for series in source.select_kept(matchers, start_ms, end_ms):
                limits.reserve(int(series.ts.size))  # everything answered is held until sent
                out = result.timeseries.add()
                for name in sorted(series.labels):  # Prometheus expects labels sorted
                    out.labels.add(name=name, value=series.labels[name])
                for t, v in zip(series.ts.tolist(), series.values.tolist(), strict=True):
                    out.samples.add(timestamp=t, value=v)
        return bytes(response.SerializeToString())


def decode_read_request(body: bytes, max_decoded_bytes: int) -> list[Query]:
    """(start ms, end ms, matchers) per query of a snappy-compressed ReadRequest; a body that
    is not one is a 400 naming what is wrong, one that decompresses past
    ``max_decoded_bytes`` a 413 (refused from the snappy header, before decompressing)."""
    from metricvault.wire.proto.messages import DecodeError
    from metricvault.wire.proto.remote_read import ReadRequest

    raw = decompress_read_body(body, max_decoded_bytes)
    try:
        request = ReadRequest.FromString(bytes(raw))
    except DecodeError as exc:
        raise InputError(f"remote read body is not a prometheus.ReadRequest: {exc}") from None
    queries = []
    for number, query in enumerate(request.queries):
        try:
            matchers = [_matcher(number, m.type, m.name, m.value) for m in query.matchers]
        except SelectorError as exc:
            raise InputError(f"remote read matcher refused: {exc}") from None
        queries.append((query.start_timestamp_ms, query.end_timestamp_ms, matchers))
    return queries


def decompress_read_body(body: bytes, max_decoded_bytes: int) -> memoryview:
    try:
        declared = snappy_declared_length(body)
    except InputError as exc:
        raise InputError(
            f"remote read body is not snappy block-compressed ({len(body)} bytes): {exc.message}"
        ) from None
    if declared > max_decoded_bytes:
        raise TooLargeError(
            f"remote read body decompresses to {declared:,} bytes (its snappy header says so), "
            f"over the limit of {max_decoded_bytes:,} bytes (max_body_bytes): send fewer "
            "queries per request, or raise max_body_bytes"
        )
    return decompress_snappy_block(body, max_decoded_bytes)


def _matcher(query: int, kind: int, name: str, value: str) -> Matcher:
    """A LabelMatcher as a Matcher; a type outside the enum (EQ, NEQ, RE, NRE) is refused,
    never read as another one."""
    from metricvault.wire.proto.remote_read import MATCHER_OPS

    if not 0 <= kind < len(MATCHER_OPS):
        known = ", ".join(f"{i} ({op})" for i, op in enumerate(MATCHER_OPS))
        raise InputError(
            f"remote read query {query}: matcher on {name!r} has type {kind}, which is not a "
            f"LabelMatcher.Type; the types are {known}"
        )
    return Matcher(name, MATCHER_OPS[kind], value)
