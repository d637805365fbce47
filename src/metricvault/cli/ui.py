"""``metricvault ui``: the web UI over a vault, read-only (no ingest endpoints)."""

from __future__ import annotations

import signal
import sys
from typing import Annotated

import typer

from metricvault.cli.common import ConfigOpt, DataOpt, SetOpt, err, load_settings


def ui(
    data: DataOpt = None,
    listen: Annotated[
        str | None, typer.Option("--listen", "-l", help="HOST:PORT (default 127.0.0.1:9202).")
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Serve the web UI (experiments, compare, explore, alerts, vault) over a vault, read-only:
    the UI and the read APIs (the Prometheus query API, GET /api/v1/experiments and the UI's
    JSON), no write endpoints, GET only. Prints the URL to open. The same credentials as
    `metricvault serve` (auth_bearer_tokens, auth_basic_users) apply; a non-loopback --listen
    needs one."""
    import uvicorn

    from metricvault.open import open_store
    from metricvault.protocols import require
    from metricvault.server.app import create_ui_app
    from metricvault.server.auth import check_listener
    from metricvault.server.connections import uvicorn_options
    from metricvault.server.ui_common import freeze_startup_heap

    settings = load_settings(data, config, set_)
    settings = settings.with_overrides(listen=listen or "127.0.0.1:9202")
    check_listener(settings, insecure_no_auth=False)
    vault = open_store(settings.data, settings, create=False)
    for capability in ("read", "experiments"):
        require(vault, capability, settings.data)
    host, _, port = settings.listen.rpartition(":")
    scheme = "https" if settings.tls_cert else "http"
    err.print(f"metricvault ui (read-only) on {settings.data}")
    print(f"open {scheme}://{host}:{port}/", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        app = create_ui_app(vault, settings)
        freeze_startup_heap()
        uvicorn.run(app, **uvicorn_options(settings))
    finally:
        vault.close()
