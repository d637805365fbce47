"""``metricvault agent``: GPU (NVML or simulated), host and log-watcher metrics of one machine,
exposed at ``/metrics`` for Prometheus and optionally pushed to a gateway with remote_write.

The agent imports neither pyarrow nor pandas: it runs on every GPU host within a small memory
and CPU budget (measured in ``bench/agent.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from metricvault import __version__
from metricvault.collect.sources import FastReading, Source
from metricvault.errors import ConfigError, NvmlUnavailable
from metricvault.memory import release_freed_memory

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from metricvault.collect.exposition import MetricsServer
    from metricvault.collect.push import PushAuth, PushClient
    from metricvault.config import Settings

# prometheus-client and the fast sampler are imported where the full agent uses them: the
# edge agent (metricvault.collect.edge) shares this module's options and helpers, not them.

log = logging.getLogger("metricvault.agent")
SLOW_STOP_S = 2.0  # a step of stopping that takes longer is logged

# The scrape job `metricvault prometheus-config --agent` writes. Pushed series carry it, and
# the instance, exactly as Prometheus labels a scraped target: one GPU's series have the same
# label set whichever way they reach the vault.
AGENT_JOB = "metricvault-agent"
DEFAULT_PORT = 9400
NVML_FIX = (
    "Fix: on a GPU host, install the NVIDIA driver (it provides libnvidia-ml.so.1) and "
    "nvidia-ml-py; else run with --gpu auto (host metrics only when NVML is missing) or "
    '--simulate-gpus N (N simulated GPUs, labelled simulated="true")'
)


@dataclass
class AgentOptions:
    """What ``metricvault agent`` is told on its command line."""

    listen: str = "127.0.0.1:9400"
    hostname: str = field(default_factory=socket.gethostname)
    hostname_label: str = "Hostname"  # dcgm-exporter >= 3 writes "Hostname"; older "hostname"
    gpu: str = "auto"  # auto | nvml | none
    simulate_gpus: int = 0
    seed: int = 0
    sample_hz: float = 10.0
    min_sample_hz: float = 1.0
    load_high: float = 0.9
    load_low: float = 0.6
    first_window_s: float = 15.0
    max_window_s: float = 300.0
    push_url: str = ""
    push_bearer_token_file: Path | None = None
    push_basic_auth_file: Path | None = None
    push_interval_s: float = 15.0
    spool_max_bytes: int = 256 * 1024 * 1024
    clock_bound_s: float = 0.5
    state_dir: Path = Path(".metricvault-agent")
    watch_logs: Sequence[tuple[Path, dict[str, str]]] = ()
    tls_cert: str = ""
    tls_key: str = ""
    host_metrics: bool = True
    sample_interval_s: float = 10.0  # the edge profile's collection interval
    kubernetes: str = "auto"  # auto | off: pod labels on GPU series (sources/kubernetes)
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    instance: str = ""  # the pushed instance label; "" is HOSTNAME:PORT of --listen


def target_labels(opts: AgentOptions) -> dict[str, str]:
    """The labels Prometheus adds to every series it scrapes from this agent (``job`` and
    ``instance``, for a target listed as ``HOSTNAME:PORT``); a push adds the same ones, so a
    series' own labels (``Hostname`` included) stay as they are."""
    port = opts.listen.rpartition(":")[2] or str(DEFAULT_PORT)
    return {"job": AGENT_JOB, "instance": opts.instance or f"{opts.hostname}:{port}"}


def gpu_sources(opts: AgentOptions, light: bool = False) -> tuple[list[Source], str]:
    """The GPU source to use and a word saying which (nvml, simulated, none); ``light``
    simulates GPUs without numpy (`LightSimulatedGpuSource`, for the edge agent)."""
    if opts.simulate_gpus and light:
        from metricvault.collect.sources.simulated_light import LightSimulatedGpuSource

        light_sim = LightSimulatedGpuSource(
            gpus=opts.simulate_gpus,
            hostname=opts.hostname,
            seed=opts.seed,
            hostname_label=opts.hostname_label,
        )
        return [light_sim], "simulated"
    if opts.simulate_gpus:
        from metricvault.collect.sources.simulated import SimulatedGpuSource

        sim = SimulatedGpuSource(
            gpus=opts.simulate_gpus,
            hostname=opts.hostname,
            seed=opts.seed,
            hostname_label=opts.hostname_label,
        )
        return [sim], "simulated"
    if opts.gpu == "none":
        return [], "none"
    from metricvault.collect.sources.nvml import NvmlSource

    try:
        return [NvmlSource(hostname=opts.hostname, hostname_label=opts.hostname_label)], "nvml"
    except NvmlUnavailable as exc:
        if opts.gpu == "nvml":
            raise NvmlUnavailable(f"--gpu nvml: {exc.message}. {NVML_FIX}") from exc
        log.warning("no GPU metrics: %s; running host-only (--simulate-gpus N to simulate)", exc)
        return [], "none"


