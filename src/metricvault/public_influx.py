"""The public InfluxDB class: the store's ``InfluxVault`` with the conveniences (its own
module, so opening a local vault never imports the InfluxDB backend)."""

from __future__ import annotations

from metricvault.conveniences import Conveniences
from metricvault.store.backends.influxdb import InfluxVault as _InfluxStore

__all__ = ["InfluxVault"]


class InfluxVault(Conveniences, _InfluxStore):
    """A vault on an InfluxDB 1.x database (the store's
    :class:`metricvault.store.backends.influxdb.InfluxVault` with the conveniences)."""
