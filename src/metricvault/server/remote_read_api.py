"""remote_read on ``metricvault serve``: ``POST /api/v1/read`` (SAMPLES), so an unmodified
Prometheus with ``remote_read:`` pointed here answers PromQL over the vault's raw samples
beside its own. Reads are narrowed to the caller's tenant first (:mod:`.reads`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import cramjam
import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.errors import InputError, SelectorError
from metricvault.promql import SeriesSamples, VaultSource
from metricvault.promql.tiers import edge_samples
from metricvault.selector import Matcher
from metricvault.server.api import ServerAPI
from metricvault.server.reads import ScopedSource, readable, tenant_matchers

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

ENDPOINT = "/api/v1/read"


class RemoteReadAPI(ServerAPI):
    name = "remote_read"
    summary = "`POST /api/v1/read` (Prometheus remote_read, SAMPLES)"

    def routes(self, gateway: Gateway) -> list[Route]:
        return [Route(ENDPOINT, RemoteRead(gateway).remote_read, methods=["POST"])]


API = RemoteReadAPI()


class RemoteRead:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def remote_read(self, request: Request) -> Response:
        """``POST /api/v1/read`` (SAMPLES): an unmodified Prometheus with ``remote_read:``
        pointed here answers PromQL over the vault's raw samples beside its own."""

        async def run(req: Request, who: Principal) -> Response:
            body = await self.gateway.body(req)
            queries = decode_read_request(body)
            answer = await run_in_threadpool(self.read_samples, queries, who)
            return Response(
                bytes(cramjam.snappy.compress_raw(answer)),
                headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
            )

        return await self.gateway.handle(request, ENDPOINT, run)

    def read_samples(self, queries: list[tuple[int, int, list[Matcher]]], who: Principal) -> bytes:
        """The ReadResponse bytes for the decoded queries (blocking)."""
        from metricvault.wire.proto.remote_read import ReadResponse

        source = ScopedSource(
            VaultSource(readable(self.gateway)),
            tenant_matchers(self.gateway, who),
            self.gateway.settings.query_max_samples,
            0,
        )
        response = ReadResponse()
        for start_ms, end_ms, matchers in queries:
            result = response.results.add()
            for series in self.read_series(source, matchers, start_ms, end_ms):
                out = result.timeseries.add()
                for name in sorted(series.labels):  # Prometheus expects labels sorted
                    out.labels.add(name=name, value=series.labels[name])
                for t, v in zip(series.ts.tolist(), series.values.tolist(), strict=True):
                    out.samples.add(timestamp=t, value=v)
        return bytes(response.SerializeToString())

    @staticmethod
    def read_series(
        source: ScopedSource, matchers: list[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        """Raw samples; before the raw horizon, each minute's first and last sample from the
        1m rollups (real samples at their times; docs/promql.md, "remote_read")."""
        horizon = source.raw_horizon()
        if not horizon or start_ms >= horizon:
            return source.select(matchers, start_ms, end_ms)
        old_end = min(end_ms, horizon - 1)
        minute = 60_000
        found = source.select_buckets(
            matchers, start_ms // minute * minute, old_end // minute * minute + minute, minute
        )
        merged = {
            tuple(sorted(s.labels.items())): s
            for s in (
                SeriesSamples(*edge)
                for edge in (edge_samples(found, start_ms, old_end) if found else [])
            )
        }
        if end_ms >= horizon:
            for s in source.select(matchers, horizon, end_ms):
                key = tuple(sorted(s.labels.items()))
                old = merged.get(key)
                merged[key] = (
                    s
                    if old is None
                    else SeriesSamples(
                        s.labels,
                        np.concatenate([old.ts, s.ts]),
                        np.concatenate([old.values, s.values]),
                    )
                )
        return [merged[key] for key in sorted(merged)]


def decode_read_request(body: bytes) -> list[tuple[int, int, list[Matcher]]]:
    """(start ms, end ms, matchers) per query of a snappy-compressed ReadRequest; a body that
    is not one is a 400 naming what is wrong."""
    from metricvault.wire.proto.messages import DecodeError
    from metricvault.wire.proto.remote_read import MATCHER_OPS, ReadRequest

    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam's DecompressionError
        raise InputError(
            f"remote read body is not snappy block-compressed ({len(body)} bytes): {exc}"
        ) from None
    try:
        request = ReadRequest.FromString(raw)
    except DecodeError as exc:
        raise InputError(f"remote read body is not a prometheus.ReadRequest: {exc}") from None
    queries = []
    for query in request.queries:
        try:
            matchers = [Matcher(m.name, MATCHER_OPS[m.type], m.value) for m in query.matchers]
        except SelectorError as exc:
            raise InputError(f"remote read matcher refused: {exc}") from None
        queries.append((query.start_timestamp_ms, query.end_timestamp_ms, matchers))
    return queries
