"""``stats()`` and the ``maintain()`` report of an InfluxDB-backed vault, with the keys of the
embedded store's where they mean something (so ``metricvault stats``/``maintain`` print them).

Points and series per policy come from count queries, first/last times from ``first()`` and
``last()``, shards and bytes on disk from ``SHOW SHARDS`` and ``SHOW STATS FOR 'shard'``
(InfluxDB refreshes a shard's ``diskBytes`` about once a minute; without admin rights the
statistics are unavailable and bytes are reported as None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metricvault.durations import HOUR_MS
from metricvault.errors import MetricVaultError
from metricvault.store.backends import influx_meta as meta
from metricvault.store.backends.influx_client import InfluxClient, ident

if TYPE_CHECKING:
    from metricvault.store.backends.influxdb import InfluxVault


def stats(vault: InfluxVault, now: int) -> dict[str, Any]:
    pol = vault.policies
    disk = shard_bytes(vault.client)
    tiers = {
        "raw": tier_stats(vault.client, pol.raw, "value", disk),
        "1m": tier_stats(vault.client, pol.longterm, "count_value", disk),
    }
    markers = meta.read_markers(vault.client, pol.meta)
    pending = meta.pending_since(vault.client, pol.meta)
    complete = min(pending.values(), default=None)
    sizes = [v[1] for v in disk.values() if v[1] is not None]
    return {
        "uri": vault.client.target.uri,
        "backend": "influxdb",
        "series": len(vault.index),
        "snapshot": None,  # InfluxDB keeps no versions
        "tiers": tiers,
        "retention_policies": {"raw": pol.raw, "1m": pol.longterm, "meta": pol.meta},
        "rollup": {
            "pending_hours": len(pending_hours(markers)),
            "pending_markers": len(markers),
            "complete_until": complete,
            "lag_ms": max(0, now - complete) if complete is not None else 0,
        },
        "buffer": {"samples": 0, "bytes": 0, "file_bytes": 0, "last_flush_error": None},
        "stored_bytes": sum(sizes) if sizes else None,
        "raw_horizon": now - pol.raw_ms if pol.raw_ms else None,
    }


def tier_stats(
    client: InfluxClient, rp: str, field: str, disk: dict[str, tuple[int, int | None]]
) -> dict[str, Any]:
    """Points, series, first/last time and bytes of one retention policy."""
    source = f"{ident(rp)}./.*/"
    results = client.query(
        f"SELECT count({ident(field)}) FROM {source} GROUP BY *; "
        f"SELECT first({ident(field)}) FROM {source}; "
        f"SELECT last({ident(field)}) FROM {source}"
    )
    counts = [row[1] for s in results[0].get("series", []) for row in s["values"]]
    firsts = [row[0] for s in results[1].get("series", []) for row in s["values"]]
    lasts = [row[0] for s in results[2].get("series", []) for row in s["values"]]
    rows = int(sum(counts))
    shards, size = disk.get(rp, (0, None))
    return {
        "rp": rp,
        "files": shards,  # shards, the nearest thing to the embedded store's files
        "rows": rows,
        "series": len(counts),
        "bytes": size,
        "bytes_per_row": round(size / rows, 3) if size is not None and rows else None,
        "first": min(firsts, default=None),
        "last": max(lasts, default=None),
    }


def shard_bytes(client: InfluxClient) -> dict[str, tuple[int, int | None]]:
    """Retention policy -> (shards, bytes on disk or None when statistics are not readable)."""
    db = client.target.database
    counts: dict[str, int] = {}
    for series in client.query("SHOW SHARDS", database=False)[0].get("series", []):
        if series.get("name") == db:
            rp_col = series["columns"].index("retention_policy")
            for row in series.get("values", []):
                counts[row[rp_col]] = counts.get(row[rp_col], 0) + 1
    sizes: dict[str, int] = {}
    try:
        results = client.query("SHOW STATS FOR 'shard'", database=False)
    except MetricVaultError:
        return {rp: (n, None) for rp, n in counts.items()}
    for series in results[0].get("series", []):
        tags = series.get("tags", {})
        if tags.get("database") == db and series.get("values"):
            size = int(series["values"][0][series["columns"].index("diskBytes")])
            rp = tags.get("retentionPolicy", "")
            sizes[rp] = sizes.get(rp, 0) + size
    return {rp: (n, sizes.get(rp)) for rp, n in counts.items()}


def pending_hours(markers: list[meta.Marker]) -> set[int]:
    return {h for m in markers for h in range(m.lo // HOUR_MS, m.hi // HOUR_MS + 1)}


def maintenance_report(
    vault: InfluxVault, markers: list[meta.Marker], minutes: int
) -> dict[str, Any]:
    left = meta.read_markers(vault.client, vault.policies.meta)
    return {
        "backend": "influxdb",
        "flushed_samples": 0,  # writes are synchronous: nothing is ever buffered
        "compacted_partitions": 0,  # InfluxDB compacts its shards itself
        "rolled_up_hours": len(pending_hours(markers)),
        "rolled_up_minutes": minutes,
        "markers": len(markers),
        "measurements": len({m.measurement for m in markers}),
        "retention": {},  # InfluxDB applies its retention policies itself
        "expired": {"snapshots": 0, "files": 0},
        "rollup_pending_hours": len(pending_hours(left)),
    }
