"""Simulated GPUs without numpy, for the edge agent on a machine without a GPU.

`SimulatedGpuSource` runs the cluster simulator's GPU model, which needs numpy (~15 MB of RSS,
more than half the edge agent's budget). This source is a plain-Python stand-in under the same
dcgm-exporter names, types and labels (`FamilyBuilder`, `gpu_labels`), every series labelled
``simulated="true"``: a training job's utilisation (~97 %, a checkpoint dip to ~6 % for one
minute every 20 minutes), power following utilisation, temperatures following power, an
energy counter that integrates the power, DCGM's profiling ratios (SM, tensor pipe and DRAM
active, which the node dashboard plots) following utilisation, and the zeros of a healthy
GPU's error counters.
The values depend only on the seed, the GPU and the clock second, so two agents with the same
seed agree. It is a smoke-test and demo source, not a model: use ``SimulatedGpuSource`` (the
full agent's ``--simulate-gpus``) for realistic data.
"""

from __future__ import annotations

import math
import socket
import time
import zlib
from collections.abc import Callable, Iterable, Sequence

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
from metricvault.errors import ConfigError

MODEL_NAME = "NVIDIA H100 80GB HBM3"
FB_TOTAL_MIB = 81_559.0
CHECKPOINT_EVERY_S, CHECKPOINT_S = 1200, 60
IDLE_W, MAX_W = 70.0, 690.0
MEM_CLOCK_MHZ = 2619.0


class LightSimulatedGpuSource:
    """``gpus`` simulated GPUs of this host (see the module doc)."""

    name = "simulated-gpu"

    def __init__(
        self,
        gpus: int = 8,
        hostname: str | None = None,
        seed: int = 0,
        hostname_label: str = HOSTNAME_LABEL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= gpus <= 64:
            raise ConfigError(f"--simulate-gpus {gpus}: simulate 1 to 64 GPUs")
        host = hostname or socket.gethostname()
        node = zlib.crc32(f"{seed}:{host}".encode())
        node_id = zlib.crc32(host.encode())  # as SimulatedGpuSource: the same GPU's labels
        self._clock = clock
        self._labels = [
            {
                **gpu_labels(
                    index=g,
                    uuid=light_gpu_uuid(seed, node_id, g),
                    pci_bus_id=simulated_bus_id(g),
                    model_name=MODEL_NAME,
                    hostname=host,
                    hostname_label=hostname_label,
                ),
                SIMULATED_LABEL[0]: SIMULATED_LABEL[1],
            }
            for g in range(gpus)
        ]
        self._pairs = [label_pairs(labels) for labels in self._labels]
        self._phase = [(node >> g) % CHECKPOINT_EVERY_S for g in range(gpus)]
        self._started = clock()

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        out = FamilyBuilder()
        for g, labels in enumerate(self._labels):
            util, power = self._util(g, now), self._power(g, now)
            temp = 30.0 + power / 14.0
            used = 0.0 if util == 0.0 else 71_000.0
            out.add("DCGM_FI_DEV_GPU_UTIL", labels, util)
            out.add("DCGM_FI_DEV_MEM_COPY_UTIL", labels, round(util * 0.4))
            out.add("DCGM_FI_DEV_FB_USED", labels, used)
            out.add("DCGM_FI_DEV_FB_FREE", labels, FB_TOTAL_MIB - used)
            out.add("DCGM_FI_DEV_GPU_TEMP", labels, round(temp))
            out.add("DCGM_FI_DEV_MEMORY_TEMP", labels, round(temp) + 6.0)
            out.add("DCGM_FI_DEV_POWER_USAGE", labels, power)
            out.add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, self._energy_mj(g, now))
            out.add("DCGM_FI_DEV_SM_CLOCK", labels, 1980.0 if util else 345.0)
            out.add("DCGM_FI_DEV_MEM_CLOCK", labels, MEM_CLOCK_MHZ)
            # DCGM's profiling ratios (0..1), as the node dashboard plots them: training keeps
            # most SMs busy, the tensor pipe at ~MFU, device memory at the copy utilisation.
            out.add("DCGM_FI_PROF_SM_ACTIVE", labels, round(util * 0.0092, 4))
            out.add("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, round(util * 0.0045, 4))
            out.add("DCGM_FI_PROF_DRAM_ACTIVE", labels, round(util * 0.0038, 4))
            for name in HEALTHY_ZEROS:
                out.add(name, labels, 0.0)
        return out.families()

    def fast_readings(self) -> Sequence[FastReading]:
        now = self._clock()
        readings = []
        for g, pairs in enumerate(self._pairs):
            readings.append(FastReading("DCGM_FI_DEV_GPU_UTIL", pairs, self._util(g, now)))
            readings.append(FastReading("DCGM_FI_DEV_POWER_USAGE", pairs, self._power(g, now)))
        return readings

    def close(self) -> None:
        pass

    def _util(self, gpu: int, now: float) -> float:
        second = math.floor(now) + self._phase[gpu]
        if second % CHECKPOINT_EVERY_S < CHECKPOINT_S:
            return 6.0
        return 95.0 + (zlib.crc32(f"{gpu}:{second}".encode()) % 5)  # 95..99

    def _power(self, gpu: int, now: float) -> float:
        return round(IDLE_W + (MAX_W - IDLE_W) * self._util(gpu, now) / 100.0, 1)

    def _energy_mj(self, gpu: int, now: float) -> float:
        """Energy since the source started, from the mean power of a checkpoint cycle (so it
        only grows, and needs no state)."""
        busy = (CHECKPOINT_EVERY_S - CHECKPOINT_S) / CHECKPOINT_EVERY_S
        mean_util = busy * 97.0 + (1 - busy) * 6.0
        mean_w = IDLE_W + (MAX_W - IDLE_W) * mean_util / 100.0
        return round(max(0.0, now - self._started) * mean_w * 1000.0)


def light_gpu_uuid(seed: int, node: int, gpu: int) -> str:
    """`metricvault.sim.uuids.gpu_uuid` without ``hashlib`` and ``uuid``: importing those
    loads OpenSSL's libcrypto and libuuid, which the edge agent does without (blake2b is
    built into CPython as ``_blake2``)."""
    from _blake2 import blake2b

    digits = blake2b(repr(("gpu-uuid", seed, node, gpu)).encode(), digest_size=16).hexdigest()
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
