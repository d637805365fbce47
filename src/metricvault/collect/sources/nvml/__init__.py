"""GPU metrics through NVML, under dcgm-exporter's names, units and labels.

Dashboards and alerts written for dcgm-exporter keep working: the metric names, the units
(MiB, W, mJ, MHz, %) and the labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, the host label, and ``GPU_I_PROFILE``/``GPU_I_ID`` on MIG instances) are
dcgm-exporter's. A few series dcgm-exporter lacks are named ``metricvault_gpu_*``.

Every NVML call may fail on some board, driver or permission level. A failing call leaves its
metric out for that GPU, logs one line per (metric, GPU) for the life of the source and is tried
again at the next scrape. A GPU that NVML reports lost (fallen off the bus) exports only
``metricvault_gpu_lost 1``. If NVML cannot start at all (no driver, no library, a library/driver
version mismatch) the constructor raises `NvmlUnavailable`.

XID errors arrive as NVML events; a background thread waits for them (with a timeout, so that
`NvmlSource.close` returns promptly) and counts them.

One job per module, each testable alone: ``calls`` (calling NVML, logging a failure once),
``devices`` (discovery, handles, constant labels), ``fields`` (the readings), ``processes``
(per-process attribution), ``xid`` (events). This module composes them into `NvmlSource` and
keeps the names ``metricvault.collect.sources.nvml`` always had.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from metricvault.collect.families import Metric
from metricvault.collect.sources import FastReading
from metricvault.collect.sources._labels import HOSTNAME_LABEL, FamilyBuilder
from metricvault.collect.sources.nvml.calls import (
    _Gpu,
    _GpuLost,
    _init_failure,
    _shutdown_quietly,
    _Sink,
    pynvml,
)
from metricvault.collect.sources.nvml.devices import DeviceDiscovery
from metricvault.collect.sources.nvml.fields import _PCIE, _SCALARS, FieldReadings
from metricvault.collect.sources.nvml.processes import DEFAULT_ENV_LABELS, ProcessAttribution
from metricvault.collect.sources.nvml.xid import XID_WAIT_MS, _XidWatcher
from metricvault.errors import NvmlUnavailable

__all__ = ["DEFAULT_ENV_LABELS", "XID_WAIT_MS", "NvmlSource"]


class NvmlSource(DeviceDiscovery, FieldReadings, ProcessAttribution):
    """GPU metrics of this host through NVML (see the module doc)."""

    name = "nvml"

    def __init__(
        self,
        *,
        hostname: str | None = None,
        hostname_label: str = HOSTNAME_LABEL,
        proc_root: Path = Path("/proc"),
        env_labels: Mapping[str, str] = DEFAULT_ENV_LABELS,
        xid_events: bool = True,
        pcie_throughput: bool = True,
        process_metrics: bool = True,
    ) -> None:
        """Start NVML and find the GPUs; raise `NvmlUnavailable` if NVML cannot start.

        ``hostname_label`` is ``"Hostname"`` as in dcgm-exporter up to 3.2; newer versions say
        ``"hostname"``. ``env_labels`` maps a GPU process's environment variables to labels of
        its ``metricvault_gpu_process_*`` series (read from ``proc_root/<pid>/environ``).
        ``pcie_throughput=False`` skips the two PCIe rate calls, which block 20 ms each.
        """
        if pynvml is None:
            raise NvmlUnavailable("the nvidia-ml-py package (module pynvml) is not installed")
        try:
            pynvml.nvmlInit()
        except Exception as err:
            raise NvmlUnavailable(_init_failure(err)) from err
        self._hostname = hostname or socket.gethostname()
        self._hostname_label = hostname_label
        self._proc_root = proc_root
        self._env_labels = dict(env_labels)
        self._pcie = pcie_throughput
        self._processes = process_metrics
        self._lock = threading.Lock()  # one scrape at a time; guards the skip and process state
        self._skip_lock = threading.Lock()
        self._skipped: set[tuple[str, str]] = set()
        self._closed = False
        self._no_memory_v2: set[str] = set()
        self._process_labels: dict[int, dict[str, str]] = {}
        self._pids_seen: set[int] = set()
        try:
            self._gpus = self._discover()
        except Exception as err:
            _shutdown_quietly()
            raise NvmlUnavailable(f"NVML started but could not list the GPUs: {err}") from err
        self._xids = _XidWatcher(self, self._gpus) if xid_events else None

    # -- the Source protocol ------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        out = FamilyBuilder()
        with self._lock:
            if self._closed:
                return []
            self._pids_seen = set()
            for gpu in self._gpus:
                self._collect_gpu(gpu, out)
            # Forget processes that left the GPUs (their pid may come back as another process).
            self._process_labels = {
                pid: labels
                for pid, labels in self._process_labels.items()
                if pid in self._pids_seen
            }
        return out.families()

    def fast_readings(self) -> Sequence[FastReading]:
        readings: list[FastReading] = []
        for gpu in self._gpus:
            if gpu.handle is None or self._closed:
                continue
            try:
                readings += self._fast(gpu)
            except _GpuLost:
                continue  # collect() reports it
            except Exception as err:  # a surprise from the bindings must not stop the sampler
                self._skip_once("fast readings", gpu.key, "reading", err)
        return readings

    def close(self) -> None:
        """Stop the XID thread and shut NVML down; later scrapes return nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._xids is not None:
                self._xids.stop()
                self._xids = None
            _shutdown_quietly()

    # -- one scrape ---------------------------------------------------------------------------

    def _collect_gpu(self, gpu: _Gpu, out: FamilyBuilder) -> None:
        sink = _Sink(gpu.labels)
        lost = gpu.handle is None
        if not lost:
            try:
                for what, read in self._readers(gpu, sink):
                    try:
                        read()
                    except _GpuLost:
                        raise
                    except Exception as err:  # a surprise from the bindings: skip this group only
                        self._skip_once(what, gpu.key, "reading", err)
            except _GpuLost:
                lost = True
                self._skip_once(
                    "all metrics", gpu.key, "NVML", "the GPU is lost (fallen off the bus)"
                )
        out.add("metricvault_gpu_lost", gpu.labels, 1.0 if lost else 0.0)
        if not lost:
            for metric, labels, value in sink.samples:
                out.add(metric, labels, value)

    def _readers(self, gpu: _Gpu, sink: _Sink) -> list[tuple[str, Callable[[], None]]]:
        """What one scrape reads of a GPU, in groups that fail independently."""
        handle, key = gpu.handle, gpu.key
        readers: list[tuple[str, Callable[[], None]]] = [
            ("utilisation", lambda: self._utilisation(key, handle, sink)),
            ("memory", lambda: self._memory(key, handle, sink)),
        ]
        for scalar in (*_SCALARS, *(_PCIE if self._pcie else ())):
            readers.append((scalar[0], functools.partial(self._scalar, key, handle, sink, *scalar)))
        readers += [
            ("field values", lambda: self._field_values(key, handle, sink)),
            ("remapped rows", lambda: self._remapped_rows(key, handle, sink)),
            ("throttle reasons", lambda: self._throttle_reasons(key, handle, sink)),
            ("MIG instances", lambda: self._mig_metrics(gpu, sink)),
        ]
        if self._xids is not None:
            xids = self._xids
            readers.append(("XID errors", lambda: xids.export(gpu, sink)))
        if self._processes:
            readers.append(("GPU processes", lambda: self._process_metrics(gpu, sink)))
        return readers
