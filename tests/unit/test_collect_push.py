"""The agent's push mode: encoding, the on-disk spool, delivery with retries, the clock offset.

PushClient runs against a tiny scripted HTTP server (``http.server`` in a thread on 127.0.0.1);
the real gateway is in tests/e2e/test_agent_push.py. Every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cramjam
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from metricvault import __version__, prometheus_config
from metricvault.collect import push
from metricvault.collect.agent import AGENT_JOB, AgentOptions, target_labels
from metricvault.collect.push import (
    SERVER_TIME_HEADER,
    PushClient,
    SampleTuple,
    encode_write_request,
    estimate_clock_offset,
    samples_from_registry,
)
from metricvault.collect.spool import Spool
from metricvault.errors import SpoolLockedError
from metricvault.ingest.protocols.remote_write import decode_remote_write
from metricvault.wire.proto import messages

WAIT_S = 5.0
FAST = {"min_backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 2.0}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def decode(body: bytes) -> list[tuple[str, dict[str, str], int, float]]:
    """Rows of a body through the gateway's own decoder: (metric, labels, ts, value)."""
    table = decode_remote_write(
        body,
        content_type="application/x-protobuf",
        content_encoding="snappy",
        version_header="0.1.0",
    ).table
    rows = []
    for row in table.to_pylist():
        metric, ts, value = row.pop("metric"), row.pop("timestamp"), row.pop("value")
        rows.append((metric, {k: v for k, v in row.items() if v is not None}, ts, value))
    return rows


def raw_request(body: bytes) -> Any:
    return messages.WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))


def batch(r: int, n: int = 3) -> list[SampleTuple]:
    """Request ``r``: ``n`` series at timestamp ``r``, value ``r``."""
    return [("mv_push_test", {"series": f"s{s}"}, r, float(r)) for s in range(n)]


def request_ids(bodies: list[bytes]) -> list[int]:
    return [decode(body)[0][2] for body in bodies]


def metric_values(client: PushClient) -> dict[str, float]:
    """Every sample of the client's self-metrics as ``{'name{k=v,...}': value}``."""
    out = {}
    for family in client.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


