"""The write protocols: Prometheus remote_write (``POST /api/v1/write``, 1.0 and 2.0) and
InfluxDB line protocol (``POST /write``, ``POST /api/v2/write``, with the ``/ping`` and the
``/query`` DDL no-ops Influx clients send first).

Each request is decoded completely by a pure decoder (``ingest/protocols/``) and stored in
one transaction (:meth:`Gateway.store_decoded`); the 204 means the samples are durable.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.ingest.protocols.influx_line import decode_line_protocol
from metricvault.ingest.protocols.remote_write import DecodedWrite, decode_remote_write
from metricvault.server.api import ServerAPI
from metricvault.server.ha import HADecision, tracker_for

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

PRECISIONS = {"ns", "n", "us", "u", "ms", "s", "m", "h"}
INFLUX_VERSION = "1.8-metricvault"


class WriteAPI(ServerAPI):
    name = "write"
    summary = (
        "`POST /api/v1/write` (Prometheus remote_write 1.0 and 2.0), `POST /write` and "
        "`POST /api/v2/write` (InfluxDB line protocol; `GET /ping`, `/query` DDL as no-ops)"
    )

    def routes(self, gateway: Gateway) -> list[Route]:
        writes = Writes(gateway)
        return [
            Route("/api/v1/write", writes.remote_write, methods=["POST"]),
            Route("/write", writes.influx_write, methods=["POST"]),
            Route("/api/v2/write", writes.influx_write, methods=["POST"]),
            Route("/ping", influx_ping, methods=["GET", "HEAD"]),
            Route("/query", writes.influx_query, methods=["GET", "POST"]),
        ]


API = WriteAPI()


class Writes:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.ha = tracker_for(gateway.vault, gateway.settings)

    async def remote_write(self, request: Request) -> Response:
        gateway = self.gateway

        def decode_and_store(
            body: bytes, req: Request, who: Principal
        ) -> tuple[DecodedWrite, int | None]:
            """Decode, and store the usual request on the same worker thread (one hop)."""
            decoded = decode_remote_write(
                body,
                content_type=req.headers.get("content-type"),
                content_encoding=req.headers.get("content-encoding"),
                version_header=req.headers.get("x-prometheus-remote-write-version"),
                max_decoded_bytes=gateway.settings.max_body_bytes,
                internal_label=self.ha.replica_label if self.ha.enabled else "",
                **gateway.decode_limits(),
            )
            if self.ha.enabled and decoded.prepared() is None:
                return decoded, None  # it may carry the replica label: the HA filter first
            # a request decoded through the series cache has no series with the replica
            # label (the decoder sends those down the full path): nothing for HA to filter
            return decoded, gateway.store_known(decoded, who, "remote_write")

        async def work(req: Request, who: Principal) -> Response:
            body = await gateway.body(req)
            decoded, stored = await gateway.in_write_thread(decode_and_store, body, req, who)
            if stored is not None:
                return Response(status_code=204, headers=_written_headers(decoded, stored))
            ha = None
            # HA pairs: keep the elected replica's samples. A request decoded through the
            # series cache (prepared) has no series with the replica label (the decoder sends
            # those down the full path), and its table is never built.
            if self.ha.enabled and decoded.prepared() is None and decoded.table.num_rows:
                ha = await run_in_threadpool(self.ha.filter, decoded.table, who.tenant)
                if ha.table is not decoded.table:
                    decoded = dataclasses.replace(decoded, table=ha.table)
            stored = await gateway.store_decoded(decoded, who, "remote_write")
            if ha is not None:  # counted once the request is answered 2xx, never on a retry
                self.count_ha(ha)
            headers = _written_headers(decoded, stored)
            if ha is not None and ha.dropped:  # accepted, not stored: Mimir's 202
                return PlainTextResponse(ha.message(), 202, headers=headers)
            return Response(status_code=204, headers=headers)

        return await gateway.handle(request, "/api/v1/write", work)

    def count_ha(self, ha: HADecision) -> None:
        metrics = self.gateway.metrics
        for (cluster, replica), samples in ha.dropped.items():
            metrics.ha_dropped.labels(cluster, replica).inc(samples)
        for cluster in ha.failovers:
            metrics.ha_failovers.labels(cluster).inc()

    async def influx_write(self, request: Request) -> Response:
        gateway = self.gateway

        async def work(req: Request, who: Principal) -> Response:
            precision = req.query_params.get("precision", "ns")
            if precision not in PRECISIONS:
                return PlainTextResponse(
                    f"precision={precision!r} is not one of {', '.join(sorted(PRECISIONS))}\n", 400
                )
            body = await gateway.body(req)
            decoded = await run_in_threadpool(
                decode_line_protocol,
                body,
                precision=precision,
                content_encoding=req.headers.get("content-encoding"),
                max_decoded_bytes=gateway.settings.max_body_bytes,
                **gateway.decode_limits(),
            )
            gateway.metrics.received.labels("influx").inc(decoded.samples)
            if decoded.table.num_rows:
                await run_in_threadpool(gateway.store, decoded.table, {}, who, "influx")
            if decoded.rejected:
                gateway.metrics.rejected.labels("string_field_line").inc(len(decoded.rejected))
                first = decoded.rejected[0]
                message = (
                    f"partial write: {len(decoded.rejected)} line(s) not stored, e.g. line "
                    f"{first.line}: {first.reason}; all other lines were stored\n"
                )
                return PlainTextResponse(message, 400)
            return Response(status_code=204)

        return await gateway.handle(request, request.url.path, work)

    async def influx_query(self, request: Request) -> Response:
        """Accept the DDL InfluxDB clients send before writing (CREATE DATABASE / RETENTION
        POLICY) as no-ops; metricvault has no databases. Anything else is refused clearly."""
        gateway = self.gateway

        async def work(req: Request, who: Principal) -> Response:
            form = parse_qs((await gateway.body(req)).decode(errors="replace"))
            text = (req.query_params.get("q") or (form.get("q") or [""])[0]).strip()
            statements = [part.strip() for part in text.split(";") if part.strip()]
            if statements and all(_is_ddl(stmt) for stmt in statements):
                results = [{"statement_id": i} for i in range(len(statements))]
                return JSONResponse(
                    {"results": results}, headers={"X-Influxdb-Version": INFLUX_VERSION}
                )
            return JSONResponse(
                {
                    "error": "the metricvault gateway only accepts writes (and CREATE DATABASE/"
                    "RETENTION POLICY as no-ops); read data with 'metricvault query' or "
                    "Vault.query"
                },
                status_code=400,
            )

        return await gateway.handle(request, "/query", work)


async def influx_ping(request: Request) -> Response:
    """InfluxDB clients (the `influx` CLI, Telegraf) ping before writing."""
    return Response(status_code=204, headers={"X-Influxdb-Version": INFLUX_VERSION})


def _written_headers(decoded: DecodedWrite, stored: int) -> dict[str, str]:
    """Remote-write 2.0's response headers: what was written (1.0 has none)."""
    if decoded.version != "2.0":
        return {}
    return {
        "X-Prometheus-Remote-Write-Samples-Written": str(stored),
        "X-Prometheus-Remote-Write-Histograms-Written": "0",
        "X-Prometheus-Remote-Write-Exemplars-Written": "0",
    }


def _is_ddl(statement: str) -> bool:
    words = statement.upper().split()
    return words[:2] in (["CREATE", "DATABASE"], ["CREATE", "RETENTION"])
