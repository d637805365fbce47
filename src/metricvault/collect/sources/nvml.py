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
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from metricvault.collect.sources import FastReading
from metricvault.collect.sources._labels import (
    HOSTNAME_LABEL,
    MIG_ID_LABEL,
    MIG_PROFILE_LABEL,
    FamilyBuilder,
    gpu_labels,
    label_pairs,
)
from metricvault.errors import NvmlUnavailable as NvmlUnavailable  # moved: issue 12

try:
    import pynvml  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency; the constructor says so
    pynvml = None

log = logging.getLogger(__name__)

# Environment variables of a GPU process that attribute it to an experiment or a batch job.
DEFAULT_ENV_LABELS: Mapping[str, str] = {
    "METRICVAULT_EXPERIMENT": "experiment",
    "SLURM_JOB_ID": "job",
}
XID_WAIT_MS = 500  # how long the event thread blocks in NVML before checking for close()
_MIB = 1024 * 1024
_ALL_LINKS = 0xFFFFFFFF  # scopeId of an NVLink throughput field: the sum over all links
# The member of NVML's value union that holds a field value, by its NVML_VALUE_TYPE_*.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _same(value: float) -> float:
    return value


def _milli(value: float) -> float:
    return value / 1000.0  # mW -> W


def _kib(value: float) -> float:
    return value * 1024.0  # KB/s -> B/s


# (metric, NVML function, pynvml constants passed after the handle, conversion to dcgm's unit)
_SCALARS = (
    ("DCGM_FI_DEV_GPU_TEMP", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), _same),
    ("DCGM_FI_DEV_POWER_USAGE", "nvmlDeviceGetPowerUsage", (), _milli),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "nvmlDeviceGetTotalEnergyConsumption", (), _same),
    ("DCGM_FI_DEV_SM_CLOCK", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), _same),
    ("DCGM_FI_DEV_MEM_CLOCK", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), _same),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "nvmlDeviceGetPcieReplayCounter", (), _same),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"), _same,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"), _same,
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"), _same,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"), _same,
    ),
)  # fmt: skip
# NVML samples PCIe traffic for 20 ms inside each of these calls: 40 ms per GPU and scrape.
_PCIE = (
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_TX_BYTES",),
        _kib,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_RX_BYTES",),
        _kib,
    ),
)  # fmt: skip


class _GpuLost(Exception):
    """NVML said NVML_ERROR_GPU_IS_LOST: the GPU's other metrics are left out of this scrape."""


@dataclass
class _Gpu:
    index: int
    handle: Any  # None when NVML could not give one (the GPU was lost at start)
    key: str  # "GPU 0 (GPU-8a1c...)", for log lines
    labels: dict[str, str]
    pairs: tuple[tuple[str, str], ...] = ()
    process_ts: int = 0  # newest per-process utilisation sample seen (NVML µs timestamp)

    def __post_init__(self) -> None:
        self.pairs = label_pairs(self.labels)


@dataclass
class _Sink:
    """One GPU's samples for one scrape; kept apart until the scrape knows the GPU is not lost."""

    labels: Mapping[str, str]
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, metric: str, value: float, extra: Mapping[str, str] | None = None) -> None:
        labels = {**self.labels, **extra} if extra else dict(self.labels)
        self.samples.append((metric, labels, float(value)))


