"""Issue 14: `metricvault agent --profile edge` end to end — the command pushes its host and
(simulated) GPU series into a real gateway, several collections per push, and its process never
loads pandas, pyarrow, numpy or DuckDB (nor, pushing over http, OpenSSL)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from metricvault import Vault

from .conftest import http_get, metric_sum, parse_exposition, stop_process

pytestmark = pytest.mark.e2e

# Each of these loads a shared object when imported, so /proc/<pid>/maps shows it; pure-Python
# modules would not (prometheus-client and protobuf are checked in tests/unit/test_collect_edge).
HEAVY = ("/numpy/", "/pandas/", "/pyarrow/", "/duckdb", "libarrow")
SSL = ("libssl", "libcrypto")


def test_the_edge_agent_pushes_host_and_gpu_series_without_the_heavy_imports(gateway, tmp_path):
    gw = gateway()
    log_path = tmp_path / "agent.log"
    command = [
        str(Path(sys.executable).with_name("metricvault")),
        "agent",
        "--profile",
        "edge",
        "--simulate-gpus",
        "2",
        "--hostname",
        "edge01",
        "--push",
        gw.url,
        "--sample-interval",
        "0.3",
        "--push-interval",
        "1",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    with open(log_path, "wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        stored = wait_for_pushes(gw.url, agent, log_path, pushes=3)
        assert stored > 0
        maps = Path(f"/proc/{agent.pid}/maps").read_text()
        loaded = {line.split()[-1] for line in maps.splitlines() if "/" in line}
        assert not [path for path in loaded if any(mark in path for mark in HEAVY)]
        assert not [path for path in loaded if any(mark in path for mark in SSL)]
    finally:
        status = stop_process(agent)
    output = log_path.read_text()
    assert status == 0, output
    assert "--profile edge pushing to" in output and "every 1 s" in output
    gw.stop()
    with Vault.open_local(str(gw.data_dir)) as vault:
        util = vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="edge01"}', "-10m", "now")
        assert set(util["gpu"]) == {"0", "1"} and set(util["simulated"]) == {"true"}
        assert util["value"].min() >= 0 and util["value"].max() <= 100
        # several collections per push: more samples than pushes, ~0.3 s apart
        per_gpu = util[util["gpu"] == "0"].sort_values("timestamp")
        assert len(per_gpu) >= 6
        steps = per_gpu["timestamp"].diff().dropna().dt.total_seconds()
        assert steps.median() == pytest.approx(0.3, abs=0.15)
        load = vault.query('node_load1{instance="edge01:9400"}', "-10m", "now")
        assert len(load) >= 6
        info = vault.query('metricvault_agent_info{instance="edge01:9400"}', "-10m", "now")
        assert set(info["profile"]) == {"edge"} and set(info["gpu_source"]) == {"simulated"}
        rss = vault.query('process_resident_memory_bytes{instance="edge01:9400"}', "-10m", "now")
        assert 5e6 < rss["value"].max() < 200e6


def wait_for_pushes(url: str, agent: subprocess.Popen[bytes], log_path: Path, pushes: int) -> float:
    """Wait (30 s at most) until the gateway's stored-samples counter went up ``pushes``
    times; its value then."""
    deadline = time.monotonic() + 30
    seen: list[float] = []
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            pytest.fail(f"the agent exited with {agent.returncode}:\n{log_path.read_text()}")
        status, body = http_get(f"{url}/metrics")
        stored = metric_sum(parse_exposition(body.decode()), "metricvault_samples_stored_total")
        if status == 200 and stored and (not seen or stored > seen[-1]):
            seen.append(stored)
            if len(seen) >= pushes:
                return stored
        time.sleep(0.2)
    pytest.fail(f"fewer than {pushes} pushes stored in 30 s ({seen}):\n{log_path.read_text()}")