# --------------------------------------------------------------------------- fake gateway
class FakeGateway:
    """POST /api/v1/write answered from ``script`` ((status, headers, text), then 204 when it
    runs out), recording each body; empty requests (the client's endpoint probes) are answered
    from ``probe_script`` (then 204) and recorded in ``probes`` instead; GET /-/healthy with
    ``skew_s`` added to the server time in SERVER_TIME_HEADER (None: no such header, only
    Date)."""

    def __init__(self, port: int = 0, skew_s: float | None = 0.0) -> None:
        self.script: list[tuple[int, dict[str, str], str]] = []
        self.probe_script: list[tuple[int, dict[str, str], str]] = []
        self.probes: list[dict[str, str]] = []  # the headers of each empty request
        self.bodies: list[bytes] = []  # every POST body, in arrival order
        self.stored: list[bytes] = []  # those answered 2xx
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []
        self.skew_s = skew_s
        self.close_after_response = False  # drop keep-alive connections without saying so
        self.require_auth: str | None = None  # the Authorization header to accept (else 401)
        self.lock = threading.Lock()
        self.connections: list[socket.socket] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/write"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for conn in self.connections:  # keep-alive connections would outlive the listener
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def fake(self) -> FakeGateway:
        return self.server.fake  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        self.fake.connections.append(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        fake = self.fake
        if fake.require_auth is not None and self.headers.get("Authorization") != fake.require_auth:
            with fake.lock:
                fake.bodies.append(body)
                fake.headers.append(dict(self.headers.items()))
            self.answer(401, {}, "unknown bearer token")
            return
        if body == push.EMPTY_REQUEST:
            with fake.lock:
                fake.probes.append(dict(self.headers.items()))
                answer = fake.probe_script.pop(0) if fake.probe_script else (204, {}, "")
            self.answer(*answer)
            return
        with fake.lock:
            status, headers, text = fake.script.pop(0) if fake.script else (204, {}, "")
            fake.bodies.append(body)
            fake.headers.append(dict(self.headers.items()))
            fake.times.append(time.monotonic())
            if 200 <= status < 300:
                fake.stored.append(body)
        self.answer(status, headers, text)

    def do_GET(self) -> None:
        headers = {}
        if self.fake.skew_s is not None:
            headers[SERVER_TIME_HEADER] = str(round((time.time() + self.fake.skew_s) * 1000))
        self.answer(200, headers, "healthy\n")

    def answer(self, status: int, headers: dict[str, str], text: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        data = text.encode()
        if status != 204:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if status != 204:
            self.wfile.write(data)
        if self.fake.close_after_response:
            self.close_connection = True


@pytest.fixture
def fake() -> Iterator[FakeGateway]:
    server = FakeGateway()
    yield server
    server.stop()


@pytest.fixture
def clients() -> Iterator[list[PushClient]]:
    """PushClients to stop at the end of a test, whatever happened."""
    started: list[PushClient] = []
    yield started
    for client in started:
        client.stop(flush_timeout_s=0)
        client.spool.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- encoding
SAMPLES: list[SampleTuple] = [
    ("DCGM_FI_DEV_GPU_UTIL", {"Hostname": "node01", "gpu": "0", "UUID": "GPU-a"}, 2_000, 97.5),
    ("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "UUID": "GPU-a", "Hostname": "node01"}, 1_000, 12.0),
    ("DCGM_FI_DEV_GPU_UTIL", {"Hostname": "node01", "gpu": "1", "UUID": "GPU-b"}, 1_000, 0.25),
    ("train:loss", {"run": "llama", "step_kind": "train"}, 1_700_000_000_123, 1.0e-300),
    ("up", {}, -5, -0.0),
    ("train:loss", {"run": "llama", "step_kind": "train"}, 1_700_000_000_000, 2.5),
]


def canonical(rows: Any) -> list[tuple[str, tuple[tuple[str, str], ...], int, float, float]]:
    """Order-free rows; the sign of the value too (-0.0 == 0.0 would hide a lost sign)."""
    return sorted(
        (m, tuple(sorted(labels.items())), t, v, math.copysign(1, v)) for m, labels, t, v in rows
    )


def test_encode_round_trips_through_the_gateway_decoder() -> None:
    assert canonical(decode(encode_write_request(SAMPLES))) == canonical(SAMPLES)


def test_encode_groups_series_sorts_labels_by_name_and_samples_by_time() -> None:
    request = raw_request(encode_write_request(SAMPLES))
    assert len(request.timeseries) == 4  # one per distinct label set, first appearance order
    first = request.timeseries[0]
    names = [label.name for label in first.labels]
    # byte order, as the spec requires and the gateway checks: upper case before __name__
    assert names == ["Hostname", "UUID", "__name__", "gpu"]
    assert [s.timestamp for s in first.samples] == [1_000, 2_000]
    assert [s.timestamp for s in request.timeseries[2].samples] == [
        1_700_000_000_000,
        1_700_000_000_123,
    ]
    assert [label.name for label in request.timeseries[3].labels] == ["__name__"]


def test_encode_leaves_out_empty_label_values_and_keeps_non_finite_values() -> None:
    body = encode_write_request([("g", {"a": "", "b": "x"}, 1, math.nan), ("g", {"b": "x"}, 2, 1)])
    request = raw_request(body)
    assert len(request.timeseries) == 1
    assert [label.name for label in request.timeseries[0].labels] == ["__name__", "b"]
    assert math.isnan(request.timeseries[0].samples[0].value)


@pytest.mark.parametrize(
    ("metric", "labels"),
    [("bad-name", {}), ("ok", {"__name__": "x"}), ("ok", {"value": "1"}), ("ok", {"1a": "x"})],
)
def test_encode_refuses_names_the_gateway_would_refuse(metric: str, labels: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="invalid"):
        encode_write_request([(metric, labels, 1, 1.0)])


def test_empty_request_is_valid() -> None:
    body = encode_write_request([])
    assert raw_request(body).timeseries == []


class TimestampedCollector:
    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("mv_own_time", "has its own timestamp", labels=["k"])
        family.add_metric(["v"], 3.0, timestamp=1_234.5678)
        yield family


def test_samples_from_registry() -> None:
    registry = CollectorRegistry()
    Counter("mv_requests", "help", ["code"], registry=registry).labels("200").inc(3)
    Histogram("mv_latency_seconds", "help", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    Gauge("mv_broken", "help", registry=registry).set(math.inf)
    Gauge("mv_nan", "help", registry=registry).set(math.nan)
    Gauge("mv_job_created", "a gauge that only looks like a _created", registry=registry).set(7)
    registry.register(TimestampedCollector())

    samples = samples_from_registry(registry, now_ms=5_000, extra_labels={"host": "n1"})

    got = {(m, tuple(sorted(labels.items())), t, v) for m, labels, t, v in samples}
    host = ("host", "n1")
    assert got == {
        ("mv_requests_total", (("code", "200"), host), 5_000, 3.0),
        ("mv_latency_seconds_bucket", (host, ("le", "0.1")), 5_000, 0.0),
        ("mv_latency_seconds_bucket", (host, ("le", "1.0")), 5_000, 1.0),
        ("mv_latency_seconds_bucket", (host, ("le", "+Inf")), 5_000, 1.0),
        ("mv_latency_seconds_count", (host,), 5_000, 1.0),
        ("mv_latency_seconds_sum", (host,), 5_000, 0.5),
        ("mv_job_created", (host,), 5_000, 7.0),
        ("mv_own_time", (host, ("k", "v")), 1_234_568, 3.0),
    }
    assert samples.non_finite == 2
    assert len(decode(encode_write_request(samples))) == len(samples)


def test_extra_labels_win_and_the_sample_label_is_kept_as_exported() -> None:
    registry = CollectorRegistry()
    Gauge("mv_g", "help", ["host"], registry=registry).labels("inner").set(1)
    [(_, labels, _, _)] = samples_from_registry(registry, 1, {"host": "outer"})
    assert dict(labels) == {"host": "outer", "exported_host": "inner"}


@pytest.mark.parametrize(
    ("listen", "instance", "expected"),
    [
        ("127.0.0.1:9400", "", "node01:9400"),
        ("0.0.0.0:9500", "", "node01:9500"),
        ("[::]:9401", "", "node01:9401"),
        ("127.0.0.1:9400", "10.0.0.7:9400", "10.0.0.7:9400"),
    ],
)
def test_pushed_series_get_the_labels_of_a_scrape_and_keep_their_own_hostname(
    listen: str, instance: str, expected: str
) -> None:
    """A push adds what Prometheus adds to a scraped target (job, instance), so a GPU's own
    Hostname is neither renamed to exported_Hostname nor added twice."""
    opts = AgentOptions(listen=listen, hostname="node01", instance=instance)
    registry = CollectorRegistry()
    Gauge("DCGM_FI_DEV_GPU_UTIL", "u", ["gpu", "Hostname"], registry=registry).labels(
        "0", "node01"
    ).set(50)
    [(_, labels, _, _)] = samples_from_registry(registry, 1, target_labels(opts))
    assert dict(labels) == {
        "gpu": "0",
        "Hostname": "node01",
        "job": AGENT_JOB,
        "instance": expected,
    }


def test_the_pushed_job_is_the_scrape_job_prometheus_config_writes() -> None:
    assert f"job_name: {AGENT_JOB}" in prometheus_config.fragment("http://gw:9201", ["n:9400"])


# --------------------------------------------------------------------------- spool
def append(spool: Spool, body: bytes, samples: int = 0) -> int:
    seq = spool.append(body, samples)
    assert seq is not None
    return seq


def test_spool_is_a_fifo_that_survives_reopening(tmp_path: Path) -> None:
    with Spool(tmp_path, 1 << 20) as spool:
        seqs = [append(spool, f"body{i}".encode(), samples=i + 1) for i in range(4)]
        assert seqs == sorted(seqs)
        assert (spool.count, spool.size_bytes, spool.samples) == (4, 20, 10)
        head = spool.peek()
        assert head == (seqs[0], b"body0")
        assert spool.peek() == head  # peek does not remove
        assert spool.ack(seqs[0]) == 1
        (tmp_path / "0000000000000099-3.rw.tmp").write_bytes(b"half written")  # a crash
    with Spool(tmp_path, 1 << 20) as spool:
        assert spool.count == 3 and spool.samples == 9
        for i, seq in enumerate(seqs[1:], start=1):
            assert spool.peek() == (seq, f"body{i}".encode())
            assert spool.ack(seq) == i + 1
        assert spool.peek() is None and spool.size_bytes == 0
        assert append(spool, b"later") > seqs[-1]  # numbers keep increasing
    assert not list(tmp_path.glob("*.tmp"))


def test_spool_drops_the_oldest_when_full_and_counts_it_persistently(tmp_path: Path) -> None:
    with Spool(tmp_path, 100) as spool:
        for i in range(5):
            spool.append(bytes([i]) * 30, samples=10 + i)
        # 5 x 30 bytes into 100: the two oldest went
        assert spool.count == 3 and spool.size_bytes == 90
        assert spool.peek() is not None and spool.peek()[1] == bytes([2]) * 30  # type: ignore[index]
        assert (spool.dropped_requests, spool.dropped_samples) == (2, 10 + 11)
        assert spool.append(b"x" * 101, samples=50) is None  # bigger than the spool
        assert (spool.dropped_requests, spool.dropped_samples) == (3, 71)
        assert spool.count == 3  # nothing evicted for a body that can never fit
    with Spool(tmp_path, 100) as spool:
        assert (spool.dropped_requests, spool.dropped_samples) == (3, 71)
        seq, _ = spool.peek()  # type: ignore[misc]
        spool.append(b"y" * 100, samples=1)  # evicts the whole queue
        assert spool.ack(seq) == 0  # already evicted: acking it is harmless
        assert spool.count == 1 and spool.dropped_requests == 6


def test_one_spool_directory_per_agent(tmp_path: Path) -> None:
    with Spool(tmp_path, 100), pytest.raises(SpoolLockedError):
        Spool(tmp_path, 100)
    Spool(tmp_path, 100).close()  # released on close


# --------------------------------------------------------------------------- push client
def new_client(clients: list[PushClient], url: str, directory: Path, **options: Any) -> PushClient:
    options = {**FAST, "clock_check_interval_s": None, **options}
    client = PushClient(url, Spool(directory, 1 << 20), **options)
    clients.append(client)
    return client


def test_push_delivers_in_order_with_the_remote_write_headers(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    client = new_client(clients, fake.url, tmp_path, bearer_token="s3cret", headers={"X-A": "1"})
    for r in range(3):
        client.submit(batch(r))
    client.start()
    for r in range(3, 6):
        client.submit(batch(r))
    wait_for(lambda: client.sent_requests == 6, "6 requests delivered")
    assert request_ids(fake.bodies) == list(range(6))
    assert decode(fake.bodies[0]) == [(m, dict(la), t, v) for m, la, t, v in batch(0)]
    headers = fake.headers[0]
    assert headers["Content-Encoding"] == "snappy"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"
    assert headers["User-Agent"] == f"metricvault-agent/{__version__}"
    assert headers["Authorization"] == "Bearer s3cret" and headers["X-A"] == "1"
    assert (client.sent_samples, client.failed_attempts, client.rejected_requests) == (18, 0, 0)
    assert client.stop(flush_timeout_s=1) and client.spool.count == 0
    metrics = metric_values(client)
    assert metrics["metricvault_agent_push_sent_samples_total"] == 18
    assert metrics["metricvault_agent_push_sent_requests_total"] == 6
    assert metrics["metricvault_agent_push_spool_requests"] == 0
    assert metrics["metricvault_agent_spool_dropped_samples_total"] == 0
    assert "metricvault_agent_clock_offset_seconds" not in metrics  # never estimated


def test_503_with_retry_after_is_retried_after_that_long(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    fake.script = [(503, {"Retry-After": "1"}, "busy"), (429, {}, "slow down")]
    client = new_client(clients, fake.url, tmp_path)
    client.start()
    client.submit(batch(0))
    client.submit(batch(1))
    wait_for(lambda: client.sent_requests == 2, "both delivered")
    assert request_ids(fake.bodies) == [0, 0, 0, 1]  # the same body again until stored
    assert fake.bodies[0] == fake.bodies[1] == fake.bodies[2]
    assert fake.times[1] - fake.times[0] >= 0.95  # Retry-After honoured
    assert fake.times[2] - fake.times[1] < 0.5  # 429 without Retry-After: backoff
    assert client.failed_attempts == 2 and client.rejected_requests == 0


def test_400_is_dropped_logged_and_counted(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path, caplog: Any
) -> None:
    fake.script = [(400, {}, "series #0 up{}: label 'b' comes after 'c'")]
    client = new_client(clients, fake.url, tmp_path)
    client.submit(batch(0, n=4))
    client.submit(batch(1))
    with caplog.at_level(logging.ERROR, logger="metricvault.agent.push"):
        client.start()
        wait_for(lambda: client.sent_requests == 1, "the second request delivered")
    assert request_ids(fake.bodies) == [0, 1]  # the refused one is not re-sent
    assert (client.rejected_requests, client.rejected_samples, client.failed_attempts) == (1, 4, 0)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "HTTP 400" in record.getMessage() and "comes after 'c'" in record.getMessage()
    metrics = metric_values(client)
    assert metrics["metricvault_agent_push_rejected_requests_total"] == 1


def test_gateway_down_then_back_delivers_everything_in_order(
    clients: list[PushClient], tmp_path: Path
) -> None:
    port = free_port()
    client = new_client(clients, f"http://127.0.0.1:{port}/api/v1/write", tmp_path)
    client.start()
    for r in range(5):
        client.submit(batch(r))
    wait_for(lambda: client.failed_attempts >= 3, "connection refused, retried")
    assert client.spool.count == 5 and client.sent_requests == 0
    server = FakeGateway(port=port)
    try:
        for r in range(5, 8):
            client.submit(batch(r))
        # The sender acks the spool before it counts the request: wait for the count itself.
        wait_for(lambda: client.sent_samples == 24, "every sample counted as sent")
        assert client.spool.count == 0
        assert request_ids(server.stored) == list(range(8))
    finally:
        server.stop()


def test_stop_leaves_the_rest_spooled_for_the_next_agent_run(
    clients: list[PushClient], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1/write"
    first = new_client(clients, url, tmp_path)
    first.start()
    for r in range(3):
        first.submit(batch(r))
    # stop() gives up after its flush timeout (no gateway listens): it returns False, within a
    # bound that fails by timeout rather than by a measured duration.
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(first.stop(flush_timeout_s=0.3)))
    stopper.start()
    stopper.join(30)
    assert stopped == [False], "stop() did not give up after its flush timeout"  # tried, failed
    first.spool.close()
    clients.remove(first)
    server = FakeGateway(port=port)
    try:
        second = new_client(clients, url, tmp_path)
        assert second.spool.count == 3
        second.submit(batch(3))
        second.start()
        wait_for(lambda: second.spool.count == 0, "the old spool delivered")
        assert request_ids(server.stored) == [0, 1, 2, 3]
    finally:
        server.stop()


def test_a_connection_the_server_dropped_while_idle_is_not_a_failure(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    fake.close_after_response = True  # closes without "Connection: close"
    client = new_client(clients, fake.url, tmp_path)
    client.start()
    for r in range(3):
        client.submit(batch(r))
        wait_for(partial(sent_at_least, client, r + 1), f"request {r} delivered")
    assert client.failed_attempts == 0 and request_ids(fake.bodies) == [0, 1, 2]


def sent_at_least(client: PushClient, n: int) -> bool:
    return client.sent_requests >= n


def test_backoff_is_exponential_with_full_jitter_and_bounded(tmp_path: Path) -> None:
    with Spool(tmp_path, 100) as spool:
        client = PushClient(
            "http://127.0.0.1:9/api/v1/write", spool, min_backoff_s=0.1, max_backoff_s=2.0
        )
        for attempt, ceiling in [(0, 0.1), (1, 0.2), (3, 0.8), (10, 2.0), (500, 2.0)]:
            delays = [client._backoff(attempt) for _ in range(200)]
            assert min(delays) >= 0.1 and max(delays) <= ceiling
    assert push._retry_after_s("3") == 3.0
    assert push._retry_after_s("garbage") is None and push._retry_after_s("-1") is None
    assert push._retry_after_s("86400") == push.RETRY_AFTER_CAP_S
    # an HTTP date is read against the clock given (whole seconds: the header has no more)
    now = 1_700_000_000.0
    in_three_s = email.utils.formatdate(now + 3, usegmt=True)
    assert push._retry_after_s(in_three_s, now=now) == 3.0
    assert push._retry_after_s(in_three_s, now=now + 4) is None  # already past


def test_base_url_of_a_write_url() -> None:
    assert push._base_url("https://gw:9201/api/v1/write") == "https://gw:9201"
    assert push._base_url("http://h/prefix/api/v1/write/") == "http://h/prefix"
    assert push._base_url("http://h/receive") == "http://h"


# --------------------------------------------------------------------------- clock
def test_clock_offset_from_the_precise_server_time_header() -> None:
    server = FakeGateway(skew_s=120.0)
    try:
        offset, uncertainty = estimate_clock_offset(server.base)
    finally:
        server.stop()
    # The true skew lies within the stated uncertainty (half the round trip, however slow the
    # machine is), give or take the header's 1 ms rounding.
    assert uncertainty > 0
    assert abs(offset - 120.0) <= uncertainty + 0.001


def test_clock_offset_falls_back_to_the_date_header() -> None:
    server = FakeGateway(skew_s=None)
    try:
        offset, uncertainty = estimate_clock_offset(server.base, samples=2)
    finally:
        server.stop()
    assert uncertainty >= push.DATE_UNCERTAINTY_S
    assert abs(offset) <= uncertainty


@pytest.mark.parametrize(("skew_s", "shifted"), [(120.0, True), (0.2, False)])
def test_push_client_corrects_a_clock_that_is_far_off(
    clients: list[PushClient], tmp_path: Path, skew_s: float, shifted: bool
) -> None:
    server = FakeGateway(skew_s=skew_s)
    try:
        client = new_client(clients, server.url, tmp_path, clock_check_interval_s=60)
        client.start()
        wait_for(lambda: client.clock_offset_s is not None, "a clock estimate")
        client.submit([("mv_clock", {}, 1_000_000, 1.0)])
        wait_for(lambda: client.sent_requests == 1, "delivered")
        [(_, _, ts, _)] = decode(server.stored[0])
    finally:
        server.stop()
    uncertainty = client.clock_uncertainty_s
    assert client.clock_offset_s is not None and uncertainty is not None
    assert abs(client.clock_offset_s - skew_s) <= uncertainty + 0.001
    if shifted:
        assert abs(ts - (1_000_000 + 120_000)) <= (uncertainty + 0.001) * 1000 + 1
        assert client.clock_correction_s == pytest.approx(ts / 1000 - 1_000)
    else:
        assert ts == 1_000_000 and client.clock_correction_s == 0
    metrics = metric_values(client)
    assert abs(metrics["metricvault_agent_clock_offset_seconds"] - skew_s) <= uncertainty + 0.001


# --------------------------------------------------------------------------- issue 10
def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def errors_logged(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("code", [401, 403, 404, 405, 415, 418])
def test_config_errors_keep_the_data_spooled_log_once_and_are_exported(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path, caplog: Any, code: int
) -> None:
    fake.script = [(code, {}, "no")] * 10_000
    fake.probe_script = [(code, {}, "no")]
    client = new_client(clients, fake.url, tmp_path)
    client.submit(batch(0, n=4))
    with caplog.at_level(logging.ERROR, logger="metricvault.agent.push"):
        client.start()
        wait_for(lambda: len(fake.bodies) >= 5, "five attempts")
        assert client.config_error == code and client.spool.count == 1
        metrics = metric_values(client)
        assert metrics[f"metricvault_agent_push_config_error{{code={code}}}"] == 1
        assert metrics["metricvault_agent_push_rejected_requests_total"] == 0
        assert metrics["metricvault_agent_spool_dropped_samples_total"] == 0
        with fake.lock:
            fake.script.clear()  # the operator fixed it
        wait_for(lambda: client.sent_requests == 1, "the kept request delivered")
    [message] = errors_logged(caplog)  # once, however often it was refused
    assert f"HTTP {code}" in message and "Nothing is dropped" in message
    assert client.config_error is None and client.sent_samples == 4
    assert not any(
        k.startswith("metricvault_agent_push_config_error") for k in metric_values(client)
    )


def test_400_drops_the_request_only_when_an_empty_request_passes(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    fake.script = [(400, {}, "series #0: bad label")]
    client = new_client(clients, fake.url, tmp_path)
    client.submit(batch(0, n=4))
    client.submit(batch(1))
    client.start()
    wait_for(lambda: client.sent_requests == 1, "the second request delivered")
    assert request_ids(fake.stored) == [1]
    metrics = metric_values(client)
    assert metrics["metricvault_agent_push_dropped_samples_total{reason=http_400}"] == 4
    assert metrics["metricvault_agent_push_dropped_requests_total{reason=http_400}"] == 1
    assert metrics["metricvault_agent_push_dropped_samples_total{reason=spool_full}"] == 0


def test_a_400_that_an_empty_request_gets_too_keeps_the_data(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    proxy: tuple[int, dict[str, str], str] = (
        400,
        {},
        "The plain HTTP request was sent to HTTPS port",
    )
    fake.script = [proxy] * 3
    fake.probe_script = [proxy] * 4  # the start-up check and one after each 400
    client = new_client(clients, fake.url, tmp_path)
    client.submit(batch(0, n=4))
    client.start()
    wait_for(lambda: client.sent_requests == 1, "delivered once the proxy is fixed")
    assert request_ids(fake.stored) == [0] and client.rejected_requests == 0
    assert client.dropped().get("http_400") is None


def test_bearer_token_file_is_sent_and_reread_on_401(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("wrong-token\n")
    fake.require_auth = "Bearer right-token"
    auth = push.PushAuth(bearer_token_file=token_file)
    client = new_client(clients, fake.url, tmp_path / "spool", auth=auth)
    client.submit(batch(0))
    client.start()
    wait_for(lambda: client.config_error == 401, "the wrong token refused")
    assert client.spool.count == 1 and client.rejected_requests == 0
    token_file.write_text("  right-token \n")  # rotated: no restart needed
    wait_for(lambda: client.sent_requests == 1, "delivered with the re-read token")
    assert fake.headers[-1]["Authorization"] == "Bearer right-token"
    assert "right-token" not in repr(auth) and str(token_file) in repr(auth)


def test_url_userinfo_is_basic_auth_and_never_logged_or_exported(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path, caplog: Any
) -> None:
    fake.require_auth = basic("alice", "p@ss:word")
    url = f"http://alice:p%40ss%3Aword@127.0.0.1:{fake.port}/api/v1/write"
    wrong = f"http://alice:wr0ng-secret@127.0.0.1:{fake.port}/api/v1/write"
    with caplog.at_level(logging.DEBUG, logger="metricvault.agent"):
        refused = new_client(clients, wrong, tmp_path / "a")
        refused.submit(batch(0))
        refused.start()
        wait_for(lambda: refused.config_error == 401, "the wrong password refused")
        client = new_client(clients, url, tmp_path / "b")
        client.submit(batch(0))
        client.start()
        wait_for(lambda: client.sent_requests == 1, "delivered with basic auth")
    assert client.url == fake.url and refused.url == fake.url
    exported = repr(metric_values(client)) + repr(metric_values(refused))
    assert f"url={fake.url}" in exported and "auth=basic" in exported
    for secret in ("p@ss", "p%40ss", "wr0ng-secret", basic("alice", "p@ss:word")[6:]):
        assert secret not in caplog.text and secret not in exported


def test_basic_auth_file_holds_user_colon_password(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path
) -> None:
    secret = tmp_path / "basic"
    secret.write_text("bob:pa:ss\n")
    fake.require_auth = basic("bob", "pa:ss")
    auth = push.PushAuth(basic_auth_file=secret)
    client = new_client(clients, fake.url, tmp_path / "spool", auth=auth)
    client.submit(batch(0))
    client.start()
    wait_for(lambda: client.sent_requests == 1, "delivered with the file's basic auth")


@pytest.mark.parametrize(
    ("content", "error"),
    [("", "is empty"), ("  \n", "is empty"), ("no-colon\n", "user:password")],
)
def test_a_bad_credential_file_is_refused_at_start(
    tmp_path: Path, content: str, error: str
) -> None:
    path = tmp_path / "secret"
    path.write_text(content)
    with pytest.raises(ValueError, match=error):
        push.PushAuth(basic_auth_file=path)
    with pytest.raises(ValueError, match="cannot read"):
        push.PushAuth(bearer_token_file=tmp_path / "missing")
    with pytest.raises(ValueError, match="give exactly one"):
        push.PushAuth(bearer_token="t", basic_auth=("u", "p"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:secret@gw:9201/x", "http://u:***@gw:9201/x"),
        ("https://tok@gw", "https://***@gw"),
        ("http://gw:9201", "http://gw:9201"),
        (
            "influxdb://admin:p%40ss@127.0.0.1:8086/metrics",
            "influxdb://admin:***@127.0.0.1:8086/metrics",
        ),
    ],
)
def test_redact_url_hides_the_password_of_any_url(url: str, shown: str) -> None:
    from metricvault.redact import redact_url

    assert redact_url(url) == shown


def test_start_up_check_reports_a_wrong_endpoint_and_keeps_running(
    fake: FakeGateway, clients: list[PushClient], tmp_path: Path, caplog: Any
) -> None:
    fake.probe_script = [(404, {}, "Not Found")]
    client = new_client(clients, fake.base + "/", tmp_path)
    with caplog.at_level(logging.ERROR, logger="metricvault.agent.push"):
        client.start()
        wait_for(lambda: client.config_error == 404, "the start-up check")
    [message] = errors_logged(caplog)
    assert "nothing receives remote_write" in message and "http://gateway:9201" in message
    client.submit(batch(0))
    wait_for(lambda: client.sent_requests == 1, "delivered once the endpoint answers")
