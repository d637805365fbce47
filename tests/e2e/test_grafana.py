"""The Grafana dashboards of deploy/grafana/ against a real ``metricvault serve`` (issue 13).

A vault holds a simulated 2-node cluster over the last 6 hours (``metricvault.sim``, the data
``metricvault demo`` writes), a training run recorded through ``metricvault.track`` on
``node01`` over the last 2 hours, and the gateway's own metrics: Debian's Prometheus scrapes
the gateway's ``/metrics`` and remote-writes them back into it (the set-up docs/grafana.md
describes). The gateway requires a bearer token, which the requests carry the way the
provisioned data source (``deploy/grafana/provisioning/datasources/metricvault.yaml``, with
``METRICVAULT_TOKEN`` from the environment) makes Grafana send it.

``tests/e2e/grafana_requests.py`` rebuilds what Grafana sends (with the Grafana source files it
follows). Every template variable and every panel query, substituted as Grafana substitutes
them, must answer ``success``; the panels whose data this set-up produces must hold data, and
that list is written out below, so a dashboard query that silently matches nothing fails.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from metricvault.credentials import hash_secret

from .conftest import (
    GATEWAY_DEFAULT_SETTINGS,
    GatewayProcess,
    free_port,
    stop_process,
    wait_http_ok,
)
from .grafana_requests import (
    PanelQuery,
    Request,
    dashboards,
    datasource_headers,
    label_values_request,
    load_datasource,
    panel_requests,
)

TOKEN = "grafana-reader-token"
HOURS = 6
# Panels (dashboard file: titles) that must hold data here. The others must answer, and are
# empty for a reason: the simulator has no memory temperature, PCIe replay or ECC counters;
# a healthy gateway drops and rejects nothing.
NON_EMPTY = {
    "gpu-cluster": {
        "GPUs reporting", "Mean GPU utilisation", "Board power", "GPUs with an XID error",
        "GPU utilisation by node", "Power from the energy counter, by node",
        "Hottest GPU by node", "Framebuffer used by node", "Tensor pipe active by node",
        "Busiest GPUs over the time range", "Idle GPUs (utilisation under 10 %)",
    },
    "gpu-node": {
        "GPU utilisation", "SM active", "Board power", "Energy used per interval",
        "GPU temperature", "Framebuffer used", "SM clock (MHz)",
        "Memory copy utilisation and DRAM active", "GPUs of this node",
    },
    "training-run": {
        "Step", "Lowest loss", "Tokens/s", "MFU", "Loss", "Learning rate", "Gradient norm",
        "Throughput", "GPU utilisation on the run's hosts", "Power on the run's hosts",
    },
    "gateway": {
        "Up", "Series in the vault", "Samples waiting in the buffer", "Quarantined buffer batches",
        "Samples received / stored per second", "Request latency p99", "Flush duration p99",
        "Ingest buffer",
    },
}  # fmt: skip


@dataclass
class Stack:
    gateway: GatewayProcess
    source: dict[str, Any]
    headers: dict[str, str]
    start_ms: int
    end_ms: int


def send(gateway: GatewayProcess, request: Request) -> tuple[int, dict[str, Any]]:
    path, body, headers = request.encoded()
    req = urllib.request.Request(
        gateway.url + path, data=body, headers=headers, method=request.method
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, raw, encoding = resp.status, resp.read(), resp.headers.get("Content-Encoding")
    except urllib.error.HTTPError as exc:
        status, raw, encoding = exc.code, exc.read(), exc.headers.get("Content-Encoding")
    if encoding == "gzip":  # Grafana accepts gzip; the gateway may use it
        raw = gzip.decompress(raw)
    return status, json.loads(raw)


def _write_vault(path: Path, now: int) -> None:
    from metricvault import Vault, track
    from metricvault.sim import ClusterSpec, generate
    from metricvault.sim.spec import LLAMA_70B_FLOPS_PER_TOKEN, JobSpec
    from tests.clocks import Clocks

    start = (now - HOURS * 3_600_000) // 60_000 * 60_000
    job = JobSpec("sim-run", (0,), 600, 4 * 3600, LLAMA_70B_FLOPS_PER_TOKEN, 1000.0)
    spec = ClusterSpec(nodes=2, days=HOURS / 24, seed=7, start_ms=start, jobs=(job,))
    with Vault.open_local(str(path)) as vault:
        for chunk in generate(spec):
            vault.write(chunk)
        vault.maintain()
    clocks = Clocks(start_after_ms=-2 * 3_600_000, step_ms=15_000)
    with track("llama-ft-1", data=str(path), git=False, labels={"host": "node01"},
               flops_per_token=LLAMA_70B_FLOPS_PER_TOKEN, gpus=8, gpu="H100-SXM",
               **clocks.kw) as run:  # fmt: skip
        for step in range(1, 400):
            clocks[0] += 15.0
            run.log(step, loss=4.0 / step**0.3, lr=3e-4, grad_norm=1.0 + 1 / step,
                    tokens=step * 600_000)  # fmt: skip


def _start_prometheus(directory: Path, gateway: GatewayProcess) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install -y prometheus")
    port = free_port()
    config = directory / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "metricvault",
                            "static_configs": [{"targets": [f"127.0.0.1:{gateway.port}"]}]}],
        "remote_write": [{"url": f"{gateway.url}/api/v1/write",
                          "authorization": {"credentials": TOKEN},
                          "queue_config": {"batch_send_deadline": "1s"}}],
    }))  # fmt: skip
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.remote.flush-deadline=1s"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
        )  # fmt: skip
    wait_http_ok(f"http://127.0.0.1:{port}/-/ready", proc, log_path, "prometheus")
    return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("grafana")
    now = int(time.time() * 1000)
    _write_vault(directory / "vault", now)
    config = directory / "metricvault.toml"
    config.write_text(f'[[auth_bearer_tokens]]\nsha256 = "{hash_secret(TOKEN)}"\n')

    class Gateway(GatewayProcess):
        def command(self) -> list[str]:
            return [*super().command(), "--config", str(config)]

    gateway = Gateway(
        data_dir=directory / "vault",
        port=free_port(),
        log_path=directory / "gateway.log",
        settings=GATEWAY_DEFAULT_SETTINGS,
    )
    gateway.start()
    prometheus = _start_prometheus(directory, gateway)
    try:
        source = load_datasource({"METRICVAULT_URL": gateway.url, "METRICVAULT_TOKEN": TOKEN})
        assert source["url"] == gateway.url
        headers = datasource_headers(source)
        # Scraped, remote-written back, flushed, and long enough that the last 20 s step a
        # dashboard aligns to sees two samples of each counter in its 1 m rate window.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            aligned = str(int(time.time()) // 20 * 20)
            exprs = (
                "rate(metricvault_samples_received_total[1m])",
                "rate(metricvault_flush_duration_seconds_count[1m])",
            )
            probes = [Request("POST", "/api/v1/query", [("query", e), ("time", aligned)], headers)
                      for e in exprs]  # fmt: skip
            if all(send(gateway, probe)[1]["data"]["result"] for probe in probes):
                break
            time.sleep(1)
        yield Stack(gateway, source, headers, now - HOURS * 3_600_000, int(time.time() * 1000))
    finally:
        stop_process(prometheus, timeout=20)
        gateway.stop_gracefully()


def _variables(stack: Stack, board: dict[str, Any], log: list[Request]) -> dict[str, Any]:
    """Resolve the dashboard's variables in order, as Grafana does on load (chained ones see
    the values before them): all values for include-all variables, the first otherwise."""
    values: dict[str, tuple[list[str], bool]] = {}
    for var in board["templating"]["list"]:
        request, _ = label_values_request(var["query"]["query"], stack.start_ms / 1000,
                                          stack.end_ms / 1000, stack.headers, values)  # fmt: skip
        status, reply = send(stack.gateway, request)
        log.append(request)
        assert status == 200 and reply["status"] == "success", (var["name"], request, reply)
        assert reply["data"], f"variable {var['name']} ({var['query']['query']}) lists nothing"
        multi = bool(var.get("multi") or var.get("includeAll"))
        values[var["name"]] = (reply["data"] if var.get("includeAll") else reply["data"][:1],
                               multi)  # fmt: skip
    return values


def _queries(stack: Stack, log: list[Request]) -> list[tuple[PanelQuery, int, dict[str, Any]]]:
    out = []
    for name, board in dashboards().items():
        variables = _variables(stack, board, log)
        for query in panel_requests(board, name, stack.start_ms, stack.end_ms, variables,
                                    stack.source, stack.headers):  # fmt: skip
            status, reply = send(stack.gateway, query.request)
            log.append(query.request)
            out.append((query, status, reply))
    return out


def test_every_dashboard_query_answers_and_the_expected_panels_hold_data(
    stack: Stack,
) -> None:
    answered = _queries(stack, [])
    failures = [f"{q.dashboard} / {q.panel} [{q.ref}] {q.expr}: {status} {reply}"
                for q, status, reply in answered
                if status != 200 or reply.get("status") != "success"]  # fmt: skip
    assert not failures, "\n".join(failures)
    holding: dict[str, set[str]] = {}
    for query, _, reply in answered:
        if reply["data"]["result"]:
            holding.setdefault(query.dashboard, set()).add(query.panel)
    assert holding == NON_EMPTY, {
        name: {"empty but expected": sorted(NON_EMPTY[name] - holding.get(name, set())),
               "holding but not listed": sorted(holding.get(name, set()) - NON_EMPTY[name])}
        for name in NON_EMPTY
    }  # fmt: skip
    assert len(answered) >= 40


def test_grafana_dashboard_load_request_sequence(stack: Stack) -> None:
    """The requests Grafana's data source makes when a dashboard opens, in order: buildinfo
    (it reads the version to pick features), the label names for the query editor
    (``POST api/v1/labels`` with ``match[]`` and the time range), the variables' label values
    (GET), the series behind the metrics browser (``POST api/v1/series``), then one
    ``POST api/v1/query_range`` or ``api/v1/query`` form per panel target."""
    start, end = f"{stack.start_ms / 1000:.3f}", f"{stack.end_ms / 1000:.3f}"
    first = [
        Request("GET", "/api/v1/status/buildinfo", [], stack.headers),
        Request("POST", "/api/v1/labels",
                [("match[]", "DCGM_FI_DEV_GPU_UTIL"), ("start", start), ("end", end)],
                stack.headers),
        Request("POST", "/api/v1/labels", [("start", start), ("end", end)], stack.headers),
        Request("GET", "/api/v1/label/__name__/values", [("start", start), ("end", end)],
                stack.headers),
        Request("POST", "/api/v1/series",
                [("match[]", 'DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}'), ("start", start),
                 ("end", end)], stack.headers),
        Request("GET", "/api/v1/metadata", [], stack.headers),
    ]  # fmt: skip
    answers = [send(stack.gateway, r) for r in first]
    assert all(s == 200 and a["status"] == "success" for s, a in answers), answers
    info, labels, all_labels, names, series, metadata = (a["data"] for _, a in answers)
    assert info["version"] == stack.source["jsonData"]["prometheusVersion"]
    assert {"Hostname", "gpu", "UUID", "modelName", "__name__"} <= set(labels)
    assert "experiment" in all_labels and "experiment" not in labels  # match[] narrows
    assert {"DCGM_FI_DEV_GPU_UTIL", "train_loss", "metricvault_series"} <= set(names)
    assert len(series) == 8 and {s["Hostname"] for s in series} == {"node01"}
    assert metadata["metricvault_samples_received_total"][0]["type"] == "counter"
    log: list[Request] = []
    panels = _queries(stack, log)
    assert all(s == 200 for _, s, _ in panels)
    # what Grafana puts on the wire, checked on what was sent
    for request in log:
        if "/label/" in request.path:
            assert request.method == "GET"
        else:
            assert request.method == "POST" and request.encoded()[1]
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    steps = {dict(r.params).get("step") for r in log if r.path.endswith("query_range")}
    assert steps == {"20"}, steps  # 6 h / 1000 points = 21.6 s, RoundInterval: 20 s
    assert all(dict(r.params)["timeout"] == "60s" for r in log if "query" in r.path)
    # and without the token: refused in Prometheus's shape, so Grafana shows the reason
    status, reply = send(stack.gateway, Request("POST", "/api/v1/query", [("query", "up")]))
    assert status == 401 and reply["status"] == "error"


# ------------------------------------------------------------------ 90 days over 3 days of raw
LONG_DAYS = 90
LONG_NON_EMPTY = {  # the dashboards whose data the simulator and track() make
    "gpu-cluster": NON_EMPTY["gpu-cluster"],
    "gpu-node": NON_EMPTY["gpu-node"],
    "training-run": NON_EMPTY["training-run"],
}


@pytest.fixture(scope="module")
def long_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One simulated node over 90 days at 5 min, a training run 60 days ago, and raw
    retention of 3 days applied: everything older is in the 1m/1h rows only."""
    from metricvault import Vault, track
    from metricvault.sim import ClusterSpec, generate
    from metricvault.sim.spec import LLAMA_70B_FLOPS_PER_TOKEN, JobSpec
    from tests.clocks import Clocks

    directory = tmp_path_factory.mktemp("grafana_long")
    now = int(time.time() * 1000)
    days_s = LONG_DAYS * 86_400
    job = JobSpec("sim-run", (0,), days_s // 3, days_s // 3, LLAMA_70B_FLOPS_PER_TOKEN, 1000.0)
    spec = ClusterSpec.ending_at(now, LONG_DAYS, nodes=1, interval_s=300, seed=7, jobs=(job,))
    path = directory / "vault"
    with Vault.open_local(str(path), retention_raw="3d") as vault:
        for chunk in generate(spec):
            vault.write(chunk)
    clocks = Clocks(start_after_ms=-60 * 86_400_000, step_ms=300_000)
    with track("llama-ft-1", data=str(path), git=False, labels={"host": "node01"},
               flops_per_token=LLAMA_70B_FLOPS_PER_TOKEN, gpus=8, gpu="H100-SXM",
               **clocks.kw) as run:  # fmt: skip
        for step in range(1, 200):
            clocks[0] += 300.0
            run.log(step, loss=4.0 / step**0.3, lr=3e-4, grad_norm=1.0 + 1 / step,
                    tokens=step * 600_000)  # fmt: skip
    with Vault.open_local(str(path), retention_raw="3d") as vault:
        vault.maintain()
        assert vault.catalog_version().raw_horizon_ms > now - 4 * 86_400_000
    config = directory / "metricvault.toml"
    config.write_text(f'retention_raw = "3d"\n[[auth_bearer_tokens]]\n'
                      f'sha256 = "{hash_secret(TOKEN)}"\n')  # fmt: skip

    class Gateway(GatewayProcess):
        def command(self) -> list[str]:
            return [*super().command(), "--config", str(config)]

    gateway = Gateway(data_dir=path, port=free_port(), log_path=directory / "gateway.log",
                      settings=GATEWAY_DEFAULT_SETTINGS)  # fmt: skip
    gateway.start()
    try:
        source = load_datasource({"METRICVAULT_URL": gateway.url, "METRICVAULT_TOKEN": TOKEN})
        # "now" is a minute after the last sample (a 5 min scrape leaves the instant panels
        # outside the 5 min lookback at the wall clock's now)
        end = spec.end_ms - spec.interval_s * 1000 + 60_000
        yield Stack(gateway, source, datasource_headers(source),
                    end - LONG_DAYS * 86_400_000, end)  # fmt: skip
    finally:
        gateway.stop_gracefully()


def test_every_panel_shows_data_on_90_days_over_3_days_of_raw_retention(
    long_stack: Stack,
) -> None:
    answered = []
    for name, board in dashboards().items():
        if name not in LONG_NON_EMPTY:
            continue
        variables = _variables(long_stack, board, [])
        for query in panel_requests(board, name, long_stack.start_ms, long_stack.end_ms,
                                    variables, long_stack.source, long_stack.headers):  # fmt: skip
            answered.append((query, *send(long_stack.gateway, query.request)))
    failures = [f"{q.dashboard} / {q.panel}: {status} {reply}" for q, status, reply in answered
                if status != 200 or reply.get("status") != "success"]  # fmt: skip
    assert not failures, "\n".join(failures)
    holding: dict[str, set[str]] = {}
    for query, _, reply in answered:
        if reply["data"]["result"]:
            holding.setdefault(query.dashboard, set()).add(query.panel)
    assert holding == LONG_NON_EMPTY, {
        name: sorted(LONG_NON_EMPTY[name] - holding.get(name, set())) for name in LONG_NON_EMPTY
    }
