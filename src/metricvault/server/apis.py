"""Every API ``metricvault serve`` mounts, in route order. Adding an API is adding a module
that exposes a :class:`~metricvault.server.api.ServerAPI` as ``API``, and its line here."""

from __future__ import annotations

from metricvault.server import (
    alert_delivery,
    experiments_api,
    health_api,
    otlp_api,
    prometheus_api,
    remote_read_api,
    rules_api,
    ui_api,
    upkeep,
    write_api,
)
from metricvault.server.api import ServerAPI

APIS: tuple[ServerAPI, ...] = (
    write_api.API,
    otlp_api.API,
    experiments_api.API,
    health_api.API,
    ui_api.API,  # before prometheus_api, whose /api/v1/{rest} answers not_found
    rules_api.API,  # before prometheus_api, whose /api/v1/{rest} answers not_found
    alert_delivery.API,  # no routes: the rules' alerts to Alertmanager
    prometheus_api.API,
    remote_read_api.API,
    upkeep.API,
)
