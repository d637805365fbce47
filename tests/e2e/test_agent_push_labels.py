"""End to end: one GPU's series carry the same label set whether Prometheus scrapes the agent
(with the scrape job ``metricvault prometheus-config --agent`` writes) and remote-writes them
to a gateway, or the agent pushes them itself (full agent and ``--profile edge``).

Three real gateways, one per path: the full agent's push, the edge agent's push, and a real
Prometheus scraping the full agent. The agents run with ``--hostname localhost`` and
Prometheus scrapes ``localhost:PORT``, so the instance a scrape gets is the one a push uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from metricvault import prometheus_config

from .conftest import free_port, http_get, stop_process, wait_http_ok

pytestmark = pytest.mark.e2e

COMPARED = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "node_memory_MemTotal_bytes")
WAIT_S = 60.0


def label_sets(url: str, metric: str) -> set[frozenset[tuple[str, str]]]:
    query = urllib.parse.urlencode({"match[]": metric, "start": "0", "end": str(time.time() + 60)})
    status, body = http_get(f"{url}/api/v1/series?{query}")
    assert status == 200, body[:300]
    return {frozenset(series.items()) for series in json.loads(body)["data"]}


def wait_for_series(url: str, what: str, procs: list[Any]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"a process exited with {proc.returncode} ({what})"
        found = {metric: label_sets(url, metric) for metric in COMPARED}
        if all(found.values()):
            return found
        time.sleep(0.5)
    pytest.fail(f"{what}: not every one of {COMPARED} arrived in {WAIT_S:.0f} s")


def agent_command(tmp_path: Path, name: str, *args: str) -> list[str]:
    return [
        str(Path(sys.executable).with_name("metricvault")),
        "agent",
        "--simulate-gpus",
        "2",
        "--hostname",
        "localhost",
        "--push-interval",
        "1",
        "--kubernetes",
        "off",
        "--state-dir",
        str(tmp_path / name),
        *args,
    ]


def scrape_jobs(agent_target: str) -> dict[str, list[str]]:
    """The scrape jobs of the fragment `metricvault prometheus-config --agent` writes."""
    doc = yaml.safe_load(prometheus_config.fragment("http://unused:9201", [agent_target]))
    return {job["job_name"]: job["static_configs"][0]["targets"] for job in doc["scrape_configs"]}


def test_pushed_and_scraped_series_of_one_gpu_have_the_same_labels(gateway, prometheus, tmp_path):
    one = ("gateway_workers=1",)  # three gateways on a 2-core machine
    pushed_gw, edge_gw, scraped_gw = (
        gateway(settings=one),
        gateway(settings=one),
        gateway(settings=one),
    )
    port = free_port()
    full = agent_command(tmp_path, "full", "--listen", f"127.0.0.1:{port}", "--push", pushed_gw.url)
    edge = agent_command(
        tmp_path, "edge", "--profile", "edge", "--sample-interval", "0.5",
        "--instance", f"localhost:{port}", "--push", edge_gw.url,
    )  # fmt: skip
    procs = []
    with open(tmp_path / "full.log", "wb") as out:
        procs.append(subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT))
    with open(tmp_path / "edge.log", "wb") as out:
        procs.append(subprocess.Popen(edge, stdout=out, stderr=subprocess.STDOUT))
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", procs[0], tmp_path / "full.log", "agent")
        prometheus(f"{scraped_gw.url}/api/v1/write", scrape_jobs(f"localhost:{port}"))
        scraped = wait_for_series(scraped_gw.url, "scraped by Prometheus", procs)
        pushed = wait_for_series(pushed_gw.url, "pushed by the agent", procs)
        edged = wait_for_series(edge_gw.url, "pushed by the edge agent", procs)
    finally:
        for proc in procs:
            stop_process(proc)
    gpu = scraped["DCGM_FI_DEV_GPU_UTIL"]
    assert len(gpu) == 2 and all(("Hostname", "localhost") in labels for labels in gpu)
    assert all(("instance", f"localhost:{port}") in labels for labels in gpu)
    for metric in COMPARED:
        assert pushed[metric] == scraped[metric], metric
        assert edged[metric] == scraped[metric], metric
