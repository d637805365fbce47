"""Issue 5: `metricvault agent --push` end to end — the command itself pushes its GPU (simulated)
and self series into a real gateway, with its host label, and reports its clock offset."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from metricvault import Vault

from .conftest import free_port, stop_process, wait_http_ok

pytestmark = pytest.mark.e2e


def test_agent_push_mode_delivers_its_series(gateway, tmp_path):
    gw = gateway()
    port = free_port()
    log_path = tmp_path / "agent.log"
    command = [
        str(Path(sys.executable).with_name("metricvault")),
        "agent",
        "--simulate-gpus",
        "2",
        "--no-host",
        "--hostname",
        "node42",
        "--listen",
        f"127.0.0.1:{port}",
        "--push",
        f"{gw.url}/api/v1/write",
        "--push-interval",
        "1",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    with open(log_path, "wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", agent, log_path, "agent")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(1)
            if sent_requests(fetch(port)) >= 3:
                break
        else:
            pytest.fail("the agent sent fewer than 3 requests in 30 s:\n" + log_path.read_text())
    finally:
        stop_process(agent)
    gw.stop()
    with Vault.open_local(str(gw.data_dir)) as vault:
        util = vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node42"}', "-10m", "now")
        assert set(util["gpu"]) == {"0", "1"} and set(util["simulated"]) == {"true"}
        assert len(util) >= 6  # 2 GPUs x at least 3 pushes
        assert util["value"].min() >= 0 and util["value"].max() <= 100
        offset = vault.query(
            f'metricvault_agent_clock_offset_seconds{{instance="node42:{port}"}}', "-10m", "now"
        )
        assert len(offset) and offset["value"].abs().max() < 3


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def sent_requests(exposition: str) -> float:
    """The agent's count of pushed requests (it may pass 3 between two polls on a loaded machine,
    so the test reads the number, not one exact line)."""
    for line in exposition.splitlines():
        if line.startswith("metricvault_agent_push_sent_requests_total "):
            return float(line.split()[1])
    return 0.0
