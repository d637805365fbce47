"""``metricvault agent --profile edge``: the agent for small boxes, push only.

It collects the host source and the GPU source (NVML, or ``--simulate-gpus N`` through the
numpy-free `LightSimulatedGpuSource`) every ``sample_interval_s`` (10 s), keeps the samples,
and every ``push_interval_s`` (30 s) hands them to the push client as one snappy-compressed
remote-write request, which goes through the on-disk spool like the full agent's pushes.
Left out, to stay within ~25 MB of RSS and 1 % of a core: the ``/metrics`` server, the 10 Hz
fast sampler (``*_window_mean``/``_max``), the log watcher, Kubernetes pod labels and
prometheus-client itself (sources build `metricvault.collect.families`; see
``docs/agent.md``). Over http it also never loads ``ssl`` (see `import_http_client`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metricvault import __version__
from metricvault.collect.agent import (
    AgentOptions,
    gpu_sources,
    push_auth,
    push_endpoint,
    target_labels,
)
from metricvault.collect.families import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from metricvault.collect.sources import Source
from metricvault.errors import ConfigError

if TYPE_CHECKING:
    from metricvault.collect.push import PushClient
    from metricvault.wire.remote_write import SampleTuple

log = logging.getLogger("metricvault.agent.edge")

PROFILE = "edge"
PUSH_INTERVAL_S = 30.0
SAMPLE_INTERVAL_S = 10.0
MIN_INTERVAL_S = 0.1
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def edge_sources(opts: AgentOptions) -> tuple[list[Source], str]:
    """The edge profile's sources: the GPU source (light simulator for ``simulate_gpus``) and
    the host source; a log watch is refused (the edge profile has none)."""
    if opts.watch_logs:
        raise ConfigError("--profile edge watches no training logs: leave out --watch-log")
    found, kind = gpu_sources(opts, light=True)
    if opts.host_metrics:
        from metricvault.collect.sources.host import HostSource

        found.append(HostSource())
    return found, kind


def import_http_client(https: bool) -> None:
    """Import ``http.client`` without ``ssl`` unless the push goes over https.

    ``http.client`` imports ``ssl`` when it can, and ``ssl`` maps libssl and libcrypto, ~4 MB
    of RSS that an http push never uses. A ``None`` in ``sys.modules`` makes that one import
    fail, which ``http.client`` accepts (it then has no ``HTTPSConnection``, as on a Python
    built without OpenSSL); the entry is removed afterwards, so a later ``import ssl`` works.
    """
    if https or "http.client" in sys.modules or "ssl" in sys.modules:
        import http.client

        return
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import http.client  # noqa: F401
    finally:
        del sys.modules["ssl"]


class EdgeAgent:
    """The edge profile's collector and pusher (see the module doc)."""

    def __init__(
        self,
        opts: AgentOptions,
        sources: Sequence[Source] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not opts.push_url:
            raise ConfigError("--profile edge only pushes: give --push URL (http://gw:9201)")
        for name, value in (
            ("--sample-interval", opts.sample_interval_s),
            ("--push-interval", opts.push_interval_s),
        ):
            if not value >= MIN_INTERVAL_S:
                raise ConfigError(f"{name} {value:g}: give at least {MIN_INTERVAL_S:g} s")
        self.opts = opts
        # before anything imports metricvault.collect.push (push_endpoint does)
        import_http_client(opts.push_url.lower().startswith("https:"))
        self.push_url = push_endpoint(opts.push_url)
        self.push_auth = push_auth(opts)
        self.state_dir = Path(opts.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if sources is None:
            found, self.gpu_kind = edge_sources(opts)
        else:
            found, self.gpu_kind = list(sources), "given"
        self.sources: list[Source] = found
        self._labels = target_labels(opts)  # as if Prometheus scraped it
        self._clock = clock
        self._pending: list[SampleTuple] = []
        self._collections = 0
        self.pusher: PushClient | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from metricvault.collect.push import PushClient
        from metricvault.collect.spool import Spool

        for source in self.sources:
            starter = getattr(source, "start", None)
            if callable(starter):
                starter()
        spool = Spool(self.state_dir / "spool", self.opts.spool_max_bytes)
        self.pusher = PushClient(
            self.push_url,
            spool,
            auth=self.push_auth,
            correct_clock_above_s=self.opts.clock_bound_s,
        )
        self.pusher.start()
        self._thread = threading.Thread(target=self._run, name="edge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop collecting, push what was collected since the last push, and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.opts.sample_interval_s + 5)
        if self.pusher is not None:
            self.push()
            self.pusher.stop(flush_timeout_s=5.0)
        for source in self.sources:
            source.close()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        interval, every = self.opts.sample_interval_s, self.opts.push_interval_s
        next_collect = self._clock()
        next_push = next_collect + every
        while True:
            self.collect_once()
            now = self._clock()
            if now >= next_push:
                self.push()
                next_push += every * max(1, int((now - next_push) // every) + 1)
            next_collect += interval
            if next_collect < now:  # a suspended machine: carry on from now
                next_collect = now + interval
            if self._stop.wait(max(0.0, next_collect - self._clock())):
                return

    def collect_once(self) -> int:
        """Collect every source once, keeping the samples for the next push; how many."""
        from metricvault.collect.push import samples_from_families

        now_ms = time.time_ns() // 1_000_000
        samples = samples_from_families(self._families(), now_ms, self._labels)
        self._pending.extend(samples)
        self._collections += 1
        return len(samples)

    def push(self) -> None:
        """Submit the collected samples as one request (to the spool, then the gateway)."""
        samples, self._pending = self._pending, []
        if not samples or self.pusher is None:
            return
        try:
            self.pusher.submit(samples)
        except Exception:  # one bad round must not end pushing for the agent's lifetime
            self.pusher.count_dropped("submit_error", 1, len(samples))
            log.exception("a push round failed; its %d samples are dropped", len(samples))

    def _families(self) -> Iterable[Any]:
        for source in self.sources:
            try:
                yield from source.collect()
            except Exception:  # a source must not raise; if one does, the others still count
                log.exception("source %s failed", source.name)
        if self.pusher is not None:
            yield from self.pusher.collect()
        yield from self._own_metrics()

    def _own_metrics(self) -> Iterable[Metric]:
        info = InfoMetricFamily("metricvault_agent", "The metricvault agent")
        info.add_metric(
            [], {"version": __version__, "gpu_source": self.gpu_kind, "profile": PROFILE}
        )
        yield info
        yield CounterMetricFamily(
            "metricvault_agent_collections", "Collections of all sources", value=self._collections
        )
        rss, cpu = _process_usage()
        if rss is not None:
            yield GaugeMetricFamily(
                "process_resident_memory_bytes", "Resident memory size in bytes.", value=rss
            )
        if cpu is not None:
            yield CounterMetricFamily(
                "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                value=cpu,
            )  # fmt: skip


def _process_usage() -> tuple[float | None, float | None]:
    """This process's RSS (bytes) and CPU time (s) from /proc, as prometheus-client's
    process collector exports them; (None, None) where there is no /proc."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None, None
    cpu = (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime + stime
    return float(int(fields[21]) * _PAGE_SIZE), cpu
