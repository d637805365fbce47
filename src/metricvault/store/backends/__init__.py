"""Storage backends other than the embedded store, with the same API as ``Vault``.

- :mod:`metricvault.store.backends.influxdb`: ``InfluxVault`` on InfluxDB 1.x
  (``influxdb://`` and ``influxdbs://`` URIs), retention policies + a continuous query,
  managed by ``metricvault influx setup``. See ``docs/influxdb.md``.

Imported on demand (``Vault.open`` dispatches by URI), so the embedded path loads none of it.
"""

from __future__ import annotations

from metricvault.store.backends.influx_client import is_influx_uri

__all__ = ["is_influx_uri"]