class NvmlSource:
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

    def _fast(self, gpu: _Gpu) -> list[FastReading]:
        readings = []
        util = self._call(
            gpu.key, "DCGM_FI_DEV_GPU_UTIL", "nvmlDeviceGetUtilizationRates", gpu.handle
        )
        power = self._call(
            gpu.key, "DCGM_FI_DEV_POWER_USAGE", "nvmlDeviceGetPowerUsage", gpu.handle
        )
        if util is not None:
            readings.append(FastReading("DCGM_FI_DEV_GPU_UTIL", gpu.pairs, float(util.gpu)))
        if power is not None:
            readings.append(FastReading("DCGM_FI_DEV_POWER_USAGE", gpu.pairs, _milli(power)))
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

    # -- discovery ----------------------------------------------------------------------------

    def _discover(self) -> list[_Gpu]:
        gpus = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            gpu = self._describe(index)
            if gpu is not None:
                gpus.append(gpu)
        return gpus

    def _describe(self, index: int) -> _Gpu | None:
        """The GPU's handle and its constant labels, read once."""
        key = f"GPU {index}"
        labels = self._labels(index, "", "", "")
        try:
            handle = self._call(key, "device handle", "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                return None  # logged; without a handle there is nothing to read
            uuid = self._call(key, "UUID label", "nvmlDeviceGetUUID", handle)
            model = self._call(key, "modelName label", "nvmlDeviceGetName", handle)
            pci = self._call(key, "pci_bus_id label", "nvmlDeviceGetPciInfo", handle)
        except _GpuLost:
            # Handles of a lost GPU stay invalid until a reset and a driver reload.
            log.warning("%s is lost (fallen off the bus); it reports metricvault_gpu_lost", key)
            return _Gpu(index, None, key, labels)
        bus_id = _text(pci.busId) if pci is not None else ""
        labels = self._labels(index, _text(uuid), bus_id, _text(model))
        if uuid:
            key = f"{key} ({_text(uuid)})"
        return _Gpu(index, handle, key, labels)

    def _labels(self, index: int, uuid: str, bus_id: str, model: str) -> dict[str, str]:
        return gpu_labels(
            index=index,
            uuid=uuid,
            pci_bus_id=bus_id,
            model_name=model,
            hostname=self._hostname,
            hostname_label=self._hostname_label,
        )

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

    def _scalar(
        self,
        key: str,
        handle: Any,
        sink: _Sink,
        metric: str,
        function: str,
        constants: tuple[str, ...],
        convert: Callable[[float], float],
    ) -> None:
        args = [getattr(pynvml, name) for name in constants]
        value = self._call(key, metric, function, handle, *args)
        if value is not None:
            sink.add(metric, convert(value))

    def _utilisation(self, key: str, handle: Any, sink: _Sink) -> None:
        util = self._call(key, "DCGM_FI_DEV_GPU_UTIL", "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            sink.add("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            sink.add("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)

    def _memory(self, key: str, handle: Any, sink: _Sink) -> None:
        # Version 2 separates the driver's reserved memory from `used`; older drivers lack it.
        info, reserved = None, None
        if key not in self._no_memory_v2:
            info = self._call(
                key, "DCGM_FI_DEV_FB_RESERVED", "nvmlDeviceGetMemoryInfo", handle,
                pynvml.nvmlMemory_v2, quiet=True,
            )  # fmt: skip
            if info is None:
                self._no_memory_v2.add(key)
            else:
                reserved = info.reserved
        if info is None:
            info = self._call(key, "DCGM_FI_DEV_FB_USED", "nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return
        sink.add("DCGM_FI_DEV_FB_USED", info.used // _MIB)
        sink.add("DCGM_FI_DEV_FB_FREE", info.free // _MIB)
        if reserved is not None:
            sink.add("DCGM_FI_DEV_FB_RESERVED", reserved // _MIB)

    def _field_values(self, key: str, handle: Any, sink: _Sink) -> None:
        """Memory temperature and NVLink traffic: one nvmlDeviceGetFieldValues call."""
        tx, rx = (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        ids = [(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0), (tx, _ALL_LINKS), (rx, _ALL_LINKS)]
        values = self._call(key, "field values", "nvmlDeviceGetFieldValues", handle, ids)
        if values is None:
            return
        memory_temp = self._field(key, "DCGM_FI_DEV_MEMORY_TEMP", values[0])
        if memory_temp is not None:
            sink.add("DCGM_FI_DEV_MEMORY_TEMP", memory_temp)
        sent = self._field(key, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", values[1])
        received = self._field(key, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", values[2])
        if sent is not None and received is not None:
            sink.add("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", sent + received)  # KiB

    def _field(self, key: str, metric: str, value: Any) -> float | None:
        """A field's value, or None (logged once) where NVML answered that field with an error."""
        code = int(value.nvmlReturn)
        if code == pynvml.NVML_SUCCESS:
            member = _VALUE_MEMBERS[int(value.valueType)]
            return float(getattr(value.value, member))
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _GpuLost(key)
        self._skip_once(metric, key, "nvmlDeviceGetFieldValues", pynvml.NVMLError(code))
        return None

    def _remapped_rows(self, key: str, handle: Any, sink: _Sink) -> None:
        rows = self._call(
            key, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "nvmlDeviceGetRemappedRows", handle
        )
        if rows is not None:
            correctable, uncorrectable, pending, failed = rows
            sink.add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", correctable)
            sink.add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", uncorrectable)
            sink.add("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0 if pending else 0.0)
            sink.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0 if failed else 0.0)

    def _throttle_reasons(self, key: str, handle: Any, sink: _Sink) -> None:
        # Drivers >= 535 call them "clock event reasons"; older ones know only the old name.
        metric = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        reasons = self._call(
            key, metric, "nvmlDeviceGetCurrentClocksEventReasons", handle, quiet=True
        )
        if reasons is None:
            reasons = self._call(key, metric, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if reasons is not None:
            sink.add(metric, reasons)

    def _mig_metrics(self, gpu: _Gpu, sink: _Sink) -> None:
        """Memory and utilisation of each MIG instance, with GPU_I_PROFILE and GPU_I_ID labels."""
        no_mig = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        mode = self._call(gpu.key, "MIG mode", "nvmlDeviceGetMigMode", gpu.handle, quiet=no_mig)
        if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        slots = self._call(gpu.key, "MIG instances", "nvmlDeviceGetMaxMigDeviceCount", gpu.handle)
        for slot in range(int(slots or 0)):
            mig = self._call(
                gpu.key, "MIG instances", "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot,
                quiet=(pynvml.NVML_ERROR_NOT_FOUND,),
            )  # fmt: skip
            if mig is None:
                continue  # an empty slot
            instance = self._call(gpu.key, "MIG instances", "nvmlDeviceGetGpuInstanceId", mig)
            if instance is None:
                continue
            key = f"{gpu.key} MIG {instance}"
            labels = {
                **gpu.labels,
                MIG_PROFILE_LABEL: self._mig_profile(key, mig),
                MIG_ID_LABEL: str(instance),
            }
            mig_sink = _Sink({name: value for name, value in labels.items() if value})
            self._utilisation(key, mig, mig_sink)
            self._memory(key, mig, mig_sink)
            sink.samples.extend(mig_sink.samples)

    def _mig_profile(self, key: str, mig: Any) -> str:
        """The profile name, e.g. "1g.10gb", as dcgm-exporter's GPU_I_PROFILE label says it."""
        name = _text(self._call(key, "GPU_I_PROFILE label", "nvmlDeviceGetName", mig))
        if " MIG " in name:  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
            return name.rsplit(" MIG ", 1)[1].strip()
        attributes = self._call(key, "GPU_I_PROFILE label", "nvmlDeviceGetAttributes", mig)
        if attributes is None:
            return ""
        memory_gb = math.ceil(int(attributes.memorySizeMB) / 1024)
        return f"{int(attributes.gpuInstanceSliceCount)}g.{memory_gb}gb"

    # -- per-process metrics ------------------------------------------------------------------

    def _process_metrics(self, gpu: _Gpu, sink: _Sink) -> None:
        metric = "metricvault_gpu_process_memory_bytes"
        running = self._call(gpu.key, metric, "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        memory: dict[int, float] = {}
        for process in running or ():
            used = process.usedGpuMemory  # None where the driver cannot tell (e.g. WDDM)
            if used is not None:
                # A process appears once per MIG compute instance it uses: one series per pid.
                memory[int(process.pid)] = memory.get(int(process.pid), 0.0) + float(used)
        utilisation = self._process_utilisation(gpu)
        for pid in sorted(set(memory) | set(utilisation)):
            extra = self._labels_of_process(pid)
            if pid in memory:
                sink.add(metric, memory[pid], extra)
            if pid in utilisation:
                sink.add("metricvault_gpu_process_sm_util", utilisation[pid], extra)

    def _process_utilisation(self, gpu: _Gpu) -> dict[int, float]:
        """Mean SM utilisation per pid over the samples NVML took since the previous scrape."""
        # No new samples: NVML says NOT_FOUND (pynvml raises "SUCCESS" when it found none at all).
        no_samples = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS)
        samples = self._call(
            gpu.key, "metricvault_gpu_process_sm_util", "nvmlDeviceGetProcessUtilization",
            gpu.handle, gpu.process_ts, quiet=no_samples,
        )  # fmt: skip
        sums: dict[int, tuple[float, int]] = {}
        for sample in samples or ():
            if int(sample.timeStamp) <= gpu.process_ts:
                continue
            total, count = sums.get(int(sample.pid), (0.0, 0))
            sums[int(sample.pid)] = (total + float(sample.smUtil), count + 1)
        if samples:
            gpu.process_ts = max(gpu.process_ts, *(int(s.timeStamp) for s in samples))
        return {pid: total / count for pid, (total, count) in sums.items()}

    def _labels_of_process(self, pid: int) -> dict[str, str]:
        """pid, process_name and the attribution labels, cached while the pid uses a GPU."""
        self._pids_seen.add(pid)
        cached = self._process_labels.get(pid)
        if cached is not None:
            return cached
        labels = {"pid": str(pid)}
        name = _read_text(self._proc_root / str(pid) / "comm").strip()
        if name:
            labels["process_name"] = name
        environ = _read_text(self._proc_root / str(pid) / "environ")
        for entry in environ.split("\0"):
            variable, _, value = entry.partition("=")
            label = self._env_labels.get(variable)
            if label and value and label not in labels:
                labels[label] = value
        self._process_labels[pid] = labels
        return labels

    # -- calling NVML -------------------------------------------------------------------------

    def _call(
        self, key: str, what: str, function: str, *args: Any, quiet: bool | Collection[int] = False
    ) -> Any:
        """``pynvml.<function>(*args)``, or None if it fails; raises `_GpuLost` for a lost GPU.

        A failure is logged once per (what, key), except where ``quiet`` says it is normal:
        ``True`` for any error (a probe with a fallback), or the NVML_ERROR_* codes that are.
        """
        try:
            return getattr(pynvml, function)(*args)
        except Exception as err:  # NVMLError, NVMLLibraryMismatchError, a missing binding
            code = _code(err)
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(key) from err
            if quiet is not True and (quiet is False or code not in quiet):
                self._skip_once(what, key, function, err)
            return None

    def _skip_once(self, what: str, key: str, function: str, err: object) -> None:
        with self._skip_lock:  # scrapes, fast readings and the XID thread all get here
            if (what, key) in self._skipped:
                return
            self._skipped.add((what, key))
        expected = _code(err) in (
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        )
        log.log(
            logging.INFO if expected else logging.WARNING,
            "%s: %s left out: %s failed: %s (logged once; tried again at every scrape)",
            key, what, function, _describe(err),
        )  # fmt: skip


class _XidWatcher:
    """Waits for XID events on a thread; keeps the last XID per GPU and counts them by XID."""

    def __init__(self, source: NvmlSource, gpus: Sequence[_Gpu]) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._last: dict[int, int] = {}  # GPU index -> last XID (0 until one happens)
        self._counts: dict[tuple[int, int], int] = {}  # (GPU index, XID) -> events
        self._by_uuid = {gpu.labels.get("UUID", ""): gpu.index for gpu in gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._events = source._call("NVML", "XID events", "nvmlEventSetCreate")
        except _GpuLost:
            self._events = None
        if self._events is None:
            return
        for gpu in gpus:
            if gpu.handle is not None and self._register(gpu):
                self._last[gpu.index] = 0
        if not self._last:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _register(self, gpu: _Gpu) -> bool:
        try:
            pynvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._events
            )
        except Exception as err:  # e.g. NVML_ERROR_NOT_SUPPORTED: the metric is absent
            self._source._skip_once(
                "DCGM_FI_DEV_XID_ERRORS", gpu.key, "nvmlDeviceRegisterEvents", err
            )
            return False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = pynvml.nvmlEventSetWait_v2(self._events, XID_WAIT_MS)
            except Exception as err:
                if _code(err) != pynvml.NVML_ERROR_TIMEOUT:
                    self._source._skip_once("XID events", "NVML", "nvmlEventSetWait_v2", err)
                    self._stop.wait(1.0)  # a persistent error must not spin
                continue
            if int(event.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                self._record(event)

    def _record(self, event: Any) -> None:
        index = self._gpu_of(event.device)
        if index is None:
            return  # an event of a device this source does not export
        xid = int(event.eventData)
        log.warning("GPU %d: XID %d (see NVIDIA's XID catalogue for what it means)", index, xid)
        with self._lock:
            self._last[index] = xid
            self._counts[(index, xid)] = self._counts.get((index, xid), 0) + 1

    def _gpu_of(self, device: Any) -> int | None:
        """The index of the GPU an event came from; handles are pointers, so match the UUID.

        An event of a MIG instance may carry the instance's handle ("MIG-..." UUID): its
        parent GPU is the one to count it on.
        """
        try:
            index = self._by_uuid.get(_text(pynvml.nvmlDeviceGetUUID(device)))
            if index is not None:
                return index
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
            return self._by_uuid.get(_text(pynvml.nvmlDeviceGetUUID(parent)))
        except Exception:
            return None

    def export(self, gpu: _Gpu, sink: _Sink) -> None:
        with self._lock:
            if gpu.index not in self._last:
                return  # events are not supported on this GPU: the metric is absent
            sink.add("DCGM_FI_DEV_XID_ERRORS", self._last[gpu.index])
            counts = [(xid, n) for (index, xid), n in self._counts.items() if index == gpu.index]
        for xid, n in sorted(counts):
            sink.add("metricvault_gpu_xid_errors_total", n, {"xid": str(xid)})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=XID_WAIT_MS / 1000 + 2.0)
            if self._thread.is_alive():
                return  # still inside NVML: freeing the set under it would be worse than a leak
        self._free()

    def _free(self) -> None:
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except Exception as err:
                log.debug("nvmlEventSetFree failed: %s", _describe(err))
            self._events = None


def _code(err: object) -> int | None:
    """The NVML_ERROR_* code of an NVMLError; None for other exceptions."""
    if pynvml is not None and isinstance(err, pynvml.NVMLError):
        return int(err.value)
    return None


def _describe(err: object) -> str:
    try:
        return str(err) or type(err).__name__
    except Exception:  # NVMLError.__str__ asks the library, which may be gone
        return repr(err)


def _init_failure(err: Exception) -> str:
    hints = {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "no NVIDIA kernel driver is loaded",
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "the NVML library and the kernel driver have different versions "
            "(was the driver updated without a reboot?)"
        ),
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices",
    }
    hint = hints.get(_code(err) or -1, "")
    detail = f"{hint}: {_describe(err)}" if hint else _describe(err)
    return f"NVML is not available ({detail}); no GPU metrics from NVML"


def _shutdown_quietly() -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception as err:
        log.debug("nvmlShutdown failed: %s", _describe(err))


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _read_text(path: Path) -> str:
    """A /proc file's text, or "" where it is gone or not ours to read."""
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""
