"""`metricvault serve` with two worker processes: every acknowledged sample is stored once."""

from __future__ import annotations

import urllib.request

import pytest

from metricvault import Vault

pytestmark = pytest.mark.e2e
T0 = 1_767_225_600_000


def test_two_workers_store_every_acknowledged_sample_once(gateway):
    gw = gateway(settings=("gateway_workers=2",))
    acked = 0
    for batch in range(60):
        lines = "\n".join(f"load,host=h{i} v={batch}.5 {T0 + batch * 1000}" for i in range(50))
        req = urllib.request.Request(
            f"{gw.url}/write?precision=ms", data=lines.encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 204
        acked += 50
    gw.stop_gracefully()
    with Vault.open(str(gw.data_dir)) as vault:
        vault.maintain(now_ms=T0 + 86_400_000)
        got = vault.query("load_v", T0, T0 + 60_000)
    assert len(got) == acked
    assert got.groupby(["host", "timestamp"]).size().max() == 1
