"""`metricvault serve` with two worker processes: every acknowledged sample is stored once, and
``/metrics`` counts the samples of both workers whichever one answers the scrape."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from metricvault import Vault
from metricvault.server.metrics import runs_directory

from .conftest import GatewayProcess, http_get, metric_sum, parse_exposition

pytestmark = pytest.mark.e2e
T0 = 1_767_225_600_000
STORED = 'metricvault_samples_stored_total{protocol="influx"}'


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
    with Vault.open_local(str(gw.data_dir)) as vault:
        vault.maintain(now_ms=T0 + 86_400_000)
        got = vault.query("load_v", T0, T0 + 60_000)
    assert len(got) == acked
    assert got.groupby(["host", "timestamp"]).size().max() == 1


def _write(gw: GatewayProcess, batch: int, lines: int) -> None:
    """One request on a fresh connection (urllib does not keep connections alive)."""
    ts = int(time.time() * 1000) - 60_000 + batch
    body = "\n".join(f"spread,host=h{i} v={batch} {ts}" for i in range(lines))
    req = urllib.request.Request(f"{gw.url}/write?precision=ms", data=body.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 204


def _stored_by_worker(run_dir: Path) -> dict[int, float]:
    """Samples stored per worker pid, from each worker's own multiprocess file."""
    stored: dict[int, float] = {}
    for path in run_dir.glob("counter_*.db"):
        pid = int(path.stem.rpartition("_")[2])
        for metric in MultiProcessCollector.merge([str(path)]):
            for sample in metric.samples:
                if sample.name == "metricvault_samples_stored_total":
                    stored[pid] = stored.get(pid, 0.0) + sample.value
    return stored


def _scrape(gw: GatewayProcess) -> dict[str, float]:
    status, body = http_get(f"{gw.url}/metrics")
    assert status == 200, body
    return parse_exposition(body.decode())


def test_metrics_add_up_over_workers(gateway):
    gw = gateway(settings=("gateway_workers=2",))
    runs = runs_directory(gw.data_dir / "state")
    lines, sent, batch = 25, 0, 0
    run_dirs: list[Path] = []
    with ThreadPoolExecutor(4) as pool:  # concurrent requests keep both workers busy
        while batch < 400:
            list(pool.map(lambda b: _write(gw, b, lines), range(batch, batch + 40)))
            batch += 40
            sent += 40 * lines
            run_dirs = list(runs.iterdir())
            assert len(run_dirs) == 1, run_dirs
            if len(_stored_by_worker(run_dirs[0])) == 2:
                break
    by_worker = _stored_by_worker(run_dirs[0])
    assert len(by_worker) == 2, f"one worker served all {batch} requests: {by_worker}"
    assert sum(by_worker.values()) == sent

    for _ in range(10):  # fresh connections: both workers answer some of the scrapes
        values = _scrape(gw)
        assert values[STORED] == sent, values
        assert values['metricvault_samples_received_total{protocol="influx"}'] == sent
        assert metric_sum(values, "metricvault_request_duration_seconds_count") == batch
        assert values["metricvault_series"] == lines  # the vault's series, not per worker

    # a killed worker's counts stay in the totals; its buffer gauges leave with it
    killed = min(by_worker)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while any(runs.glob(f"*/gauge_livesum_{killed}.db")) and time.monotonic() < deadline:
        assert _scrape(gw)[STORED] == sent
        time.sleep(0.2)
    assert not any(runs.glob(f"*/gauge_livesum_{killed}.db")), "dead worker's gauges kept"
    assert _scrape(gw)[STORED] == sent

    gw.stop_gracefully()
    assert not runs.exists() or not any(runs.iterdir()), "multiprocess files left behind"