class Agent:
    """Owns the sources, the fast sampler, the HTTP exposition and the push loop."""

    def __init__(
        self,
        opts: AgentOptions,
        settings: Settings | None = None,
        sources: Sequence[Source] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.process_collector import ProcessCollector

        from metricvault.collect.sampler import FastSampler

        self.opts = opts
        self._clock = clock  # monotonic seconds: sampling times and scrape windows (tests inject)
        # a bad URL or credential file stops the agent before anything starts
        self.push_url = push_endpoint(opts.push_url) if opts.push_url else ""
        self.push_auth = push_auth(opts) if opts.push_url else None
        self.settings = settings
        self.state_dir = Path(opts.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if sources is None:
            found, self.gpu_kind = gpu_sources(opts)
            found = _with_pod_labels(found, opts)
            sources = [*found, *self._host_and_logs()]
        else:
            self.gpu_kind = "given"
        self.sources = list(sources)
        self.registry = CollectorRegistry(auto_describe=False)
        for source in self.sources:
            # sources yield light families (collect/families.py): prometheus-client reads
            # them by attribute, only its type hints want its own classes
            self.registry.register(source)  # type: ignore[arg-type]
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        self.sampler = FastSampler(
            self.sources,
            hz=opts.sample_hz,
            min_hz=opts.min_sample_hz,
            load_high=opts.load_high,
            load_low=opts.load_low,
            load=_host_load,
            clock=clock,
        )
        self._last_collect: float | None = None
        self._window_s = opts.first_window_s
        self.server: MetricsServer | None = None
        self.pusher: PushClient | None = None
        self._stop = threading.Event()
        self._push_thread: threading.Thread | None = None

    def _host_and_logs(self) -> list[Source]:
        sources: list[Source] = []
        if self.opts.host_metrics:
            from metricvault.collect.sources.host import HostSource

            sources.append(HostSource())
        if self.opts.watch_logs:
            from metricvault.collect.logwatch import CounterState, LogWatcher

            state = CounterState(self.state_dir / "counters.json")
            for path, patterns in self.opts.watch_logs:
                sources.append(LogWatcher(Path(path), patterns, state))
        return sources

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from metricvault.collect.exposition import MetricsServer

        for source in self.sources:
            starter = getattr(source, "start", None)
            if callable(starter):
                starter()
        self.sampler.start()
        host, _, port = self.opts.listen.rpartition(":")
        self.server = MetricsServer(
            self.registry,
            host.strip("[]") or "127.0.0.1",
            int(port),
            settings=self.settings,
            tls_cert=self.opts.tls_cert,
            tls_key=self.opts.tls_key,
        )
        self.server.start()
        if self.opts.push_url:
            self._start_push()
        # the pages freed after start-up (imports, the simulator's warm-up) go back to the
        # OS: the agent lives for months on every GPU host within a small memory budget
        release_freed_memory()
        log.info("metricvault agent: %s (GPU source: %s)", self.server.url, self.gpu_kind)

    def stop(self) -> None:
        """Stop pushing (what is spooled stays for the next start), serving and sampling.
        Every step is bounded (a process manager's SIGKILL comes ~30 s after its SIGTERM);
        one that takes longer than :data:`SLOW_STOP_S` is logged by name."""
        self._stop.set()
        steps: list[tuple[str, Callable[[], object]]] = []
        if self._push_thread is not None:
            thread = self._push_thread  # its round in progress: collect, spool
            steps.append(("the push round", lambda: thread.join(timeout=5.0)))
        if self.pusher is not None:
            pusher = self.pusher
            steps.append(("the push sender", lambda: pusher.stop(flush_timeout_s=5.0)))
        if self.server is not None:
            steps.append(("the /metrics server", self.server.stop))
        steps.append(("the fast sampler", self.sampler.stop))
        steps += [(f"source {type(s).__name__}", s.close) for s in self.sources]
        for name, step in steps:
            began = time.monotonic()
            step()
            took = time.monotonic() - began
            if took > SLOW_STOP_S:
                log.warning("stopping the agent: %s took %.1f s", name, took)

    # ------------------------------------------------------------------ push
    def _start_push(self) -> None:
        from metricvault.collect.push import PushClient
        from metricvault.collect.spool import Spool

        spool = Spool(self.state_dir / "spool", self.opts.spool_max_bytes)
        self.pusher = PushClient(
            self.push_url,
            spool,
            auth=self.push_auth,
            correct_clock_above_s=self.opts.clock_bound_s,
        )
        self.registry.register(self.pusher)  # type: ignore[arg-type]  # light families
        self.pusher.start()
        self._push_thread = threading.Thread(target=self._push_loop, name="push", daemon=True)
        self._push_thread.start()

    def _push_loop(self) -> None:
        from metricvault.collect.push import samples_from_registry

        labels = target_labels(self.opts)
        failing = False
        while not self._stop.wait(self.opts.push_interval_s):
            now_ms = time.time_ns() // 1_000_000
            assert self.pusher is not None
            samples = samples_from_registry(self.registry, now_ms, labels)
            try:
                self.pusher.submit(samples)
            except Exception:  # one bad round must not end pushing for the agent's lifetime
                self.pusher.count_dropped("submit_error", 1, len(samples))
                if not failing:
                    log.exception("a push round failed; its %d samples are dropped", len(samples))
                failing = True
                continue
            failing = False

    # ------------------------------------------------------------------ own metrics
    def collect(self) -> Iterable[Metric]:
        """Window statistics of the fast sampler and the agent's self-metrics."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        from metricvault.collect.sampler import window_families

        now = self._clock()
        if self._last_collect is not None:
            since = now - self._last_collect
            self._window_s = min(max(since, 2.0 / self.sampler.target_hz), self.opts.max_window_s)
        self._last_collect = now
        yield from window_families(self.sampler.window(self._window_s, now), self._window_s)
        window = GaugeMetricFamily(
            "metricvault_agent_window_seconds",
            "Length of the window the *_window_mean/_max gauges summarise (time since the "
            "previous scrape)",
        )
        window.add_metric([], self._window_s)
        yield window
        rate = GaugeMetricFamily(
            "metricvault_agent_sample_rate_hz",
            "Current internal sampling rate of GPU utilisation and power (backs off under load)",
        )
        rate.add_metric([], self.sampler.hz)
        yield rate
        taken = CounterMetricFamily(
            "metricvault_agent_fast_samples", "High-rate sampling rounds taken"
        )
        taken.add_metric([], self.sampler.samples_taken)
        yield taken
        info = InfoMetricFamily("metricvault_agent", "The metricvault agent")
        info.add_metric(
            [], {"version": __version__, "gpu_source": self.gpu_kind, "profile": "full"}
        )
        yield info

    def describe(self) -> Iterable[Metric]:
        return []

    def fast_readings(self) -> Sequence[FastReading]:
        return []


def push_endpoint(url: str) -> str:
    """The remote_write URL: a bare gateway address (``http://gw:9201``) gets the gateway's
    ``/api/v1/write``; anything else is taken as given (another receiver's path)."""
    from urllib.parse import urlsplit

    from metricvault.redact import redact_url

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--push {redact_url(url)!r} is not an http(s) URL: give the gateway's address, "
            "e.g. http://gateway:9201 (its /api/v1/write is used) or a full remote_write URL"
        )
    return url.rstrip("/") + "/api/v1/write" if parts.path in ("", "/") else url


def push_auth(opts: AgentOptions) -> PushAuth | None:
    """The push credentials: a token file, a basic-auth file or the URL's user:password (one
    of them), else a bearer token from ``METRICVAULT_GATEWAY_TOKEN``, else none. None means
    "the URL's userinfo" (the push client takes it out of the URL)."""
    import os

    from metricvault.collect.push import PushAuth, split_userinfo

    _, userinfo = split_userinfo(opts.push_url)
    files = [opts.push_bearer_token_file, opts.push_basic_auth_file]
    if userinfo is not None and any(f is not None for f in files):
        raise ConfigError(
            "--push carries user:password and a credential file was given too: give one "
            "(a file keeps the password out of the process list)"
        )
    if userinfo is not None:
        return None
    try:
        if any(f is not None for f in files):
            return PushAuth(bearer_token_file=files[0], basic_auth_file=files[1])
        return PushAuth.from_environment(os.environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _with_pod_labels(sources: list[Source], opts: AgentOptions) -> list[Source]:
    """The GPU sources with Kubernetes pod labels (``--kubernetes auto``), or as they are."""
    if opts.kubernetes == "off" or not sources:
        return sources
    from metricvault.collect.sources.kubernetes import with_pod_labels

    try:
        return with_pod_labels(sources, opts.kubernetes, socket=opts.pod_resources_socket)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _host_load() -> float:
    from metricvault.collect.sources.host import host_load

    return float(host_load())
