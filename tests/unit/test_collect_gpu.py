"""GPU sources: NVML (mocked at the pynvml boundary) and the simulated GPUs.

No test touches a real NVML library: every ``nvml*`` function of pynvml is replaced, and one the
fake does not provide answers NVML_ERROR_FUNCTION_NOT_FOUND.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metricvault.collect.sources import FastReading
from metricvault.collect.sources._labels import METRICS
from metricvault.collect.sources.nvml import NvmlSource
from metricvault.collect.sources.simulated import SimulatedGpuSource
from metricvault.errors import NvmlUnavailable
from metricvault.model import DCGM_COUNTERS, kind_from_name
from metricvault.sim.spec import FB_TOTAL_MIB

GIB = 1024**3
MIB = 1024**2
NVML_LOG = "metricvault.collect.sources.nvml"
XID = pynvml.nvmlEventTypeXidCriticalError


# -- a fake NVML ----------------------------------------------------------------------------


@dataclass
class FakeDevice:
    """One GPU (or MIG instance) as the fake NVML reports it; the object is its own handle."""

    index: int
    uuid: str = ""
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: bytes = b"00000000:18:00.0"
    util: tuple[int, int] = (87, 31)
    used: int = 70 * GIB
    free: int = 9 * GIB
    reserved: int = 512 * MIB
    temp: int = 45
    memory_temp: int = 52
    power_mw: int = 412_345
    energy_mj: int = 123_456_789
    clocks: dict[int, int] = field(
        default_factory=lambda: {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}
    )
    replay: int = 3
    pcie_kbs: tuple[int, int] = (1000, 2000)  # tx, rx
    nvlink_kib: tuple[int, int] = (5_000_000, 6_000_000)  # tx, rx
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (2, 1, 0, 0)
    throttle: int = 0x4
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, µs, sm %
    migs: list[FakeDevice] = field(default_factory=list)
    gpu_instance: int = 0
    slices: int = 0  # MIG: gpuInstanceSliceCount, for names without the profile
    fail: dict[str, int] = field(default_factory=dict)  # NVML function -> NVML_ERROR_*
    field_fail: dict[int, int] = field(default_factory=dict)  # field id -> NVML_ERROR_*
    lost: bool = False
    parent: FakeDevice | None = None  # a MIG instance's GPU

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-0000000{self.index}-aaaa-bbbb-cccc-dddddddddddd"


class FakeNvml:
    def __init__(self, devices: list[FakeDevice], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.events: queue.Queue[Any] = queue.Queue()
        self.calls: list[str] = []
        self.freed = 0
        self.shutdowns = 0

    def _dev(self, handle: FakeDevice, function: str) -> FakeDevice:
        self.calls.append(function)
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in handle.fail:
            raise pynvml.NVMLError(handle.fail[function])
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self._dev(self.devices[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, h: FakeDevice) -> str:
        return self._dev(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetIndex(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetName(self, h: FakeDevice) -> str:
        return self._dev(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, h: FakeDevice) -> Any:
        return SimpleNamespace(busId=self._dev(h, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetUtilizationRates(self, h: FakeDevice) -> Any:
        gpu, memory = self._dev(h, "nvmlDeviceGetUtilizationRates").util
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, h: FakeDevice, version: int | None = None) -> Any:
        name = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        d = self._dev(h, name)
        total = d.used + d.free + d.reserved
        if version:
            return SimpleNamespace(total=total, used=d.used, free=d.free, reserved=d.reserved)
        return SimpleNamespace(total=total, used=d.used + d.reserved, free=d.free)

    def nvmlDeviceGetTemperature(self, h: FakeDevice, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetClockInfo(self, h: FakeDevice, clock: int) -> int:
        return self._dev(h, "nvmlDeviceGetClockInfo").clocks[clock]

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPcieReplayCounter").replay

    def nvmlDeviceGetPcieThroughput(self, h: FakeDevice, counter: int) -> int:
        return self._dev(h, "nvmlDeviceGetPcieThroughput").pcie_kbs[counter]

    def nvmlDeviceGetTotalEccErrors(self, h: FakeDevice, error: int, counter: int) -> int:
        return self._dev(h, "nvmlDeviceGetTotalEccErrors").ecc.get((error, counter), 0)

    def nvmlDeviceGetRemappedRows(self, h: FakeDevice) -> tuple[int, int, int, int]:
        return self._dev(h, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetCurrentClocksEventReasons").throttle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle

    def nvmlDeviceGetFieldValues(self, h: FakeDevice, ids: list[tuple[int, int]]) -> list[Any]:
        d = self._dev(h, "nvmlDeviceGetFieldValues")
        known = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, d.memory_temp),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (3, d.nvlink_kib[0]),
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (3, d.nvlink_kib[1]),
        }
        out = []
        for field_id, scope in ids:
            if field_id != pynvml.NVML_FI_DEV_MEMORY_TEMP:
                assert scope == 0xFFFFFFFF  # NVLink throughput: summed over all links
            value_type, value = known[field_id]
            member = "uiVal" if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT else "ullVal"
            code = d.field_fail.get(field_id, pynvml.NVML_SUCCESS)
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    nvmlReturn=code,
                    valueType=value_type,
                    value=SimpleNamespace(**{member: value}),
                )
            )
        return out

    def nvmlDeviceGetMigMode(self, h: FakeDevice) -> list[int]:
        d = self._dev(h, "nvmlDeviceGetMigMode")
        if not d.migs:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeDevice) -> int:
        return 7 if self._dev(h, "nvmlDeviceGetMaxMigDeviceCount").migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeDevice, slot: int) -> FakeDevice:
        migs = self._dev(h, "nvmlDeviceGetMigDeviceHandleByIndex").migs
        if slot >= len(migs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return migs[slot]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: FakeDevice) -> FakeDevice:
        parent = self._dev(h, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle").parent
        if parent is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return parent

    def nvmlDeviceGetGpuInstanceId(self, h: FakeDevice) -> int:
        return self._dev(h, "nvmlDeviceGetGpuInstanceId").gpu_instance

    def nvmlDeviceGetAttributes(self, h: FakeDevice) -> Any:
        d = self._dev(h, "nvmlDeviceGetAttributes")
        return SimpleNamespace(
            gpuInstanceSliceCount=d.slices, memorySizeMB=(d.used + d.free + d.reserved) // MIB
        )

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeDevice) -> list[Any]:
        d = self._dev(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in d.processes]

    def nvmlDeviceGetProcessUtilization(self, h: FakeDevice, since: int) -> list[Any]:
        d = self._dev(h, "nvmlDeviceGetProcessUtilization")
        fresh = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0)
            for pid, ts, sm in d.samples
            if ts > since
        ]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeDevice, types: int, events: str) -> None:
        assert types & XID and events == "event-set"
        self._dev(h, "nvmlDeviceRegisterEvents")

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        try:  # NVML may return before the timeout; a short wait keeps close() fast here
            return self.events.get(timeout=min(timeout_ms, 20) / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, events: str) -> None:
        self.freed += 1


def _missing(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    call.__name__ = name
    return call


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeNvml], FakeNvml]:
    """Replace every NVML function of pynvml with the fake's (or a FUNCTION_NOT_FOUND stub)."""

    def _install(fake: FakeNvml) -> FakeNvml:
        for name, value in vars(pynvml).items():
            if name.startswith("nvml") and callable(value) and not isinstance(value, type):
                monkeypatch.setattr(pynvml, name, getattr(fake, name, _missing(name)))
        return fake

    return _install


