"""The agent's ``/metrics``: Prometheus text or OpenMetrics (by the scraper's Accept header),
optionally over TLS and behind basic auth / bearer tokens (stored as SHA-256 digests, compared
in constant time — the same credentials tables as the gateway's).

A small ``http.server`` rather than an ASGI stack: the agent runs on every GPU host under a
60 MB memory budget, and a scrape is one GET.
"""

from __future__ import annotations

import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from metricvault.config import Settings
from metricvault.credentials import authenticate
from metricvault.errors import AuthError

log = logging.getLogger("metricvault.agent")


class MetricsServer:
    """Serves ``registry`` at ``/metrics`` on ``host:port`` (port 0: any free port)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        settings: Settings | None = None,
        tls_cert: str = "",
        tls_key: str = "",
    ) -> None:
        handler = _handler(registry, settings)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls_cert:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls_cert, tls_key or None)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"{self.scheme}://{name}:{port}/metrics"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(
    registry: CollectorRegistry, settings: Settings | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "metricvault-agent"

        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/-/healthy", "/"):
                self._send(200, b"metricvault agent: scrape /metrics\n", "text/plain")
                return
            if self.path.split("?")[0] != "/metrics":
                self._send(404, b"not found: scrape /metrics\n", "text/plain")
                return
            if settings is not None:
                try:
                    authenticate(settings, self.headers.get("Authorization"))
                except AuthError as exc:
                    self._send(
                        401,
                        f"{exc.message}\n".encode(),
                        "text/plain",
                        {"WWW-Authenticate": 'Basic realm="metricvault agent"'},
                    )
                    return
            # Both formats type dcgm-exporter's counters `counter` under their own names
            # (no `_total`, see collect/sources/_labels.py): strict OpenMetrics wants
            # `<name>_total` samples, but renaming would break every dashboard, and typing them
            # `unknown` made Prometheus forward "unknown" metadata, which stored them as
            # gauges. Prometheus's OpenMetrics parser takes the bare name with the type.
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(registry), content_type)

        def _send(
            self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
