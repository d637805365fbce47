"""Issue 5: a training job that reaches only the gateway — ``metricvault.track(data=URL)``
registers its experiment through ``/api/v1/experiments`` and sends its series with remote_write
into a real ``metricvault serve``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

import metricvault
from metricvault import Vault
from metricvault.errors import ConflictError, InputError, NotFoundError
from metricvault.store.backends.gateway import GatewayVault

pytestmark = pytest.mark.e2e


def test_track_through_the_gateway(gateway, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git repository: no commit is recorded
    gw = gateway()
    with pytest.warns(RuntimeWarning, match="git"):
        run = metricvault.track(
            "remote-r1",
            data=gw.url,
            flops_per_token=6e9,
            gpu="H100-SXM",
            params={"lr": 1e-3},
            flush_interval_s=0.2,
        )
    with run:
        for step in range(20):
            run.log(step, loss=10.0 - step * 0.25, tokens=4096)
    assert run.written > 0 and run.lost == 0 and run.dropped == 0
    registry = GatewayVault(gw.url).experiments
    record = registry.get("remote-r1")
    assert record.end_ms is not None and record.params["lr"] == 1e-3
    assert record.selector == '{experiment="remote-r1"}'
    gw.stop()
    with Vault.open_local(str(gw.data_dir)) as vault:
        loss = vault.query('train_loss{experiment="remote-r1"}', record.start_ms, record.end_ms)
        assert loss["value"].tolist() == [10.0 - s * 0.25 for s in range(20)]
        steps = vault.query('train_step{experiment="remote-r1"}', record.start_ms, record.end_ms)
        assert steps["value"].tolist() == [float(s) for s in range(20)]
        assert len(vault.query('mfu{experiment="remote-r1"}', record.start_ms, record.end_ms))
        assert vault.experiments.get("remote-r1") == record


def test_experiment_endpoints_answer_with_clear_errors(gateway):
    gw = gateway()
    registry = GatewayVault(gw.url).experiments
    created = registry.create("r2", '{job="r2"}', start="2026-01-01", tags=["a", "b"])
    assert created.tags == ("a", "b") and "r2" in registry and registry.ids() == ["r2"]
    with pytest.raises(ConflictError, match="already exists"):
        registry.create("r2", '{job="r2"}')
    with pytest.raises(NotFoundError, match="no experiment 'nope'"):
        registry.get("nope")
    with pytest.raises(InputError, match="looks like a path"):
        registry.create("..", "up")
    with pytest.raises(InputError, match="before it starts"):
        registry.update("r2", end="2025-01-01")
    request = urllib.request.Request(f"{gw.url}/api/v1/experiments", data=b"[1, 2]", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400 and b"JSON object" in refused.value.read()
    with urllib.request.urlopen(f"{gw.url}/api/v1/experiments", timeout=5) as reply:
        assert [r["id"] for r in json.loads(reply.read())] == ["r2"]