@pytest.fixture
def make_source(
    install: Callable[[FakeNvml], FakeNvml], tmp_path: Path
) -> Iterator[Callable[..., NvmlSource]]:
    sources: list[NvmlSource] = []

    def _make(devices: list[FakeDevice], **kwargs: Any) -> NvmlSource:
        install(FakeNvml(devices))
        kwargs.setdefault("hostname", "node01")
        kwargs.setdefault("proc_root", tmp_path / "proc")
        source = NvmlSource(**kwargs)
        sources.append(source)
        return source

    yield _make
    for source in sources:
        source.close()


# -- helpers ----------------------------------------------------------------------------------


def render(source: Any) -> str:
    registry = CollectorRegistry()
    registry.register(source)
    return generate_latest(registry).decode()


def scrape(source: Any) -> dict[str, Any]:
    """Metric families by name, parsed back from the text exposition."""
    return {family.name: family for family in text_string_to_metric_families(render(source))}


def value(families: dict[str, Any], name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels`` (None: absent).

    The parser names a counter's family without ``_total``; ``name`` may have it or not.
    """
    family = families.get(name) or families.get(name.removesuffix("_total"))
    if family is None:
        return None
    found = [s.value for s in family.samples if labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def gpu_series(families: dict[str, Any], gpu: str) -> set[str]:
    return {f.name for f in families.values() for s in f.samples if s.labels.get("gpu") == gpu}


def two_gpus() -> list[FakeDevice]:
    return [FakeDevice(0), FakeDevice(1, bus_id=b"00000000:2A:00.0", power_mw=88_000)]


# -- NvmlSource -------------------------------------------------------------------------------


def test_exposition_has_dcgm_names_types_units_and_labels(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    devices[0].ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)] = 4
    source = make_source(devices)
    text = render(source)
    families = scrape(source)

    # dcgm-exporter's counters: TYPE counter under the bare name, samples without "_total".
    for name in DCGM_COUNTERS & set(families):
        assert f"# TYPE {name} counter\n" in text
        assert f"{name}_total" not in text
        assert families[name].type == "counter"
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "# TYPE metricvault_gpu_xid_errors_total counter" not in text  # no XID yet
    # Every family's TYPE agrees with how the store classifies the name.
    for name, family in families.items():
        assert family.type == kind_from_name(family.samples[0].name.removesuffix("_total")) or (
            family.type == kind_from_name(family.samples[0].name)
        ), name

    expected = {
        "DCGM_FI_DEV_GPU_UTIL": 87.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 31.0,
        "DCGM_FI_DEV_FB_USED": 70 * 1024.0,  # MiB
        "DCGM_FI_DEV_FB_FREE": 9 * 1024.0,
        "DCGM_FI_DEV_FB_RESERVED": 512.0,
        "DCGM_FI_DEV_GPU_TEMP": 45.0,
        "DCGM_FI_DEV_MEMORY_TEMP": 52.0,
        "DCGM_FI_DEV_POWER_USAGE": 412.345,  # W, from mW
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123_456_789.0,  # mJ
        "DCGM_FI_DEV_SM_CLOCK": 1980.0,
        "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3.0,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 1000 * 1024.0,  # B/s, from KB/s
        "DCGM_FI_PROF_PCIE_RX_BYTES": 2000 * 1024.0,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 11_000_000.0,  # KiB, TX + RX
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4.0,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 0.0,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0.0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2.0,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1.0,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 4.0,
        "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "metricvault_gpu_lost": 0.0,
    }
    for name, want in expected.items():
        assert value(families, name, gpu="0") == pytest.approx(want), name
    assert set(families) == set(expected)
    assert value(families, "DCGM_FI_DEV_POWER_USAGE", gpu="1") == 88.0

    gpu0 = {
        "gpu": "0",
        "UUID": devices[0].uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node01",
    }
    for family in families.values():
        for sample in family.samples:
            if sample.labels["gpu"] == "0":
                assert sample.labels == gpu0, family.name
            else:
                assert sample.labels["device"] == "nvidia1"
                assert sample.labels["pci_bus_id"] == "00000000:2A:00.0"


def test_hostname_label_is_configurable(make_source: Callable[..., NvmlSource]) -> None:
    source = make_source(two_gpus(), hostname="gpu-7", hostname_label="hostname")
    for family in scrape(source).values():
        for sample in family.samples:
            assert sample.labels["hostname"] == "gpu-7"
            assert "Hostname" not in sample.labels


def test_unsupported_calls_leave_metrics_out_with_one_log_line(
    make_source: Callable[..., NvmlSource], caplog: pytest.LogCaptureFixture
) -> None:
    devices = two_gpus()
    devices[0].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    devices[0].fail["nvmlDeviceGetTotalEccErrors"] = pynvml.NVML_ERROR_NO_PERMISSION
    devices[0].fail["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    devices[0].fail["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    devices[0].field_fail[pynvml.NVML_FI_DEV_MEMORY_TEMP] = pynvml.NVML_ERROR_NOT_SUPPORTED
    devices[1].fail["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_UNKNOWN
    source = make_source(devices)
    caplog.set_level(logging.INFO, logger=NVML_LOG)

    for _ in range(3):
        families = scrape(source)
        absent = {
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "DCGM_FI_DEV_FB_RESERVED",
            "DCGM_FI_DEV_MEMORY_TEMP",
        }
        assert not absent & gpu_series(families, "0")
        assert absent <= gpu_series(families, "1") | {"DCGM_FI_DEV_MEMORY_TEMP"}
        assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in gpu_series(families, "1")
        # What still works is there: the older memory call, the older throttle-reasons name.
        assert value(families, "DCGM_FI_DEV_FB_USED", gpu="0") == (70 * 1024 + 512)
        assert value(families, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="0") == 4.0
        assert value(families, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == 11_000_000

    def lines(*words: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if all(w in r.getMessage() for w in words)]

    assert len(lines("GPU 0", "DCGM_FI_DEV_POWER_USAGE")) == 1
    assert len(lines("GPU 0", "nvmlDeviceGetTotalEccErrors")) == 4  # one per ECC metric
    assert len(lines("GPU 0", "DCGM_FI_DEV_MEMORY_TEMP", "Not Supported")) == 1
    assert len(lines("GPU 1", "field values")) == 1
    assert not lines("FB_RESERVED") and not lines("ClocksEventReasons")  # fallbacks are quiet
    assert not lines("MIG")  # no MIG is normal
    power = [r for r in caplog.records if "DCGM_FI_DEV_POWER_USAGE" in r.getMessage()]
    assert power[0].levelno == logging.INFO  # not supported: expected on some boards
    ecc = [r for r in caplog.records if "ECC_SBE_VOL" in r.getMessage()]
    assert ecc[0].levelno == logging.WARNING  # no permission: worth a warning


def test_lost_gpu_reports_only_metricvault_gpu_lost(
    make_source: Callable[..., NvmlSource], caplog: pytest.LogCaptureFixture
) -> None:
    devices = two_gpus()
    source = make_source(devices)
    assert value(scrape(source), "metricvault_gpu_lost", gpu="1") == 0.0

    caplog.set_level(logging.INFO, logger=NVML_LOG)
    devices[1].lost = True
    for _ in range(2):
        families = scrape(source)
        assert gpu_series(families, "1") == {"metricvault_gpu_lost"}
        assert value(families, "metricvault_gpu_lost", gpu="1", UUID=devices[1].uuid) == 1.0
        assert value(families, "metricvault_gpu_lost", gpu="0") == 0.0
        assert value(families, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 87.0
    assert len([r for r in caplog.records if "lost" in r.getMessage()]) == 1
    assert [r.metric for r in source.fast_readings()] == [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
    ]

    # A GPU lost mid-scrape (after its first calls answered) exports none of those values.
    devices[1].lost = False
    devices[1].fail["nvmlDeviceGetRemappedRows"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert gpu_series(scrape(source), "1") == {"metricvault_gpu_lost"}


def test_gpu_lost_at_start_is_reported_without_a_handle(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    devices[1].fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_GPU_IS_LOST
    families = scrape(make_source(devices))
    assert gpu_series(families, "1") == {"metricvault_gpu_lost"}
    assert value(families, "metricvault_gpu_lost", gpu="1", device="nvidia1") == 1.0


def test_mig_instances_export_memory_with_profile_and_instance_labels(
    make_source: Callable[..., NvmlSource],
) -> None:
    small = FakeDevice(0, name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", used=3 * GIB, free=6 * GIB)
    small.gpu_instance = 9
    # A name without the profile: it is rebuilt from the instance's slices and memory.
    big = FakeDevice(0, name="NVIDIA H100 80GB HBM3", used=20 * GIB, free=19 * GIB, slices=3)
    big.gpu_instance, big.reserved = 2, 256 * MIB
    for mig in (small, big):
        mig.fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    parent = FakeDevice(0, migs=[small, big])
    families = scrape(make_source([parent]))

    used = {
        (s.labels.get("GPU_I_PROFILE"), s.labels.get("GPU_I_ID")): s.value
        for s in families["DCGM_FI_DEV_FB_USED"].samples
    }
    assert used == {
        (None, None): 70 * 1024,
        ("1g.10gb", "9"): 3 * 1024,
        ("3g.40gb", "2"): 20 * 1024,
    }
    for sample in families["DCGM_FI_DEV_FB_USED"].samples:
        assert sample.labels["UUID"] == parent.uuid and sample.labels["gpu"] == "0"
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert [s.labels.get("GPU_I_ID") for s in util] == [None]  # MIG utilisation unsupported


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "different versions"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no NVIDIA kernel driver"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
    ],
)
def test_nvml_that_cannot_start_raises_nvml_unavailable(
    install: Callable[[FakeNvml], FakeNvml], code: int, hint: str
) -> None:
    install(FakeNvml(two_gpus(), init_error=code))
    with pytest.raises(NvmlUnavailable, match=hint):
        NvmlSource(hostname="node01")


def test_xid_events_set_the_gauge_and_count_by_xid(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    source = make_source(devices)
    fake = pynvml.nvmlEventSetWait_v2.__self__
    watcher = source._xids
    assert watcher is not None and watcher._thread is not None
    thread = watcher._thread

    def event(device: FakeDevice, xid: int) -> Any:
        return SimpleNamespace(
            device=device, eventType=XID, eventData=xid, gpuInstanceId=0, computeInstanceId=0
        )

    def wait_for(check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + 5.0
        while True:
            families = scrape(source)
            if check(families) or time.monotonic() > deadline:
                return families
            time.sleep(0.01)

    fake.events.put(event(devices[1], 79))
    families = wait_for(lambda f: value(f, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79.0)
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 79.0
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0.0
    assert families["metricvault_gpu_xid_errors"].type == "counter"
    assert value(families, "metricvault_gpu_xid_errors_total", gpu="1", xid="79") == 1.0
    assert value(families, "metricvault_gpu_xid_errors_total", gpu="0") is None

    fake.events.put(event(devices[1], 79))
    fake.events.put(event(devices[1], 48))
    families = wait_for(
        lambda f: value(f, "metricvault_gpu_xid_errors_total", gpu="1", xid="48") == 1.0
    )
    assert value(families, "metricvault_gpu_xid_errors_total", gpu="1", xid="79") == 2.0
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 48.0

    source.close()
    assert not thread.is_alive()
    assert fake.freed == 1 and fake.shutdowns == 1
    assert list(source.collect()) == []
    source.close()  # twice is harmless
    assert fake.shutdowns == 1


def test_xid_event_of_a_mig_instance_counts_on_its_gpu(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    mig = FakeDevice(1, uuid="MIG-11111111-2222-3333-4444-555555555555", parent=devices[1])
    source = make_source(devices)
    fake = pynvml.nvmlEventSetWait_v2.__self__
    fake.events.put(SimpleNamespace(device=mig, eventType=XID, eventData=94, gpuInstanceId=3))
    deadline = time.monotonic() + 5.0
    while value(scrape(source), "DCGM_FI_DEV_XID_ERRORS", gpu="1") != 94.0:
        assert time.monotonic() < deadline, "the XID event never arrived"
        time.sleep(0.01)
    families = scrape(source)
    assert value(families, "metricvault_gpu_xid_errors_total", gpu="1", xid="94") == 1.0


def test_surprises_from_the_bindings_never_break_a_scrape(
    make_source: Callable[..., NvmlSource], caplog: pytest.LogCaptureFixture
) -> None:
    devices = two_gpus()
    source = make_source(devices)
    fake = pynvml.nvmlDeviceGetPowerUsage.__self__
    caplog.set_level(logging.INFO, logger=NVML_LOG)

    def broken(h: FakeDevice) -> int:
        raise ctypes.ArgumentError("argument 1: wrong type")

    def odd_shape(h: FakeDevice) -> Any:
        return SimpleNamespace()  # no .gpu / .memory

    fake.nvmlDeviceGetPowerUsage = broken
    fake.nvmlDeviceGetUtilizationRates = odd_shape
    for name in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates"):
        setattr(pynvml, name, getattr(fake, name))
    for _ in range(2):
        families = scrape(source)
        assert value(families, "metricvault_gpu_lost", gpu="0") == 0.0
        assert value(families, "DCGM_FI_DEV_POWER_USAGE", gpu="0") is None
        assert value(families, "DCGM_FI_DEV_GPU_UTIL", gpu="0") is None
        assert value(families, "DCGM_FI_DEV_FB_USED", gpu="0") == 70 * 1024  # the rest is there
    assert len([r for r in caplog.records if "wrong type" in r.getMessage()]) == 2  # per GPU
    assert len([r for r in caplog.records if "utilisation" in r.getMessage()]) == 2
    assert source.fast_readings() == []


def test_xid_events_unsupported_leave_the_gauge_out(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    devices[0].fail["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    families = scrape(make_source(devices))
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", gpu="0") is None
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0.0


def test_process_metrics_with_names_and_attribution_from_proc(
    make_source: Callable[..., NvmlSource], tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    (proc / "1234").mkdir(parents=True)
    (proc / "1234" / "comm").write_text("python\n")
    env = b"HOME=/root\0METRICVAULT_EXPERIMENT=llama-70b-r3\0SLURM_JOB_ID=4242\0RUN=a=b\0"
    (proc / "1234" / "environ").write_bytes(env)
    (proc / "77").mkdir()
    (proc / "77" / "comm").write_text("torchrun\n")  # environ unreadable: no attribution
    devices = two_gpus()
    devices[0].processes = [(1234, 30 * GIB), (77, None), (555, 2 * GIB)]  # 555: no /proc entry
    devices[0].samples = [(1234, 10, 50), (1234, 20, 70), (77, 15, 9)]
    source = make_source(devices)

    families = scrape(source)
    memory = families["metricvault_gpu_process_memory_bytes"].samples
    by_pid = {s.labels["pid"]: s for s in memory}
    assert set(by_pid) == {"1234", "555"}  # 77's memory is unknown (None)
    assert by_pid["1234"].value == 30 * GIB
    assert by_pid["1234"].labels == {
        "pid": "1234",
        "process_name": "python",
        "experiment": "llama-70b-r3",
        "job": "4242",
        "gpu": "0",
        "UUID": devices[0].uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node01",
    }
    assert "process_name" not in by_pid["555"].labels
    util = {s.labels["pid"]: s for s in families["metricvault_gpu_process_sm_util"].samples}
    assert util["1234"].value == 60.0  # mean of the samples since the previous scrape
    assert util["77"].value == 9.0 and util["77"].labels["process_name"] == "torchrun"
    assert "experiment" not in util["77"].labels

    # No new samples: utilisation is absent, memory stays; only new samples count.
    families = scrape(source)
    assert "metricvault_gpu_process_sm_util" not in families
    assert len(families["metricvault_gpu_process_memory_bytes"].samples) == 2
    devices[0].samples.append((1234, 30, 10))
    util_samples = scrape(source)["metricvault_gpu_process_sm_util"].samples
    assert [(s.labels["pid"], s.value) for s in util_samples] == [("1234", 10.0)]


def test_process_attribution_variables_are_configurable(
    make_source: Callable[..., NvmlSource], tmp_path: Path
) -> None:
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    (proc / "environ").write_bytes(b"MY_RUN=sweep-3\0SLURM_JOB_ID=1\0")
    devices = two_gpus()
    devices[1].processes = [(42, GIB)]
    source = make_source(devices, env_labels={"MY_RUN": "experiment"})
    (sample,) = scrape(source)["metricvault_gpu_process_memory_bytes"].samples
    assert sample.labels["experiment"] == "sweep-3" and "job" not in sample.labels
    assert sample.labels["gpu"] == "1"


def test_fast_readings_are_util_and_watts_with_the_exported_labels(
    make_source: Callable[..., NvmlSource],
) -> None:
    devices = two_gpus()
    devices[1].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = make_source(devices)
    readings = source.fast_readings()
    assert [(r.metric, dict(r.labels)["gpu"], r.value) for r in readings] == [
        ("DCGM_FI_DEV_GPU_UTIL", "0", 87.0),
        ("DCGM_FI_DEV_POWER_USAGE", "0", 412.345),
        ("DCGM_FI_DEV_GPU_UTIL", "1", 87.0),
    ]
    exported = scrape(source)["DCGM_FI_DEV_GPU_UTIL"].samples[0].labels
    assert readings[0].labels == tuple(sorted(exported.items()))
    assert all(isinstance(r, FastReading) for r in readings)


def test_fast_readings_do_not_call_slow_nvml_functions(
    make_source: Callable[..., NvmlSource],
) -> None:
    source = make_source(two_gpus())
    fake = pynvml.nvmlDeviceGetPowerUsage.__self__
    fake.calls.clear()
    source.fast_readings()
    assert set(fake.calls) == {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage"}


def test_pcie_throughput_can_be_switched_off(make_source: Callable[..., NvmlSource]) -> None:
    families = scrape(make_source(two_gpus(), pcie_throughput=False, xid_events=False))
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in families
    assert "DCGM_FI_DEV_XID_ERRORS" not in families
    assert "DCGM_FI_DEV_GPU_UTIL" in families


def test_scrapes_and_fast_readings_may_run_concurrently(
    make_source: Callable[..., NvmlSource],
) -> None:
    source = make_source(two_gpus())
    errors: list[BaseException] = []

    def sample() -> None:
        try:
            for _ in range(50):
                source.fast_readings()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=sample) for _ in range(2)]
    for thread in threads:
        thread.start()
    for _ in range(10):
        scrape(source)
    for thread in threads:
        thread.join()
    assert not errors


# -- SimulatedGpuSource -----------------------------------------------------------------------

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_simulated_source_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> list[str]:
        clock = FakeClock()
        source = SimulatedGpuSource(gpus=4, hostname="sim01", seed=seed, clock=clock)
        texts = []
        for _ in range(3):
            texts.append(render(source))
            clock.now += 15.0
        return texts

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_simulated_series_all_carry_simulated_true_and_nvml_names() -> None:
    source = SimulatedGpuSource(gpus=8, hostname="sim01", clock=FakeClock())
    text = render(source)
    families = scrape(source)
    assert set(families) <= {n.removesuffix("_total") for n in METRICS}
    for name in DCGM_COUNTERS & set(families):
        assert f"# TYPE {name} counter\n" in text
    for family in families.values():
        assert len(family.samples) == 8, family.name
        for sample in family.samples:
            assert sample.labels["simulated"] == "true"
            assert sample.labels["Hostname"] == "sim01"
            assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
            assert sample.labels["UUID"].startswith("GPU-")
    uuids = {s.labels["UUID"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert len(uuids) == 8
    other_host = scrape(SimulatedGpuSource(gpus=8, hostname="sim02", clock=FakeClock()))
    assert not uuids & {s.labels["UUID"] for s in other_host["DCGM_FI_DEV_GPU_UTIL"].samples}
    for sample in scrape(SimulatedGpuSource(gpus=1, hostname_label="hostname"))[
        "DCGM_FI_DEV_GPU_UTIL"
    ].samples:
        assert "hostname" in sample.labels and "Hostname" not in sample.labels


def test_simulated_values_are_in_range_and_energy_grows() -> None:
    clock = FakeClock()
    source = SimulatedGpuSource(gpus=8, hostname="sim01", clock=clock)
    previous: dict[str, float] = {}
    for _ in range(4):
        families = scrape(source)
        for gpu in map(str, range(8)):
            util = value(families, "DCGM_FI_DEV_GPU_UTIL", gpu=gpu)
            power = value(families, "DCGM_FI_DEV_POWER_USAGE", gpu=gpu)
            temp = value(families, "DCGM_FI_DEV_GPU_TEMP", gpu=gpu)
            used = value(families, "DCGM_FI_DEV_FB_USED", gpu=gpu)
            free = value(families, "DCGM_FI_DEV_FB_FREE", gpu=gpu)
            energy = value(families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu=gpu)
            assert util is not None and 0.0 <= util <= 100.0
            assert power is not None and 0.0 < power <= 700.0
            assert temp is not None and 20.0 < temp < 95.0
            assert used is not None and free is not None and used + free == FB_TOTAL_MIB
            assert energy is not None
            if gpu in previous:
                # 15 s at 60-700 W: 0.9-10.5 kJ more.
                assert 0.9e6 <= energy - previous[gpu] <= 10.5e6
            previous[gpu] = energy
        clock.now += 15.0
    # An hour into its job the node trains: busy GPUs.
    assert value(families, "DCGM_FI_DEV_GPU_UTIL", gpu="0") >= 90.0  # type: ignore[operator]


def test_simulated_clock_going_back_or_jumping_keeps_the_counter_monotonic() -> None:
    clock = FakeClock()
    source = SimulatedGpuSource(gpus=2, hostname="sim01", clock=clock)
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    first = value(scrape(source), energy, gpu="0")
    clock.now -= 30.0
    assert value(scrape(source), energy, gpu="0") == first
    clock.now += 10 * 86_400.0  # a suspended laptop: skipped, not simulated step by step
    later = value(scrape(source), energy, gpu="0")
    assert first is not None and later is not None and later > first
    # Skipped means the simulation carries on with its next step: the counter rises exactly as
    # much as a twin source's does over one second (ten simulated days would add ~10^6 times).
    twin_clock = FakeClock()
    twin = SimulatedGpuSource(gpus=2, hostname="sim01", clock=twin_clock)
    twin_first = value(scrape(twin), energy, gpu="0")
    twin_clock.now += 1.0
    twin_later = value(scrape(twin), energy, gpu="0")
    assert twin_first == first and twin_later is not None
    assert later - first == twin_later - twin_first


def test_simulated_fast_readings_match_the_exported_values() -> None:
    source = SimulatedGpuSource(gpus=2, hostname="sim01", clock=FakeClock())
    readings = source.fast_readings()
    assert [(r.metric, dict(r.labels)["gpu"]) for r in readings] == [
        ("DCGM_FI_DEV_GPU_UTIL", "0"),
        ("DCGM_FI_DEV_POWER_USAGE", "0"),
        ("DCGM_FI_DEV_GPU_UTIL", "1"),
        ("DCGM_FI_DEV_POWER_USAGE", "1"),
    ]
    families = scrape(source)
    for reading in readings:
        labels = dict(reading.labels)
        assert labels["simulated"] == "true"
        assert value(families, reading.metric, **labels) == reading.value
    source.close()


def test_nvml_is_split_by_job_and_keeps_its_names() -> None:
    """Discovery, readings, per-process attribution and XID events are modules of their own;
    the package keeps its names, and their log lines stay under its logger."""
    import importlib

    from metricvault.collect.sources import nvml

    assert nvml.NvmlSource is NvmlSource
    assert nvml.DEFAULT_ENV_LABELS["SLURM_JOB_ID"] == "job" and nvml.XID_WAIT_MS > 0
    for part in ("calls", "devices", "fields", "processes", "xid"):
        module = importlib.import_module(f"{NVML_LOG}.{part}")
        assert module.__name__.startswith(NVML_LOG + ".")  # a child of the documented logger
