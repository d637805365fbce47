"""Issue 5: the agent's fast sampler (window mean/max, adaptive rate), its /metrics server
(text and OpenMetrics, auth, TLS) and the agent wired together with a fake source."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from metricvault.collect.agent import Agent, AgentOptions
from metricvault.collect.exposition import MetricsServer

# the agent's own families (prometheus-client-compatible; collect/families.py)
from metricvault.collect.families import GaugeMetricFamily, Metric
from metricvault.collect.sampler import FastSampler, window_families
from metricvault.collect.sources import FastReading
from metricvault.config import BasicUser, Settings
from metricvault.credentials import hash_secret

LABELS = (("Hostname", "node01"), ("gpu", "0"))


class FakeGpu:
    """A source whose utilisation follows a script, one value per reading."""

    name = "fake"

    def __init__(self, values: Sequence[float]) -> None:
        self.values = list(values)
        self.reads = 0

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "util", labels=["Hostname", "gpu"])
        family.add_metric(["node01", "0"], self.values[min(self.reads, len(self.values)) - 1])
        yield family

    def fast_readings(self) -> Sequence[FastReading]:
        value = self.values[min(self.reads, len(self.values) - 1)]
        self.reads += 1
        return [FastReading("DCGM_FI_DEV_GPU_UTIL", LABELS, value)]

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_mean_and_max_cover_only_the_window():
    clock = Clock()
    sampler = FastSampler([FakeGpu([0, 0, 100, 0, 50])], hz=10, clock=clock)
    for _ in range(5):
        sampler.sample_once()
        clock.now += 0.1
    (stat,) = sampler.window(1.0)
    assert (stat.mean, stat.max, stat.samples) == (30.0, 100.0, 5)
    (recent,) = sampler.window(0.25)  # the last two readings only
    assert (recent.mean, recent.max, recent.samples) == (25.0, 50.0, 2)
    clock.now += 10
    assert sampler.window(1.0) == []


def test_a_short_spike_is_neither_missed_nor_inflated():
    """One busy tenth of a second in a 5 s window: max says 100, mean says 2."""
    clock = Clock()
    sampler = FastSampler([FakeGpu([0] * 20 + [100] + [0] * 29)], hz=10, clock=clock)
    for _ in range(50):
        sampler.sample_once()
        clock.now += 0.1
    (stat,) = sampler.window(5.01)  # the 50 readings of the last 5 s
    assert stat.samples == 50 and stat.max == 100 and stat.mean == pytest.approx(2.0)


def test_rate_backs_off_under_load_and_recovers():
    load = {"value": 2.0}
    sampler = FastSampler([FakeGpu([1])], hz=10, min_hz=1, load=lambda: load["value"])
    rates = []
    for _ in range(5):
        sampler._adapt(spent=0.0)
        rates.append(sampler.hz)
    assert rates == [5, 2.5, 1.25, 1, 1]
    load["value"] = 0.1
    for _ in range(5):
        sampler._adapt(spent=0.0)
    assert sampler.hz == 10 and sampler.backoffs == 4
    sampler._adapt(spent=0.05)  # sampling itself costs half its interval: back off too
    assert sampler.hz == 5


def test_window_families_render_as_gauges():
    registry = CollectorRegistry()

    class Collector:
        def collect(self) -> Any:  # prometheus-client's families (the sampler builds them)
            clock = Clock()
            sampler = FastSampler([FakeGpu([10, 30])], clock=clock)
            sampler.sample_once()
            clock.now += 0.1
            sampler.sample_once()
            return window_families(sampler.window(1.0), 1.0)

    registry.register(Collector())
    from prometheus_client import generate_latest

    parsed = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    mean = parsed["metricvault_gpu_util_window_mean"]
    assert mean.type == "gauge" and mean.samples[0].value == 20.0
    assert mean.samples[0].labels == {"Hostname": "node01", "gpu": "0"}
    assert parsed["metricvault_gpu_util_window_max"].samples[0].value == 30.0


def _get(url: str, headers: dict[str, str] | None = None, context=None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FakeGpu([42]))  # type: ignore[arg-type]  # the agent's light families
    return registry


def test_metrics_server_speaks_text_and_openmetrics(registry):
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    try:
        status, kind, body = _get(server.url)
        assert status == 200 and kind.startswith("text/plain") and "DCGM_FI_DEV_GPU_UTIL" in body
        status, kind, body = _get(server.url, {"Accept": "application/openmetrics-text"})
        assert kind.startswith("application/openmetrics-text") and body.endswith("# EOF\n")
        assert _get(server.url.replace("/metrics", "/nope"))[0] == 404
    finally:
        server.stop()


def test_metrics_server_basic_auth(registry):
    settings = Settings(auth_basic_users=(BasicUser("prom", hash_secret("s3cret")),))
    server = MetricsServer(registry, "127.0.0.1", 0, settings=settings)
    server.start()
    try:
        assert _get(server.url)[0] == 401
        bad = base64.b64encode(b"prom:wrong").decode()
        assert _get(server.url, {"Authorization": f"Basic {bad}"})[0] == 401
        good = base64.b64encode(b"prom:s3cret").decode()
        assert _get(server.url, {"Authorization": f"Basic {good}"})[0] == 200
    finally:
        server.stop()


def test_metrics_server_tls(registry, self_signed_cert):
    cert, key = self_signed_cert
    server = MetricsServer(registry, "127.0.0.1", 0, tls_cert=str(cert), tls_key=str(key))
    server.start()
    try:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        assert _get(server.url, context=context)[0] == 200
    finally:
        server.stop()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll until ``condition`` holds; fail (by timeout, not by a measured duration) if not."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.01)


def test_agent_exports_window_statistics_and_self_metrics(tmp_path):
    # The agent's clock is injected: the window is exactly the clock time between scrapes.
    gpu, clock = FakeGpu([10, 90] * 100), Clock()
    opts = AgentOptions(listen="127.0.0.1:0", state_dir=tmp_path, sample_hz=50)
    agent = Agent(opts, sources=[gpu], clock=clock)
    agent.start()
    try:
        assert agent.server is not None
        _wait_for(lambda: gpu.reads >= 4, "four fast readings")
        _get(agent.server.url)
        clock.now += 1.5
        reads = gpu.reads
        _wait_for(lambda: gpu.reads >= reads + 4, "four more fast readings")
        status, _, body = _get(agent.server.url)
        assert status == 200
        parsed = {f.name: f for f in text_string_to_metric_families(body)}
        window = parsed["metricvault_agent_window_seconds"].samples[0].value
        assert window == 1.5, "the window is the time since the previous scrape"
        assert parsed["metricvault_gpu_util_window_max"].samples[0].value == 90
        assert 10 < parsed["metricvault_gpu_util_window_mean"].samples[0].value < 90
        assert parsed["metricvault_agent_sample_rate_hz"].samples[0].value > 0
        assert "process_resident_memory_bytes" in parsed
    finally:
        agent.stop()


class _SlowToClose(FakeGpu):
    def close(self) -> None:
        time.sleep(0.3)
        super().close()


def test_a_slow_step_of_stopping_is_logged_by_name(tmp_path, monkeypatch, caplog):
    import metricvault.collect.agent as agent_module

    monkeypatch.setattr(agent_module, "SLOW_STOP_S", 0.2)
    opts = AgentOptions(listen="127.0.0.1:0", state_dir=tmp_path, sample_hz=50)
    agent = Agent(opts, sources=[_SlowToClose([10, 90] * 100)])
    agent.start()
    began = time.monotonic()
    with caplog.at_level("WARNING", logger="metricvault.agent"):
        agent.stop()
    assert time.monotonic() - began < 10
    slow = [r.getMessage() for r in caplog.records if "stopping the agent" in r.getMessage()]
    assert any("source _SlowToClose took" in m for m in slow), slow


OPENMETRICS = "application/openmetrics-text; version=1.0.0"
DCGM_COUNTERS = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
)


def _exposition_types(body: str) -> tuple[dict[str, str], set[str]]:
    """``# TYPE`` lines and sample names of a text or OpenMetrics page, read line by line (the
    Python OpenMetrics parser refuses counters without ``_total``; Prometheus does not)."""
    types, names = {}, set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return types, names


@pytest.mark.parametrize("accept", ["", "text/plain; version=0.0.4", OPENMETRICS])
def test_dcgm_counters_are_counters_under_their_own_names_in_every_format(accept):
    """dcgm-exporter's counters lack `_total`: every format types them `counter` and keeps
    the names (an `unknown` type made Prometheus forward metadata that stored them as gauges)."""
    from metricvault.collect.sources._labels import METRICS
    from metricvault.collect.sources.simulated import SimulatedGpuSource

    registry = CollectorRegistry()
    registry.register(SimulatedGpuSource(gpus=2, hostname="node01"))  # type: ignore[arg-type]
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    try:
        status, content_type, body = _get(server.url, {"Accept": accept} if accept else None)
    finally:
        server.stop()
    assert status == 200
    assert content_type.startswith("application/openmetrics-text") == (accept == OPENMETRICS)
    types, names = _exposition_types(body)
    exposed_counters = {n for n in DCGM_COUNTERS if n in names}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in exposed_counters
    for name in exposed_counters:
        assert types[name] == "counter", (name, accept)
        assert name + "_total" not in names, "the series keeps dcgm-exporter's name"
    for name, info in METRICS.items():  # every family keeps its declared type
        family = name.removesuffix("_total") if info.kind == "counter" else name
        if family in types:
            assert types[family] == info.kind, (name, accept)
    assert "unknown" not in {types[n] for n in exposed_counters}


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("http://gw:9201", "http://gw:9201/api/v1/write"),
        ("https://gw:9201/", "https://gw:9201/api/v1/write"),
        ("http://gw:9201/api/v1/write", "http://gw:9201/api/v1/write"),
        ("http://vm:8428/api/v1/write", "http://vm:8428/api/v1/write"),
        ("http://gw/prefix/receive", "http://gw/prefix/receive"),
    ],
)
def test_push_endpoint(given, used):
    from metricvault.collect.agent import push_endpoint

    assert push_endpoint(given) == used


@pytest.mark.parametrize("bad", ["gw:9201", "ftp://gw/x", "http://"])
def test_push_endpoint_refuses_what_is_not_an_http_url(bad):
    from metricvault.collect.agent import push_endpoint
    from metricvault.errors import ConfigError

    with pytest.raises(ConfigError, match="not an http"):
        push_endpoint(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--watch-log", "train.log"], "needs at least one --pattern"),
        (["--pattern", "x=y"], "needs a --watch-log"),
        (["--watch-log", "t.log", "--pattern", "nameless"], "NAME=REGEX"),
        (["--gpu", "tpu"], "invalid choice"),
        (["--set", "oops"], "NAME=VALUE"),
        (["--push-bearer-token-file", "token"], "need --push URL"),
    ],
)
def test_agent_command_line_refuses_clearly(argv, message, capsys):
    from metricvault.collect.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_agent_process_imports_neither_typer_nor_pyarrow(tmp_path):
    """The agent runs on every GPU host within 60 MB: `metricvault agent` skips the heavy CLI."""
    code = (
        "import sys\n"
        "from metricvault.collect.cli import _make_agent, build_parser\n"
        "parser = build_parser()\n"
        f"args = parser.parse_args(['--simulate-gpus', '2', '--state-dir', {str(tmp_path)!r}])\n"
        "agent = _make_agent(args, parser)\n"
        "import metricvault.cli\n"
        "heavy = ('typer', 'rich', 'pyarrow', 'pandas', 'duckdb')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- issue 10: push
def test_a_bad_push_url_is_refused_without_showing_its_password():
    from metricvault.collect.agent import push_endpoint
    from metricvault.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        push_endpoint("ftp://ops:hunter2@gw:9201")
    assert "hunter2" not in refused.value.message and "ops:***@gw" in refused.value.message


@pytest.mark.parametrize(
    ("url", "files", "message"),
    [
        ("http://u:p@gw:9201", {"push_bearer_token_file": "token"}, "give one"),
        ("http://gw:9201", {"push_bearer_token_file": "missing"}, "cannot read"),
        (
            "http://gw:9201",
            {"push_bearer_token_file": "token", "push_basic_auth_file": "token"},
            "give exactly one",
        ),
    ],
)
def test_push_credentials_are_checked_before_the_agent_starts(
    tmp_path, monkeypatch, url, files, message
):
    from metricvault.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "token").write_text("t0k3n\n")
    opts = AgentOptions(listen="127.0.0.1:0", state_dir=tmp_path / "state", push_url=url)
    for name, value in files.items():
        setattr(opts, name, tmp_path / value)
    with pytest.raises(ConfigError, match=message):
        Agent(opts, sources=[])


def test_the_gateway_token_variable_is_the_fallback_credential(tmp_path, monkeypatch):
    monkeypatch.setenv("METRICVAULT_GATEWAY_TOKEN", "from-env")
    opts = AgentOptions(listen="127.0.0.1:0", state_dir=tmp_path, push_url="http://gw:9201")
    agent = Agent(opts, sources=[])
    assert agent.push_url == "http://gw:9201/api/v1/write"
    assert agent.push_auth is not None and agent.push_auth.headers() == {
        "Authorization": "Bearer from-env"
    }


class BadThenGood:
    """A source whose first two collections carry a label name remote_write refuses."""

    name = "bad-then-good"

    def __init__(self) -> None:
        self.collections = 0

    def collect(self) -> Iterable[Metric]:
        self.collections += 1
        label = "bad-label" if self.collections <= 2 else "gpu"
        family = GaugeMetricFamily("mv_test_gauge", "test", labels=[label])
        family.add_metric(["0"], 1.0)
        yield family

    def describe(self) -> Iterable[Metric]:
        return []

    def fast_readings(self) -> Sequence[FastReading]:
        return []

    def close(self) -> None:
        pass


def test_a_failing_push_round_does_not_stop_pushing(tmp_path):
    closed = _closed_port()
    opts = AgentOptions(
        listen="127.0.0.1:0",
        state_dir=tmp_path,
        push_url=f"http://127.0.0.1:{closed}",
        push_interval_s=0.05,
    )
    agent = Agent(opts, sources=[BadThenGood()])
    agent.start()
    try:
        assert agent.pusher is not None
        deadline = time.monotonic() + 5
        while agent.pusher.spool.count < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert agent.pusher.spool.count >= 2, "pushing stopped after the failed rounds"
        assert agent.pusher.dropped()["submit_error"][0] == 2
    finally:
        agent.stop()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
