"""Issue 5 end to end: Debian's real ``prometheus`` scrapes ``metricvault agent`` (2 simulated
GPUs, host metrics, a watched log), and every sample Prometheus stored equals, bit for bit, what
the agent served in that scrape.

The oracle is a recording proxy between the two: Prometheus scrapes the proxy, which fetches the
agent's page (forwarding Prometheus's Accept header, so OpenMetrics is exercised), keeps the
body with its time, and returns it unchanged. Each sample in Prometheus is then matched to the
recorded scrape it came from (the one closest to its timestamp).
"""

from __future__ import annotations

import http.server
import math
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as text_parse

from .conftest import free_port, stop_process, wait_http_ok

pytestmark = pytest.mark.e2e

JOB = "mv-agent"
CHECKED = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "metricvault_gpu_util_window_mean",
    "metricvault_gpu_util_window_max",
    "node_memory_MemTotal_bytes",
    "metricvault_log_matches_total",
)


class Recorder(http.server.ThreadingHTTPServer):
    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), RecordingHandler)
        self.upstream = upstream
        self.scrapes: list[tuple[float, str, str]] = []  # (time, content type, body)
        self.lock = threading.Lock()


class RecordingHandler(http.server.BaseHTTPRequestHandler):
    server: Recorder

    def do_GET(self) -> None:
        started = time.time()
        request = urllib.request.Request(
            self.server.upstream, headers={"Accept": self.headers.get("Accept", "")}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                body, kind = reply.read(), reply.headers["Content-Type"]
        except OSError:  # the agent is stopping at the end of the test
            self.send_error(503)
            return
        with self.server.lock:
            self.server.scrapes.append((started, kind, body.decode()))
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def served_values(kind: str, body: str) -> dict[tuple[str, frozenset], float]:
    # prometheus-client's OpenMetrics parser refuses a counter family whose samples lack
    # `_total` (dcgm-exporter's names, which the agent keeps, typed counter); Prometheus's own
    # parser takes them. The sample lines read the same in both formats here (the agent
    # writes no exemplars), so its text parser reads OpenMetrics pages too; it names every
    # counter sample `<family>_total`, so a bare name on the page is given back.
    if kind.startswith("application/openmetrics-text"):
        assert body.endswith("# EOF\n"), "an OpenMetrics page ends with # EOF"
    values = {}
    for family in text_parse(body):
        bare = family.type == "counter" and f"\n{family.name}{{" in body
        for sample in family.samples:
            name = family.name if bare and sample.name == family.name + "_total" else sample.name
            values[(name, frozenset(sample.labels.items()))] = sample.value
    return values


def test_prometheus_stores_exactly_what_the_agent_served(tmp_path, prometheus):
    log_file = tmp_path / "train.log"
    log_file.write_text("starting\n")
    port = free_port()
    agent_log = tmp_path / "agent.log"
    command = [
        str(Path(sys.executable).with_name("metricvault")),
        "agent",
        "--listen",
        f"127.0.0.1:{port}",
        "--simulate-gpus",
        "2",
        "--hostname",
        "node07",
        "--state-dir",
        str(tmp_path / "state"),
        "--watch-log",
        str(log_file),
        "--pattern",
        "cuda=CUDA error",
        "--pattern",
        "nan=loss is nan",
    ]
    with open(agent_log, "wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    recorder = Recorder(f"http://127.0.0.1:{port}/metrics")
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", agent, agent_log, "agent")
        prom = prometheus(
            "http://127.0.0.1:9/api/v1/write",  # nothing listens: this test reads Prometheus
            {JOB: [f"127.0.0.1:{recorder.server_address[1]}"]},
        )
        deadline = time.monotonic() + 60
        errors = 0
        while time.monotonic() < deadline and len(recorder.scrapes) < 12:
            with log_file.open("a") as fh:
                fh.write("step 1 ok\nRuntimeError: CUDA error: an illegal memory access\n")
            errors += 1
            time.sleep(1)
        assert len(recorder.scrapes) >= 12, f"Prometheus scraped {len(recorder.scrapes)} times"
        time.sleep(2.5)  # let the watcher and one more scrape see the last lines
        end = time.time()
        stored = prom.api("query", query=f'{{job="{JOB}"}}[5m]', time=f"{end:.3f}")["result"]
    finally:
        stop_process(agent)
        recorder.shutdown()
    with recorder.lock:
        scrapes = [(t, served_values(k, b)) for t, k, b in recorder.scrapes]
    checked = {name: 0 for name in CHECKED}
    for series in stored:
        labels = {k: v for k, v in series["metric"].items() if k not in ("job", "instance")}
        name = labels.pop("__name__")
        if name not in checked:
            continue
        key = (name, frozenset(labels.items()))
        for ts, value in series["values"]:
            when, served = min(scrapes, key=lambda s: abs(s[0] - float(ts)))
            assert abs(when - float(ts)) < 0.5, f"no recorded scrape near {ts} for {key}"
            assert key in served, f"{key} stored by Prometheus but not served at {ts}"
            want = served[key]
            got = float(value)
            assert got == want or (math.isnan(got) and math.isnan(want)), (key, ts, got, want)
            checked[name] += 1
    assert all(n >= 10 for n in checked.values()), checked
    matches = [s for s in stored if s["metric"]["__name__"] == "metricvault_log_matches_total"]
    cuda = next(s for s in matches if s["metric"]["pattern"] == "cuda")
    assert float(cuda["values"][-1][1]) == errors
    assert all(
        s["metric"].get("simulated") == "true"
        for s in stored
        if s["metric"]["__name__"].startswith("DCGM_")
    )
