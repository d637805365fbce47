"""``POST /v1/metrics``: OpenTelemetry metrics (OTLP/HTTP, protobuf or JSON) into the vault.

After decoding (``protocols/otlp.py``) a request takes exactly the remote-write path
(``Gateway.store_decoded``): the same authentication, tenants, limits, self-metrics (protocol
``otlp``) and durability (200 only once the samples are in the durable buffer). Replies follow
the OTLP/HTTP spec: 200 with an ``ExportMetricsServiceResponse`` in the request's content type
(``partial_success`` counts the data points left out, and says why), and for a refused request
its status (400, 401, 413, 415, 429/503 with Retry-After) with a ``google.rpc.Status`` body.

DELTA points are added up per stream in this worker (``otlp_streams``); requests that carry
them are stored one at a time, so two of them never add to the same total at once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metricvault.credentials import Principal
from metricvault.ingest.protocols.otlp import (
    OtlpDecoded,
    OtlpStreams,
    decode_otlp,
    response_body,
    status_body,
    to_write,
)
from metricvault.ingest.protocols.otlp_body import PROTOBUF, media_type
from metricvault.server.api import ServerAPI
from metricvault.store.vault import Vault

if TYPE_CHECKING:
    from metricvault.ingest.protocols.otlp_streams import Pending
    from metricvault.ingest.protocols.remote_write_columns import DecodedWrite
    from metricvault.server.app import Gateway

ENDPOINT = "/v1/metrics"


class OtlpRoutes(ServerAPI):
    name = "otlp"
    summary = "`POST /v1/metrics` (OpenTelemetry OTLP/HTTP, protobuf or JSON)"

    def routes(self, gateway: Gateway) -> list[Route]:
        return [Route(ENDPOINT, OtlpAPI(gateway).export, methods=["POST"])]


API = OtlpRoutes()


class OtlpAPI:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.streams = OtlpStreams()
        self.delta_lock = asyncio.Lock()

    async def export(self, request: Request) -> Response:
        response = await self.gateway.handle(request, ENDPOINT, self.work)
        if response.status_code < 400:
            return response
        # a refusal, worded by the gateway: the same message as a google.rpc.Status
        kind = media_type(request.headers.get("content-type")) or PROTOBUF
        message = bytes(response.body).decode("utf-8", "replace").rstrip("\n")
        headers = {
            name: value
            for name, value in response.headers.items()
            if name.lower() not in ("content-type", "content-length")
        }
        return Response(
            status_body(response.status_code, message, kind),
            response.status_code,
            headers=headers,
            media_type=kind,
        )

    async def work(self, request: Request, who: Principal) -> Response:
        gateway = self.gateway
        body = await gateway.body(request)
        decoded, left = await gateway.in_write_thread(self.decode_and_store, body, request, who)
        if decoded.has_deltas:
            async with self.delta_lock:  # totals are read, stored and committed in turn
                left = await run_in_threadpool(self._prepare, decoded, who)
                await self._store(*left, who)
        elif left is not None:  # applied to the streams, not stored: the general store
            await self._store(*left, who)
        if decoded.points.rejected:
            gateway.metrics.rejected.labels("otlp_data_point").inc(decoded.points.rejected)
        content = response_body(
            decoded.points.rejected, decoded.error_message(), decoded.content_type
        )
        return Response(content, 200, media_type=decoded.content_type)

    def decode_and_store(
        self, body: bytes, request: Request, who: Principal
    ) -> tuple[OtlpDecoded, tuple[DecodedWrite, Pending] | None]:
        """Decode, and (without delta sums) store the request on the same worker thread: one
        hop. Returns what is left to store, if the gateway's resolved path did not take it."""
        gateway = self.gateway
        decoded = decode_otlp(
            body,
            content_type=request.headers.get("content-type"),
            content_encoding=request.headers.get("content-encoding"),
            max_decoded_bytes=gateway.settings.max_body_bytes,
            **gateway.decode_limits(),
        )
        if decoded.has_deltas:
            return decoded, None
        write, pending = self._prepare(decoded, who)
        if self.gateway.store_known(write, who, "otlp") is None:  # a tenant's, or not a Vault
            return decoded, (write, pending)
        pending.commit()  # only now: a refused request changes no stream
        return decoded, None

    def _prepare(self, decoded: OtlpDecoded, who: Principal) -> tuple[DecodedWrite, Pending]:
        """The request's write (the streams' zero samples and delta totals added) and what
        the streams remember once it is stored (blocking: a worker thread)."""
        vault = self.gateway.vault
        pending = self.streams.apply(decoded.points, who.tenant, vault.min_writable_ms())
        # the kinds new series get, as Vault.write decides them (a known kind stands)
        known_kind = vault.index.kind_of_metric if isinstance(vault, Vault) else None
        return to_write(decoded, known_kind), pending

    async def _store(self, write: DecodedWrite, pending: Pending, who: Principal) -> None:
        await self.gateway.store_decoded(write, who, "otlp")
        pending.commit()  # only now: a refused request changes no stream
