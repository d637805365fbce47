"""What the GPU sources share: dcgm-exporter's metric names, types, help texts and labels.

Both `NvmlSource` and `SimulatedGpuSource` export through `FamilyBuilder`, so a metric has one
type and one help text whichever source produced it, and dashboards built on one work on the
other.

dcgm-exporter exports its cumulative fields as counters *without* a ``_total`` suffix (e.g.
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``). prometheus-client's text exposition always writes
``<name>_total`` in a counter's ``# HELP``/``# TYPE`` lines, which would leave the samples without
metadata; `BareCounterName` keeps those lines on the bare name (see there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from metricvault.collect.families import Metric

HOSTNAME_LABEL = "Hostname"  # dcgm-exporter < 3.3; newer versions call it "hostname"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
MIG_ID_LABEL = "GPU_I_ID"

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class MetricInfo:
    kind: Kind
    help: str


def _gauge(text: str) -> MetricInfo:
    return MetricInfo("gauge", text)


def _counter(text: str) -> MetricInfo:
    return MetricInfo("counter", text)


# Help texts are dcgm-exporter's (etc/dcp-metrics-included.csv) where it has the metric.
METRICS: dict[str, MetricInfo] = {
    "DCGM_FI_DEV_GPU_UTIL": _gauge("GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": _gauge("Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": _gauge("Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": _gauge("Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": _gauge("Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_GPU_TEMP": _gauge("GPU temperature (in C)."),
    "DCGM_FI_DEV_MEMORY_TEMP": _gauge("Memory temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": _gauge("Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _counter(
        "Total energy consumption since boot (in mJ)."
    ),
    "DCGM_FI_DEV_SM_CLOCK": _gauge("SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": _gauge("Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _counter("Total number of PCIe retries."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _gauge(
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second."
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _gauge(
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second."
    ),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _counter(
        "NVLink data transmitted plus received over all links since the driver loaded (in KiB)."
    ),
    "DCGM_FI_DEV_XID_ERRORS": _gauge("Value of the last XID error encountered."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _counter("Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _counter("Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _counter("Total number of single-bit persistent ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _counter("Total number of double-bit persistent ECC errors."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _counter(
        "Number of remapped rows for correctable errors"
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _counter(
        "Number of remapped rows for uncorrectable errors"
    ),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": _gauge("Whether rows are pending remapping (a GPU reset)."),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": _gauge("Whether remapping of rows has failed"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _gauge(
        "Current clock throttle reasons (bitmask of nvmlClocksThrottleReason* / "
        "nvmlClocksEventReason* flags)."
    ),
    "DCGM_FI_PROF_SM_ACTIVE": _gauge("The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _gauge("Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": _gauge(
        "Ratio of cycles the device memory interface is active sending or receiving data."
    ),
    "metricvault_gpu_lost": _gauge(
        "1 while NVML reports the GPU lost (fallen off the bus); its other metrics are absent."
    ),
    "metricvault_gpu_xid_errors_total": _counter(
        "XID errors NVML reported since the agent started, by XID."
    ),
    "metricvault_gpu_process_memory_bytes": _gauge("GPU memory a process holds (in bytes)."),
    "metricvault_gpu_process_sm_util": _gauge(
        "A process's share of SM time since the previous scrape (in %)."
    ),
}


class BareCounterName(str):
    """A counter's name that prometheus-client's text exposition must not suffix with ``_total``.

    ``generate_latest`` writes ``metric.name + "_total"`` into a counter's HELP and TYPE lines.
    For dcgm-exporter's counters the samples are named without the suffix, so that concatenation
    alone returns the bare name: HELP, TYPE and samples then agree (``# TYPE X counter`` and
    ``X{...}``), as in dcgm-exporter's own output. Every other use behaves as a plain ``str``.
    """

    __slots__ = ()

    def __add__(self, other: str) -> str:
        if other == "_total":
            return str(self)
        return str(self) + other


def new_family(name: str) -> Metric:
    """An empty metric family for one of `METRICS`."""
    info = METRICS[name]
    if info.kind == "gauge":
        return Metric(name, info.help, "gauge")
    if name.endswith("_total"):
        return Metric(name[: -len("_total")], info.help, "counter")
    family = Metric(name, info.help, "counter")
    family.name = BareCounterName(name)
    return family


class FamilyBuilder:
    """Collects samples by metric name and hands them out as metric families."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = new_family(name)
        family.add_sample(name, dict(labels), float(value))

    def families(self) -> list[Metric]:
        return list(self._families.values())


def gpu_labels(
    *,
    index: int,
    uuid: str,
    pci_bus_id: str,
    model_name: str,
    hostname: str,
    hostname_label: str = HOSTNAME_LABEL,
) -> dict[str, str]:
    """dcgm-exporter's labels of a GPU's series; an unknown (empty) value leaves its label out."""
    labels = {
        "gpu": str(index),
        "UUID": uuid,
        "pci_bus_id": pci_bus_id,
        "device": f"nvidia{index}",
        "modelName": model_name,
        hostname_label: hostname,
    }
    return {name: value for name, value in labels.items() if value}


def label_pairs(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Labels as `FastReading` carries them: sorted (name, value) pairs."""
    return tuple(sorted(labels.items()))


# Simulated GPU sources (the numpy model and the edge agent's light one) share these.
SIMULATED_LABEL = ("simulated", "true")

# The PCI buses of an HGX board's eight GPUs: both simulated sources label GPU g alike.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def simulated_bus_id(gpu: int) -> str:
    bus = _HGX_BUSES[gpu] if gpu < len(_HGX_BUSES) else 0x100 + gpu
    return f"00000000:{bus:02X}:00.0"


# What a healthy GPU reports: no errors, not lost.
HEALTHY_ZEROS = (
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_XID_ERRORS",
    "metricvault_gpu_lost",
)
