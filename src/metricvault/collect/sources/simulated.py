"""Simulated GPUs for machines without any, under the same names and labels as `NvmlSource`.

The values come from the cluster simulator's GPU model (`metricvault.sim.gpu.NodeSimulator`),
run live: one node whose GPUs hold one long training job (startup, training, a checkpoint every
2 h, an evaluation every 6 h), stepped once per second of the clock. The source starts an hour
into the job, past its startup; the energy counter integrates the simulated power and only
grows. For a given seed, the values depend only on the seconds since the source started.

Every series carries ``simulated="true"``: simulated data must never pass for a measurement.
The model has no NVLink, PCIe traffic or GPU processes, so those metrics are absent; the error
counters a healthy GPU reports (ECC, remapped rows, PCIe replays, XID) are exported as 0.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from metricvault.collect.families import Metric
from metricvault.collect.sources import FastReading
from metricvault.collect.sources._labels import (
    HEALTHY_ZEROS,
    HOSTNAME_LABEL,
    SIMULATED_LABEL,
    FamilyBuilder,
    gpu_labels,
    label_pairs,
    simulated_bus_id,
)
from metricvault.sim import noise
from metricvault.sim.gpu import GPU_METRICS, NodeSimulator
from metricvault.sim.plan import make_plan
from metricvault.sim.spec import LLAMA_70B_FLOPS_PER_TOKEN, ClusterSpec, JobSpec
from metricvault.sim.uuids import gpu_uuid

STEP_S = 1  # one simulator step per second of the clock
JOB_DAYS = 365  # the simulated job's planned length; the GPUs idle after it
WARMUP_S = 3600  # how far into its job the node is when the source starts
MAX_CATCH_UP_S = 86_400  # a longer clock jump is skipped instead of simulated step by step
_CHUNK_STEPS = 3600  # steps simulated at once while catching up (bounds memory)
MEM_CLOCK_MHZ = 2619.0  # an H100 SXM's HBM3 clock; it does not drop at idle
_POWER_THROTTLE_W = 640.0  # where sim.gpu's clock model starts to pull the SM clock down
_GPU_IDLE, _SW_POWER_CAP = 0x1, 0x4  # nvmlClocksThrottleReasonGpuIdle / ...SwPowerCap
# PCI bus numbers of the eight GPUs of an HGX H100 board, for realistic pci_bus_id labels.
_ROW = {name: row for row, name in enumerate(GPU_METRICS)}


class SimulatedGpuSource:
    """``gpus`` simulated GPUs of this host (see the module doc)."""

    name = "simulated-gpu"

    def __init__(
        self,
        gpus: int = 8,
        hostname: str | None = None,
        seed: int = 0,
        hostname_label: str = HOSTNAME_LABEL,
        clock: Callable[[], float] = time.time,
        model_name: str = "NVIDIA H100 80GB HBM3",
    ) -> None:
        """``clock`` returns seconds (``time.time``); tests pass a fake one.

        Raises `metricvault.errors.ConfigError` for ``gpus`` outside 1..64.
        """
        job = JobSpec("simulated", (0,), 0, JOB_DAYS * 86_400, LLAMA_70B_FLOPS_PER_TOKEN, 1000.0)
        spec = ClusterSpec(
            nodes=1, gpus_per_node=gpus, days=JOB_DAYS + 1, interval_s=STEP_S, seed=seed,
            jobs=(job,), model_name=model_name,
        )  # fmt: skip
        # A live source has no failed scrapes and no node reboot: drop those events of the plan.
        plan = dataclasses.replace(make_plan(spec), gaps=((),), restart=None)
        self._node = NodeSimulator(plan, 0)
        self._clock = clock
        self._origin = math.floor(clock()) - WARMUP_S  # the clock second of step 0
        self._lock = threading.Lock()
        self._values: NDArray[np.float64] = np.zeros((len(GPU_METRICS), gpus))
        host = hostname or socket.gethostname()
        # UUIDs differ between hosts with the same seed, as real GPUs' do.
        node_id = zlib.crc32(host.encode())
        self._labels = [
            {
                **gpu_labels(
                    index=g, uuid=gpu_uuid(seed, node_id, g), pci_bus_id=_bus_id(g),
                    model_name=model_name, hostname=host, hostname_label=hostname_label,
                ),
                SIMULATED_LABEL[0]: SIMULATED_LABEL[1],
            }
            for g in range(gpus)
        ]  # fmt: skip
        self._pairs = [label_pairs(labels) for labels in self._labels]
        rng = np.random.default_rng(noise.key(seed, "rng", "simulated-source", node_id))
        # HBM runs a few degrees warmer than the GPU die under the same cooling.
        self._memory_temp_offset = np.rint(rng.uniform(4.0, 9.0, size=gpus))
        self._advance()

    def collect(self) -> Iterable[Metric]:
        values = self._advance()
        out = FamilyBuilder()
        for g, labels in enumerate(self._labels):
            for name, row in _ROW.items():
                out.add(name, labels, values[row, g])
            temp = values[_ROW["DCGM_FI_DEV_GPU_TEMP"], g]
            out.add("DCGM_FI_DEV_MEMORY_TEMP", labels, temp + self._memory_temp_offset[g])
            out.add("DCGM_FI_DEV_MEM_CLOCK", labels, MEM_CLOCK_MHZ)
            out.add("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", labels, _throttle(values[:, g]))
            for name in HEALTHY_ZEROS:
                out.add(name, labels, 0.0)
        return out.families()

    def fast_readings(self) -> Sequence[FastReading]:
        values = self._advance()
        util, power = _ROW["DCGM_FI_DEV_GPU_UTIL"], _ROW["DCGM_FI_DEV_POWER_USAGE"]
        readings = []
        for g, pairs in enumerate(self._pairs):
            readings.append(FastReading("DCGM_FI_DEV_GPU_UTIL", pairs, float(values[util, g])))
            readings.append(FastReading("DCGM_FI_DEV_POWER_USAGE", pairs, float(values[power, g])))
        return readings

    def close(self) -> None:
        pass

    def _advance(self) -> NDArray[np.float64]:
        """The values of the current step, simulating the steps since the previous call."""
        now = math.floor(self._clock())
        with self._lock:
            step = now - self._origin
            behind = step - self._node.next_step
            if behind > MAX_CATCH_UP_S // STEP_S:
                # A suspended machine or a clock jump: carry on from where the simulation was.
                self._origin = now - self._node.next_step
                step = self._node.next_step
            while self._node.next_step <= step:  # a clock that went back changes nothing
                first = self._node.next_step
                _, values = self._node.chunk(first, min(step + 1, first + _CHUNK_STEPS))
                self._values = values[:, :, -1]
            return self._values


def _throttle(values: NDArray[np.float64]) -> float:
    """The clock throttle reasons NVML would report for one GPU's simulated values."""
    if values[_ROW["DCGM_FI_DEV_GPU_UTIL"]] == 0.0:
        return float(_GPU_IDLE)
    if values[_ROW["DCGM_FI_DEV_POWER_USAGE"]] > _POWER_THROTTLE_W:
        return float(_SW_POWER_CAP)
    return 0.0


def _bus_id(gpu: int) -> str:
    return simulated_bus_id(gpu)
