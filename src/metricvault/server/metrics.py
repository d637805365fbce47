"""The gateway's own metrics, exposed at ``/metrics`` in Prometheus text format.

One worker keeps them in a private in-process registry. Several workers (``gateway_workers >
1``) use prometheus-client's multiprocess mode: every worker writes its values to mmap files in
a directory shared by the workers of one ``serve`` run (``<runs>/<run>/``, see
:func:`runs_directory`), and whichever worker answers a scrape merges all the files, so
counters add up over workers.
The directory is named after the ``serve`` process (pid and start time), so a run never sees
another run's files; the last worker to stop removes it, and a worker starting removes those
of runs that are gone (a ``kill -9``).

prometheus-client chooses between in-process and mmap values once, when it is first imported,
from ``PROMETHEUS_MULTIPROC_DIR``; this module therefore imports it lazily, and a worker sets
the variable (:meth:`GatewayMetrics.for_worker`) before that happens.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from metricvault.store.layout import GATEWAY_METRICS_DIR, WORKERS_LOCK

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
RUNS_DIR = GATEWAY_METRICS_DIR  # under the vault's local state directory, or in /dev/shm
SHARED_MEMORY = Path("/dev/shm")
LOCK_NAME = WORKERS_LOCK  # each worker of a run holds a shared flock on it while it runs


class GatewayMetrics:
    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            disable_created_metrics,
        )

        # The *_created companion series only add noise to a scrape of the gateway.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.multiprocess_dir = multiprocess_dir
        self._lock_fd: int | None = None
        # In multiprocess mode the values live in the directory's files, not in a registry; a
        # scrape builds a registry over the files (render).
        self.registry: CollectorRegistry | None = None
        if multiprocess_dir is None:
            self.registry = CollectorRegistry()
        r = self.registry
        self.received: Counter = Counter(
            "metricvault_samples_received",
            "Samples decoded from write requests",
            ["protocol"],
            registry=r,
        )
        self.stored: Counter = Counter(
            "metricvault_samples_stored",
            "Samples acknowledged (durable in the buffer)",
            ["protocol"],
            registry=r,
        )
        self.dropped: Counter = Counter(
            "metricvault_samples_dropped",
            "Samples received but not stored, by reason (histograms; non_finite: NaN, Inf and "
            "stale markers on the InfluxDB backend, which cannot hold them)",
            ["reason"],
            registry=r,
        )
        self.rejected: Counter = Counter(
            "metricvault_requests_rejected", "Requests refused, by reason", ["reason"], registry=r
        )
        # Exposition metadata that changed a metric's kind (applied: the metric reads and rolls
        # up as the new kind from then on) or was refused (it would have downgraded a counter,
        # or overridden `metricvault kind set`); Prometheus re-sends metadata every minute, so
        # a refusal counts again each time. `metricvault kind list` shows the applied ones.
        self.kind_changes: Counter = Counter(
            "metricvault_metric_kind_changes",
            "Metric kind changes exposition metadata asked for, by old and new kind and result "
            "(applied, refused)",
            ["from_kind", "to_kind", "result"],
            registry=r,
        )
        # HA Prometheus pairs (server/ha.py): samples of a replica that is not the elected
        # one of its cluster, answered 202 and not stored (the elected replica's copies are)
        self.ha_dropped: Counter = Counter(
            "metricvault_ha_dropped_samples",
            "Samples of a non-elected HA replica, not stored (the elected replica's are), by "
            "cluster and replica",
            ["cluster", "replica"],
            registry=r,
        )
        self.ha_failovers: Counter = Counter(
            "metricvault_ha_failovers",
            "Elections of another replica of an HA cluster by this gateway (after "
            "ha_failover_timeout without samples from the elected one)",
            ["cluster"],
            registry=r,
        )
        self.duration: Histogram = Histogram(
            "metricvault_request_duration_seconds",
            "Write request latency",
            ["endpoint"],
            registry=r,
        )
        self.flush: Histogram = Histogram(
            "metricvault_flush_duration_seconds", "Time to flush the buffer to Parquet", registry=r
        )
        # Multiprocess modes (ignored with one worker). Each worker has its own ingest buffer,
        # so the samples and bytes waiting are the sum over the running workers ("livesum": a
        # stopped or killed worker's value is dropped; its buffer is flushed by the others).
        self.buffer_samples: Gauge = Gauge(
            "metricvault_buffer_samples",
            "Samples waiting in the ingest buffer",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.buffer_bytes: Gauge = Gauge(
            "metricvault_buffer_bytes",
            "Bytes waiting in the ingest buffer",
            registry=r,
            multiprocess_mode="livesum",
        )
        # The series count is vault-wide: every worker sees (nearly) all series, so summing
        # would count them once per worker; the highest running worker's count is the answer.
        self.series: Gauge = Gauge(
            "metricvault_series",
            "Series known to the vault",
            registry=r,
            multiprocess_mode="livemax",
        )
        # vault-wide too: the files under <state>/quarantine, which every worker counts alike
        self.quarantined: Gauge = Gauge(
            "metricvault_buffer_quarantined_batches",
            "Corrupt ingest-buffer batches moved to <state>/quarantine (docs/operations.md)",
            registry=r,
            multiprocess_mode="livemax",
        )
        # The rule evaluator (server/rules_api.py): one worker holds its lease and counts
        self.rule_failures: Counter = Counter(
            "metricvault_rule_evaluation_failures",
            "Rule evaluations that failed, by group (file;name), as Prometheus's "
            "prometheus_rule_evaluation_failures_total",
            ["rule_group"],
            registry=r,
        )
        self.rule_missed: Counter = Counter(
            "metricvault_rule_group_iterations_missed",
            "Rule group rounds skipped because the evaluator was late",
            registry=r,
        )
        self.rule_leader: Gauge = Gauge(
            "metricvault_rule_evaluator_leader",
            "1 in the worker that holds the rule evaluator lease (the sum over workers is 1)",
            registry=r,
            multiprocess_mode="livesum",
        )
        # Alert delivery (server/alert_delivery.py), in the evaluator's worker
        self.alert_queue: Gauge = Gauge(
            "metricvault_alertmanager_queue_length",
            "Alerts queued for an Alertmanager, not yet accepted by it",
            ["alertmanager"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.alerts_sent: Counter = Counter(
            "metricvault_alertmanager_alerts_sent",
            "Alerts an Alertmanager accepted",
            ["alertmanager"],
            registry=r,
        )
        self.alerts_dropped: Counter = Counter(
            "metricvault_alertmanager_alerts_dropped",
            "Alerts dropped (queue full, or refused by Alertmanager as invalid)",
            ["alertmanager"],
            registry=r,
        )

    @classmethod
    def for_worker(cls, state_dir: Path) -> GatewayMetrics:
        """Metrics of one gateway worker process, shared with the other workers of the same
        ``serve`` run (this process's parent) through ``<runs>/<run>/``.
        Call :meth:`close` when the worker stops."""
        runs = runs_directory(state_dir)
        remove_finished_runs(runs)
        run_dir, lock_fd = _join_run(runs / run_name(os.getppid()))
        if "prometheus_client" in sys.modules and MULTIPROC_ENV not in os.environ:
            os.close(lock_fd)
            raise RuntimeError(
                "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set, so "
                "its values would stay in this worker: import it lazily in gateway workers"
            )
        # set before prometheus_client is imported (in __init__): it picks mmap-file values
        os.environ[MULTIPROC_ENV] = str(run_dir)
        metrics = cls(run_dir)
        metrics._lock_fd = lock_fd
        return metrics

    def render(self) -> tuple[bytes, str]:
        """The exposition of all workers (or of this process) and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if self.multiprocess_dir is None:
            assert self.registry is not None
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        from prometheus_client.multiprocess import MultiProcessCollector

        forget_dead_workers(self.multiprocess_dir)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        """A worker stops: drop its live gauges; the last worker of the run removes the
        directory (no other worker holds the shared lock then)."""
        if self.multiprocess_dir is None or self._lock_fd is None:
            return
        from prometheus_client.multiprocess import mark_process_dead

        fd, self._lock_fd = self._lock_fd, None
        try:
            mark_process_dead(os.getpid(), str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # other workers of this run are still running
            shutil.rmtree(self.multiprocess_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # gateway-metrics/ itself, if no run is left
                self.multiprocess_dir.parent.rmdir()
        finally:
            os.close(fd)


def runs_directory(state_dir: Path) -> Path:
    """Where the runs' mmap files live: in memory (``/dev/shm``) where there is one.

    prometheus-client grows its files sparsely and writes through mmap; on a full disk a write
    into a page that has no block behind it is SIGBUS, which kills the worker and drops its
    connection instead of answering 503. So the files stay off the vault's disk, in a directory
    private to this user and named after the state directory (one per vault)."""
    import hashlib

    if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK):
        digest = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:12]
        runs = SHARED_MEMORY / f"metricvault-{os.getuid()}-{digest}"
        with contextlib.suppress(OSError):
            runs.mkdir(mode=0o700, exist_ok=True)
        info = runs.lstat() if runs.exists() else None
        if (
            info is not None
            and info.st_uid == os.getuid()
            and runs.is_dir()
            and not runs.is_symlink()
        ):
            return runs
    return state_dir / RUNS_DIR


def run_name(pid: int) -> str:
    """``<pid>-<start time>`` of a process: unique even when a pid is reused."""
    info = _process(pid)
    return f"{pid}-{info[1] if info else 0}"


def remove_finished_runs(runs: Path) -> None:
    """Remove the directories of ``serve`` runs whose process is gone (killed runs)."""
    try:
        entries = list(runs.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        pid, _, _ = entry.name.partition("-")
        if not pid.isdigit() or entry.name != run_name(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def forget_dead_workers(run_dir: Path) -> None:
    """Drop the live gauges of workers that died without stopping (killed, crashed): what a
    stopping worker does itself with ``mark_process_dead``. Their counters stay: counters
    count the whole run."""
    from prometheus_client.multiprocess import mark_process_dead

    head = run_dir.name.partition("-")[0]  # the run's serve process (run_name)
    parent = int(head) if head.isdigit() else -1
    for path in run_dir.glob("gauge_live*_*.db"):
        pid = path.stem.rpartition("_")[2]
        if not pid.isdigit():
            continue
        info = _process(int(pid))
        alive = info is not None and (parent == -1 or info[0] in (parent, -1))
        if not alive:  # gone, or the pid now belongs to some other process
            mark_process_dead(int(pid), str(run_dir))  # type: ignore[no-untyped-call]


def _join_run(run_dir: Path) -> tuple[Path, int]:
    """Create or join the run's directory and hold a shared lock on it while the worker runs.
    The last worker out removes the directory under an exclusive lock; one that joins just
    then waits for that and starts a fresh directory."""
    lock_path = run_dir / LOCK_NAME
    while True:
        try:
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            continue  # removed meanwhile by a run's last worker
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return run_dir, fd
        os.close(fd)  # the directory was removed while we waited for the lock


def _process(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a running process; None when there is none (a zombie is
    none). Without /proc (not Linux): (-1, "0") when the pid exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return -1, "0"
    fields = stat[stat.rindex(")") + 2 :].split()  # the name in (...) may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19]
