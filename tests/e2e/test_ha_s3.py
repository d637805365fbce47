"""The HA election on an ``s3://`` vault (a real moto S3 server): gateways on different
machines (each its own state directory) share one election through conditional PUTs
(``If-None-Match: *``), so two that fail over at once elect one replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.server.ha import HATracker
from metricvault.store.layout import HA_DIR, open_location
from tests.clocks import Clocks

from .conftest import S3Server

pytestmark = pytest.mark.e2e


def gateways(server: S3Server, bucket: str, tmp_path: Path, clock: Clocks) -> list[HATracker]:
    trackers = []
    for name in ("a", "b"):
        settings = Settings(
            s3_endpoint=server.endpoint,
            state_dir=str(tmp_path / name),
            ha_failover_timeout="30s",
            ha_update_timeout="15s",
            ha_cache_ttl="1h",  # each gateway's copy goes stale: only the vault is shared
        )
        location = open_location(f"s3://{bucket}/vault", settings)
        trackers.append(HATracker(location, settings, clock=clock.monotonic))
    return trackers


def test_gateways_on_an_s3_vault_share_one_election(s3_server, s3_bucket, tmp_path):
    clock = Clocks()
    a, b = gateways(s3_server, s3_bucket, tmp_path, clock)
    assert a.elected("", "c1", "r1") == "r1"
    assert b.elected("", "c1", "r2") == "r1"  # b reads a's record from the bucket
    clock[0] += 31  # r1 went silent
    # both see r1 expired at once; one conditional PUT wins, the other follows it
    assert a.elected("", "c1", "r2") == "r2"
    assert b.elected("", "c1", "r3") == "r2"
    assert a.failovers + b.failovers == 1
    # b's cached copy named r1 (expired): it re-read the bucket instead of dropping r2
    assert b.elected("", "c1", "r2") == "r2"
    keys = [
        obj["Key"]
        for obj in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]
        if obj["Key"].startswith(f"vault/{HA_DIR}/")
    ]
    assert len(keys) == 2 and all(key.endswith(".json") for key in keys)  # generations 1, 2
