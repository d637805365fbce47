"""Field readings: utilisation, memory, temperatures, power, clocks, ECC, PCIe, NVLink,
remapped rows, throttle reasons and MIG instances, under dcgm-exporter's names and units."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from metricvault.collect.sources import FastReading
from metricvault.collect.sources._labels import MIG_ID_LABEL, MIG_PROFILE_LABEL
from metricvault.collect.sources.nvml.calls import NvmlCalls, _Gpu, _GpuLost, _Sink, _text, pynvml

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


class FieldReadings(NvmlCalls):
    """One GPU's readings into a `_Sink`; ``_no_memory_v2`` remembers drivers without v2."""

    _no_memory_v2: set[str]

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
