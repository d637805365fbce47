"""The gateway's HTTP layer: status codes, atomic requests, auth, tenants, limits, self-metrics.

Uses Starlette's in-process test client over a real vault; the real-server tests with
Prometheus, the influx CLI and kill -9 live in tests/e2e/.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cramjam
import pytest

from metricvault.config import BasicUser, BearerToken, Settings
from metricvault.credentials import hash_secret
from metricvault.ingest.protocols.remote_write import decode_remote_write
from metricvault.server.metrics import (
    GatewayMetrics,
    remove_finished_runs,
    run_name,
    runs_directory,
)

# Real Prometheus 2.42 bodies kept in the repository (see its README), so no clone skips them.
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "prometheus_remote_write"
RW1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
T0 = 1_767_225_600_000


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def manifest() -> dict:
    return json.loads(golden("manifest.json"))


def _expected(name: str) -> dict:
    files = manifest()["files"]
    return files[name] if isinstance(files, dict) else next(f for f in files if f["file"] == name)


def test_golden_prometheus_requests_are_stored_exactly(make_client):
    client, vault = make_client()
    total = 0
    for name in ("write-01.bin", "write-02.bin", "write-05.bin", "stale-01.bin"):
        r = client.post("/api/v1/write", content=golden(name), headers=RW1)
        assert r.status_code == 204, r.text
    for name in ("write-01.bin", "write-02.bin", "stale-01.bin"):
        # every sample is stored: staleness markers and NaN samples (e.g. summary quantiles
        # without observations) too (issue 13)
        decoded = decode_remote_write(
            golden(name),
            content_type="application/x-protobuf",
            content_encoding="snappy",
            version_header="0.1.0",
        )
        assert decoded.samples == decoded.table.num_rows == 500
        total += decoded.table.num_rows
    vault.flush()
    assert vault.stats()["tiers"]["raw"]["rows"] == total
    page = client.get("/metrics").text
    assert "metricvault_samples_stored_total" in page
    assert 'reason="stale_marker"' not in page


def test_resending_a_request_stores_nothing_twice(make_client):
    client, vault = make_client()
    body = golden("write-01.bin")
    for _ in range(3):
        assert client.post("/api/v1/write", content=body, headers=RW1).status_code == 204
    vault.maintain(now_ms=None)
    assert vault.stats()["tiers"]["raw"]["rows"] == _expected("write-01.bin")["samples"]


def test_metadata_decides_counter_kind(make_client):
    client, vault = make_client()
    client.post("/api/v1/write", content=golden("write-01.bin"), headers=RW1)
    client.post("/api/v1/write", content=golden("write-05.bin"), headers=RW1)
    kinds = dict(zip(vault.series()["metric"], vault.series()["kind"], strict=False))
    counters = [m for m, k in kinds.items() if k == "counter"]
    assert counters, "metadata marked no series as counter"
    assert kinds.get("go_goroutines", "gauge") == "gauge"


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"\x00garbage", RW1, 400, "the body (8 bytes) is not a valid snappy block"),
        (
            bytes(cramjam.snappy.compress(b"framed")),
            RW1,
            400,
            "the body is a framed snappy stream, but remote-write uses the snappy block format",
        ),
        (
            b"x",
            {**RW1, "Content-Encoding": "gzip"},
            415,
            "Content-Encoding 'gzip' is not supported: remote-write bodies must be snappy",
        ),
        (
            b"x",
            {**RW1, "Content-Type": "application/json"},
            415,
            "Content-Type 'application/json' is not supported",
        ),
        (
            bytes(cramjam.snappy.compress_raw(b"\x0a\x02\x0a\x00")),
            RW1,
            400,
            'series #0 {=""}: invalid label name "": the name is empty; drop the label',
        ),
    ],
)
def test_bad_remote_write_requests_are_refused_and_store_nothing(
    make_client, body, headers, status, message
):
    client, vault = make_client()
    r = client.post("/api/v1/write", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.text.startswith(message), r.text
    assert vault.buffer.depth() == (0, 0)
    assert client.get("/-/healthy").status_code == 200


def test_body_over_the_limit_is_413(make_client):
    client, vault = make_client(max_body_bytes=1000)
    r = client.post("/api/v1/write", content=golden("write-01.bin"), headers=RW1)
    assert r.status_code == 413 and "max_body_bytes" in r.text
    assert vault.buffer.depth() == (0, 0)


def test_line_protocol_v1_v2_gzip_and_partial_writes(make_client):
    client, vault = make_client()
    lines = (
        f"gpu,Hostname=n1,gpu=0 util=97,temp=61i {T0 // 1000}\n"
        f"gpu,Hostname=n1,gpu=1 util=12 {T0 // 1000}\n"
    )
    r = client.post("/write?db=x&precision=s", content=lines)
    assert r.status_code == 204, r.text
    r = client.post(
        "/api/v2/write?org=o&bucket=b&precision=ms",
        content=gzip.compress(f"power,Hostname=n1 watts=612.5 {T0}\n".encode()),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 204, r.text
    r = client.post(
        "/write?precision=s", content=f'log msg="oops" {T0 // 1000}\nm v=1 {T0 // 1000}\n'
    )
    assert r.status_code == 400 and "string field" in r.text
    got = vault.query('{__name__=~"gpu_.*|power_watts|m_v"}', T0, T0 + 1000)
    assert sorted(got["metric"]) == ["gpu_temp", "gpu_util", "gpu_util", "m_v", "power_watts"]
    bad = client.post("/write?precision=s", content="gpu,host=a util=oops\n")
    assert bad.status_code == 400 and "line 1" in bad.text
    assert client.post("/write?precision=fortnight", content="m v=1").status_code == 400


def test_influx_clients_can_ping_and_create_databases(make_client):
    client, _ = make_client()
    assert client.get("/ping").status_code == 204
    r = client.post("/query", data={"q": "CREATE DATABASE metrics"})
    assert r.status_code == 200 and r.json() == {"results": [{"statement_id": 0}]}
    assert client.get("/query", params={"q": "SELECT * FROM x"}).status_code == 400


def test_bearer_and_basic_auth_with_tenants(make_client):
    client, vault = make_client(
        auth_bearer_tokens=(BearerToken(hash_secret("s3cret"), "team-a"),),
        auth_basic_users=(BasicUser("bob", hash_secret("pw"), "team-b"),),
    )
    line = f"m,tenant=forged v=1 {T0}"
    assert client.post("/write?precision=ms", content=line).status_code == 401
    wrong = client.post("/write?precision=ms", content=line, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and "s3cret" not in wrong.text
    ok = client.post(
        "/write?precision=ms", content=line, headers={"Authorization": "Bearer s3cret"}
    )
    assert ok.status_code == 204
    ok = client.post("/write?precision=ms", content=f"m v=2 {T0 + 1}", auth=("bob", "pw"))
    assert ok.status_code == 204
    got = vault.query("m_v", T0, T0 + 10)
    assert got["tenant"].tolist() == ["team-a", "team-b"]  # the payload cannot choose its tenant


def test_new_series_limit_answers_429_with_retry_after(make_client):
    client, vault = make_client(max_new_series_per_minute=3)
    assert client.post("/write?precision=ms", content=f"m,i=0 v=1 {T0}").status_code == 204
    body = "\n".join(f"m,i={i} v=1 {T0}" for i in range(1, 4))
    r = client.post("/write?precision=ms", content=body)
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60
    assert "max_new_series_per_minute" in r.text
    assert vault.buffer.depth()[0] == 1
    # one request of more new series than a minute allows can never succeed: 413, not 429
    body = "\n".join(f"m,j={i} v=1 {T0}" for i in range(4))
    assert client.post("/write?precision=ms", content=body).status_code == 413


def test_backpressure_is_503_with_retry_after(make_client):
    client, _ = make_client(buffer_max_bytes=1, flush_interval="1h")
    assert client.post("/write?precision=ms", content=f"m v=1 {T0}").status_code == 204
    r = client.post("/write?precision=ms", content=f"m v=2 {T0 + 1}")
    assert r.status_code == 503 and "Retry-After" in r.headers


def test_health_ready_and_remote_write_2_headers(make_client):
    client, _ = make_client()
    before = time.time_ns() // 1_000_000
    healthy = client.get("/-/healthy")
    assert healthy.status_code == 200
    server_ms = int(healthy.headers["X-Metricvault-Server-Time-Ms"])  # for agents' clock offset
    assert before <= server_ms <= time.time_ns() // 1_000_000
    assert client.get("/-/ready").status_code == 200


# A gateway worker: joins the run directory of its parent (this test), counts, sets its gauges,
# says where it writes, and waits; "close" stops it as a worker stops, otherwise it is killed.
WORKER = """
import sys
from pathlib import Path
from metricvault.server.metrics import GatewayMetrics
assert "prometheus_client" not in sys.modules  # a worker must import it only once set up
metrics = GatewayMetrics.for_worker(Path(sys.argv[1]))
metrics.stored.labels("influx").inc(int(sys.argv[2]))
metrics.buffer_samples.set(int(sys.argv[3]))
metrics.series.set(int(sys.argv[4]))
print(metrics.multiprocess_dir, flush=True)
sys.stdin.readline()
metrics.close()
"""


def _worker(state: Path, stored: int, buffered: int, series: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", WORKER, str(state), str(stored), str(buffered), str(series)]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _scrape(run_dir: Path) -> dict[str, float]:
    body, _ = GatewayMetrics(run_dir).render()
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in body.decode().splitlines()
        if line.startswith("metricvault_") and "_bucket" not in line
    }


def test_worker_metrics_add_up_over_processes(tmp_path):
    a, b = _worker(tmp_path, 30, 5, 10), _worker(tmp_path, 12, 7, 11)
    assert a.stdout is not None and b.stdout is not None
    try:
        run_dir = Path(a.stdout.readline().strip())
        assert Path(b.stdout.readline().strip()) == run_dir  # one directory per serve run
        assert run_dir == runs_directory(tmp_path) / run_name(os.getpid())
        got = _scrape(run_dir)
        assert got['metricvault_samples_stored_total{protocol="influx"}'] == 42  # summed
        assert got["metricvault_buffer_samples"] == 12  # each worker's own buffer: summed
        assert got["metricvault_series"] == 11  # vault-wide: the highest, not the sum

        b.kill()  # its counts stay; its buffer gauges go with it
        b.wait(timeout=10)
        got = _scrape(run_dir)
        assert got['metricvault_samples_stored_total{protocol="influx"}'] == 42
        assert (got["metricvault_buffer_samples"], got["metricvault_series"]) == (5, 10)
    finally:
        for proc in (a, b):
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()  # the last worker to stop removes the directory
                assert proc.wait(timeout=10) == 0
    assert not run_dir.exists()


def test_directories_of_finished_runs_are_removed(tmp_path):
    runs = tmp_path / "gateway-metrics"
    live = runs / run_name(os.getpid())
    reused_pid = runs / f"{os.getpid()}-1"  # same pid, another start time: a finished run
    for directory in (live, reused_pid, runs / "junk"):
        directory.mkdir(parents=True)
    remove_finished_runs(runs)
    assert list(runs.iterdir()) == [live]
    remove_finished_runs(tmp_path / "missing")  # nothing to do


def test_one_worker_keeps_an_in_process_registry(make_client):
    client, _ = make_client()
    metrics = client.app.state.gateway.metrics
    assert metrics.multiprocess_dir is None and metrics.registry is not None
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    assert client.post("/write?precision=ms", content=f"m v=1 {T0}").status_code == 204
    page = client.get("/metrics").text
    assert 'metricvault_samples_stored_total{protocol="influx"} 1.0' in page
    assert "metricvault_buffer_samples" in page and "metricvault_series 1.0" in page


# --------------------------------------------------------------------------- issue 10
TOKEN_A, TOKEN_B = "token-of-team-a", "token-of-team-b"
AUTH_A = {"Authorization": f"Bearer {TOKEN_A}"}
AUTH_B = {"Authorization": f"Bearer {TOKEN_B}"}
BODY_METHODS = {"POST", "PUT", "PATCH"}
LIMIT = 1000


def _tenant_client(make_client, **overrides):
    return make_client(
        auth_bearer_tokens=(
            BearerToken(hash_secret(TOKEN_A), "team-a"),
            BearerToken(hash_secret(TOKEN_B), "team-b"),
        ),
        **overrides,
    )


def _route_calls(client):
    """(method, concrete path, route path) for every method of every route in the app."""
    from starlette.routing import Route

    for route in client.app.routes:
        assert isinstance(route, Route), route
        path = route.path.replace("{experiment_id}", "some-id")
        for method in sorted(route.methods or ()):
            yield method, path, route.path


def test_every_route_authenticates_or_is_declared_public(make_client):
    from metricvault.server.app import PUBLIC_ROUTES

    client, _ = _tenant_client(make_client)
    checked = 0
    for method, path, route in _route_calls(client):
        r = client.request(method, path, content=b"{}")
        if route in PUBLIC_ROUTES:
            # public routes read no body: they may only be GET/HEAD
            assert method in ("GET", "HEAD"), (method, route)
            assert r.status_code < 400, (method, path, r.status_code)
        else:
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert "WWW-Authenticate" in r.headers
            checked += 1
    assert checked >= 7  # the write, query and experiments routes


def test_every_route_that_reads_a_body_refuses_one_over_max_body_bytes(make_client):
    client, vault = _tenant_client(make_client, max_body_bytes=LIMIT)
    big = b"x" * (LIMIT + 1)
    body_routes = 0
    for method, path, _ in _route_calls(client):
        if method not in BODY_METHODS:
            continue
        body_routes += 1
        declared = client.request(method, path, content=big, headers=AUTH_A)
        assert declared.status_code == 413, (method, path, declared.text)
        assert "max_body_bytes" in declared.text and str(LIMIT) in declared.text

        def chunks():  # no Content-Length: refused while streaming, not after
            for _ in range(LIMIT // 100 + 2):
                yield b"y" * 100

        streamed = client.request(method, path, content=chunks(), headers=AUTH_A)
        assert streamed.status_code == 413, (method, path, streamed.text)
    assert body_routes >= 5
    assert vault.buffer.depth() == (0, 0) and vault.experiments.ids() == []


def test_experiments_are_scoped_to_the_callers_tenant(make_client):
    client, vault = _tenant_client(make_client)
    new = {"id": "run-a", "selector": '{job="train"} or gpu_util{node="n1"}'}
    created = client.post("/api/v1/experiments", json=new, headers=AUTH_A)
    assert created.status_code == 201, created.text
    record = created.json()
    assert record["tenant"] == "team-a"
    assert record["selector"] == (
        '{job="train", tenant="team-a"} or {__name__="gpu_util", node="n1", tenant="team-a"}'
    )
    # tenant B sees nothing of it: not listed, not readable, not changeable; the answer is
    # the one for an id that does not exist (nothing tells B that A has "run-a")
    assert client.get("/api/v1/experiments", headers=AUTH_B).json() == []
    unknown = client.get("/api/v1/experiments/run-x", headers=AUTH_B)
    assert unknown.status_code == 404
    for method in ("GET", "PATCH"):
        r = client.request(method, "/api/v1/experiments/run-a", json={}, headers=AUTH_B)
        assert (r.status_code, r.text) == (404, unknown.text.replace("run-x", "run-a"))
    # tenant A's PATCH of the selector stays confined too
    patched = client.patch(
        "/api/v1/experiments/run-a", json={"selector": '{job="other"}'}, headers=AUTH_A
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["selector"] == '{job="other", tenant="team-a"}'
    assert [e["id"] for e in client.get("/api/v1/experiments", headers=AUTH_A).json()] == ["run-a"]
    # and the confined selector cannot reach team-b's series
    for token, value in ((AUTH_A, 1), (AUTH_B, 2)):
        line = f"m,job=other v={value} {T0}"
        assert client.post("/write?precision=ms", content=line, headers=token).status_code == 204
    got = vault.query(vault.experiments.get("run-a").selector, T0, T0 + 10)
    assert got["value"].tolist() == [1.0]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/v1/experiments", {"id": "r", "selector": "m", "now": 0}, "now"),
        (
            "POST",
            "/api/v1/experiments",
            {"id": "r", "selector": "m", "created_ms": 1},
            "created_ms",
        ),
        ("POST", "/api/v1/experiments", {"id": "r", "selector": "m", "tenant": "b"}, "tenant"),
        ("POST", "/api/v1/experiments", {"id": "r", "selector": 5}, "selector"),
        ("POST", "/api/v1/experiments", {"id": "r", "selector": "m", "tags": "a,b"}, "tags"),
        ("POST", "/api/v1/experiments", {"id": "r", "selector": "m", "start": True}, "start"),
        ("POST", "/api/v1/experiments", {"id": "r", "selector": "m", "params": []}, "params"),
        ("PATCH", "/api/v1/experiments/r0", {"id": "other"}, "id"),
        ("PATCH", "/api/v1/experiments/r0", {"created_ms": 0}, "created_ms"),
        ("PATCH", "/api/v1/experiments/r0", {"notes": ["x"]}, "notes"),
    ],
)
def test_experiment_fields_are_typed_and_unknown_ones_are_400(
    make_client, method, path, body, field
):
    client, vault = _tenant_client(make_client)
    seed = {"id": "r0", "selector": "m"}
    assert client.post("/api/v1/experiments", json=seed, headers=AUTH_A).status_code == 201
    before = vault.experiments.get("r0")
    r = client.request(method, path, json=body, headers=AUTH_A)
    assert r.status_code == 400, r.text
    assert repr(field) in r.text, r.text
    assert vault.experiments.ids() == ["r0"] and vault.experiments.get("r0") == before


def test_query_route_needs_auth_and_bounds_its_body(make_client):
    client, _ = _tenant_client(make_client, max_body_bytes=LIMIT)
    assert client.post("/query", data={"q": "CREATE DATABASE x"}).status_code == 401
    ok = client.post("/query", data={"q": "CREATE DATABASE x"}, headers=AUTH_A)
    assert ok.status_code == 200, ok.text
    big = client.post("/query", content=b"q=" + b"x" * LIMIT, headers=AUTH_A)
    assert big.status_code == 413


@pytest.mark.parametrize(
    ("listen", "credentials", "insecure", "outcome"),
    [
        ("127.0.0.1:9201", False, False, None),
        ("127.0.0.5:9201", False, False, None),
        ("localhost:9201", False, False, None),
        ("[::1]:9201", False, False, None),
        ("0.0.0.0:9201", True, False, None),
        ("0.0.0.0:9201", False, False, "refused"),
        ("[::]:9201", False, False, "refused"),
        ("gpu-gw.example:9201", False, False, "refused"),
        ("0.0.0.0:9201", False, True, "warned"),
    ],
)
def test_open_listener_needs_auth_or_the_insecure_flag(listen, credentials, insecure, outcome):
    from metricvault.errors import ConfigError
    from metricvault.server.auth import check_listener

    tokens = (BearerToken(hash_secret("t")),) if credentials else ()
    settings = Settings.load(env={}, listen=listen, auth_bearer_tokens=tokens)
    if outcome == "refused":
        with pytest.raises(ConfigError, match="--insecure-no-auth") as info:
            check_listener(settings, insecure)
        assert "auth_bearer_tokens" in info.value.message and listen in info.value.message
    else:
        warning = check_listener(settings, insecure)
        assert (warning is not None) == (outcome == "warned"), warning


def test_gateway_connections_send_without_nagle_delay():
    """h11 writes a head and a body separately: with Nagle on, a reused connection waited for
    the client's delayed ACK (~40 ms per answer). Every accepted TCP connection gets
    TCP_NODELAY (checked on a real accepted socket, through the protocol's own hook)."""
    import asyncio
    import socket

    from metricvault.server.connections import _no_delay

    class Transport(asyncio.Transport):
        def __init__(self, sock):
            super().__init__()
            self.sock = sock

        def get_extra_info(self, name, default=None):
            return self.sock if name == "socket" else default

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            _no_delay(Transport(accepted))
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
