"""dcgm-exporter metrics of one simulated node, computed for a range of steps at once.

Each metric is a (gpus, steps) array derived from the node's phase (idle, startup, train,
checkpoint, eval), per-GPU constants and counter-based noise. Temperature follows power through a
thermal lag; the energy counter integrates power and is the only state carried between chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from metricvault.sim import noise
from metricvault.sim.plan import (
    IDLE,
    STARTUP,
    STARTUP_S,
    TRAIN,
    Plan,
    node_present,
    node_timeline,
)
from metricvault.sim.spec import FB_TOTAL_MIB
from metricvault.sim.training import job_mfu

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

GPU_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
)
ENERGY_METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"

# Per phase:            idle  startup train  ckpt   eval
_UTIL_MEAN = np.array([0.0, 18.0, 97.0, 6.0, 55.0])
_UTIL_SD = np.array([0.3, 8.0, 2.5, 3.0, 8.0])
_UTIL_LOW = np.array([0.0, 0.0, 90.0, 0.0, 30.0])
_COPY_MEAN = np.array([0.0, 6.0, 38.0, 14.0, 20.0])
_COPY_SD = np.array([0.2, 3.0, 5.0, 4.0, 5.0])
_SM_SHARE = np.array([0.0, 0.7, 0.93, 0.6, 0.85])  # SM active as a share of "a kernel ran"
_SM_SD = np.array([0.0, 0.03, 0.015, 0.01, 0.03])
_TENSOR_MEAN = np.array([0.0, 0.04, 0.0, 0.01, 0.20])  # train: from the job's mfu
_TENSOR_SD = np.array([0.0, 0.01, 0.012, 0.004, 0.03])
_DRAM_MEAN = np.array([0.0, 0.10, 0.36, 0.03, 0.25])
_DRAM_SD = np.array([0.0, 0.03, 0.03, 0.01, 0.04])
_POWER_EXTRA_W = np.array([0.0, 60.0, 0.0, 70.0, 40.0])  # host copies, I/O wake-ups
_POWER_SD_W = np.array([0.8, 12.0, 9.0, 8.0, 12.0])
_POWER_DRIFT_W = np.array([0.5, 5.0, 14.0, 5.0, 10.0])
_FB_EXTRA_MIB = np.array([0.0, 0.0, 0.0, 600.0, 1800.0])  # pinned buffers, eval batches

POWER_CAP_W = 700.0
DYNAMIC_POWER_W = 620.0
IDLE_CLOCK_MHZ, MAX_CLOCK_MHZ, MIN_BUSY_CLOCK_MHZ, CLOCK_STEP_MHZ = 345, 1980, 1395, 15
THERMAL_TAU_S = 90.0
KELVIN_PER_WATT = 0.052
FB_HEADROOM_MIB = 600


@dataclass(frozen=True)
class GpuConstants:
    """What differs between the GPUs of a node and stays put: cooling, silicon, memory use."""

    ambient_c: F64  # (gpus,)
    idle_power_w: F64
    power_scale: F64
    fb_used_mib: F64  # (jobs, gpus): memory a job's processes hold on each GPU
    energy_start_mj: I64


def gpu_constants(plan: Plan, node: int) -> GpuConstants:
    rng = np.random.default_rng(noise.key(plan.spec.seed, "rng", "gpu-constants", node))
    gpus = plan.spec.gpus_per_node
    room = rng.uniform(-1.5, 1.5)
    return GpuConstants(
        ambient_c=27.0 + room + rng.uniform(0.0, 4.0, size=gpus),
        idle_power_w=rng.uniform(63.0, 77.0, size=gpus),
        power_scale=rng.uniform(0.95, 1.05, size=gpus),
        fb_used_mib=np.rint(rng.uniform(72_500.0, 76_500.0, size=(max(1, len(plan.jobs)), gpus))),
        # The counter counts since the driver loaded, days before the simulated run.
        energy_start_mj=rng.integers(2 * 10**9, 60 * 10**9, size=gpus),
    )


class NodeSimulator:
    """Yields one node's GPU metrics chunk by chunk, carrying the energy counters along."""

    def __init__(self, plan: Plan, node: int) -> None:
        self.plan = plan
        self.node = node
        self.constants = gpu_constants(plan, node)
        self.energy_mj = self.constants.energy_start_mj.copy()
        self.next_step = 0
        gpus = plan.spec.gpus_per_node
        self._keys = {
            purpose: noise.keys(plan.spec.seed, "gpu", node, purpose, count=gpus)
            for purpose in (
                "util", "copy", "sm", "tensor", "dram", "power", "drift", "clock", "temp",
                "fb", "room",
            )
        }  # fmt: skip
        self._lag_steps = max(1, int(np.ceil(5 * THERMAL_TAU_S / plan.spec.interval_s)))

    def chunk(self, first: int, end: int) -> tuple[NDArray[np.int64], F64]:
        """Steps [first, end): the present steps and values of shape (metrics, gpus, present)."""
        if first != self.next_step:
            raise ValueError(f"chunks must be consecutive: expected step {self.next_step}")
        self.next_step = end
        lead = min(first, self._lag_steps)
        steps = np.arange(first - lead, end, dtype=np.int64)
        values = self._metrics(steps, lead)
        present = node_present(self.plan, self.node, steps[lead:])
        return steps[lead:][present], values[:, :, present]

    def _metrics(self, steps: I64, lead: int) -> F64:
        timeline = node_timeline(self.plan, self.node, steps)
        phase = timeline.phase
        z = {purpose: noise.normal(k, steps) for purpose, k in self._keys.items()}
        util = np.clip(
            np.rint(_UTIL_MEAN[phase] + _UTIL_SD[phase] * z["util"]), _UTIL_LOW[phase], 100.0
        )
        copy = np.clip(np.rint(_COPY_MEAN[phase] + _COPY_SD[phase] * z["copy"]), 0.0, 100.0)
        sm = np.clip(util / 100.0 * _SM_SHARE[phase] + _SM_SD[phase] * z["sm"], 0.0, util / 100.0)
        tensor_mean = np.where(phase == TRAIN, self._train_tensor(steps, timeline.job), 0.0)
        tensor = np.clip(
            tensor_mean + _TENSOR_MEAN[phase] + _TENSOR_SD[phase] * z["tensor"], 0.0, sm
        )
        dram = np.clip(_DRAM_MEAN[phase] + _DRAM_SD[phase] * z["dram"], 0.0, 1.0)
        power = np.round(self._power(steps, phase, sm, tensor, z["power"]), 3)  # as reported
        clock = self._clock(phase, power, z["clock"])
        temp = self._temperature(steps, power, z["temp"])
        fb_used = self._fb_used(steps, timeline.job, phase, timeline.since_start_s)
        energy = self._energy(steps[lead:], power[:, lead:])
        rows = (
            util, copy, fb_used, FB_TOTAL_MIB - fb_used, temp, power, clock,
            None, np.round(sm, 6), np.round(tensor, 6), np.round(dram, 6),
        )  # fmt: skip
        gpus, count = len(self.constants.ambient_c), len(steps) - lead
        out = np.empty((len(GPU_METRICS), gpus, count), dtype=np.float64)
        for m, row in enumerate(rows):
            out[m] = energy if row is None else row[:, lead:]
        out += 0.0  # rounding leaves -0.0 where a value was slightly negative; dcgm says 0
        return out

    def _train_tensor(self, steps: I64, job: I64) -> F64:
        tensor = np.zeros(len(steps), dtype=np.float64)
        for j in self.plan.jobs_on(self.node):
            mine = job == j
            if mine.any():
                tensor[mine] = 1.1 * job_mfu(self.plan, j, steps[mine])
        return tensor[None, :]

    def _power(self, steps: I64, phase: NDArray[np.int8], sm: F64, tensor: F64, z: F64) -> F64:
        c = self.constants
        drift = noise.smooth(self._keys["drift"], steps, max(1, 600 // self.plan.spec.interval_s))
        load = 0.6 * sm + 0.4 * np.minimum(1.0, tensor / 0.5)
        power = (
            c.idle_power_w[:, None]
            + _POWER_EXTRA_W[phase]
            + DYNAMIC_POWER_W * c.power_scale[:, None] * load
            + _POWER_DRIFT_W[phase] * drift
            + _POWER_SD_W[phase] * z
        )
        clipped: F64 = np.clip(power, c.idle_power_w[:, None] - 3.0, POWER_CAP_W)
        return clipped

    def _clock(self, phase: NDArray[np.int8], power: F64, z: F64) -> F64:
        # Boost clock until the board nears its power cap, then throttle.
        busy = MAX_CLOCK_MHZ - 3.0 * np.maximum(0.0, power - 640.0) + 6.0 * z
        busy = np.clip(busy, MIN_BUSY_CLOCK_MHZ, MAX_CLOCK_MHZ)
        quantised = CLOCK_STEP_MHZ * np.rint(busy / CLOCK_STEP_MHZ)
        return np.where(phase == IDLE, float(IDLE_CLOCK_MHZ), quantised)

    def _temperature(self, steps: I64, power: F64, z: F64) -> F64:
        interval = self.plan.spec.interval_s
        lag = np.exp(-np.arange(self._lag_steps, dtype=np.float64) * interval / THERMAL_TAU_S)
        lag /= lag.sum()
        padded = np.concatenate([np.repeat(power[:, :1], self._lag_steps - 1, axis=1), power], 1)
        heat = np.stack([np.convolve(row, lag, mode="valid") for row in padded])
        room = noise.smooth(self._keys["room"][:1], steps, max(1, 3600 // interval))
        ambient = self.constants.ambient_c[:, None] + 0.8 * room
        return np.rint(ambient + KELVIN_PER_WATT * heat + 0.35 * z)

    def _fb_used(self, steps: I64, job: I64, phase: NDArray[np.int8], since: F64) -> F64:
        held = self.constants.fb_used_mib[np.maximum(job, 0)].T  # (gpus, steps)
        wobble = 120.0 * noise.smooth(
            self._keys["fb"], steps, max(1, 300 // self.plan.spec.interval_s)
        )
        running = held + _FB_EXTRA_MIB[phase] + wobble
        loading = held * np.minimum(1.0, since / STARTUP_S)
        used = np.where(phase == STARTUP, loading, running)
        used = np.where(phase == IDLE, 0.0, used)
        return np.clip(np.rint(used), 0.0, FB_TOTAL_MIB - FB_HEADROOM_MIB)

    def _energy(self, steps: I64, power: F64) -> F64:
        interval = self.plan.spec.interval_s
        added = np.rint(power * (interval * 1000)).astype(np.int64)
        restart = self.plan.restart
        reset_at = -1
        if restart is not None and restart.node == self.node:
            off = (steps >= restart.down_start) & (steps < restart.down_end)
            added[:, off] = 0  # the board is powered down while the node reboots
            hits = np.flatnonzero(steps == restart.down_end)
            reset_at = int(hits[0]) if len(hits) else -1
        total = np.cumsum(added, axis=1) + self.energy_mj[:, None]
        if reset_at >= 0:
            # The driver reloads: the counter starts again from the first interval's energy.
            before = total[:, reset_at - 1 : reset_at] if reset_at > 0 else self.energy_mj[:, None]
            total[:, reset_at:] -= before
        if total.shape[1]:
            self.energy_mj = total[:, -1].copy()
        return total.astype(np.float64)
