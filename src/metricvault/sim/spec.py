"""What a simulated cluster looks like: its nodes, GPUs, time span and the training jobs on it.

Only descriptions live here; `metricvault.sim.plan` turns a spec into the concrete events (scrape
gaps, the node restart, job phases) and `metricvault.sim.workload` into samples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import ConfigError

# Physical constants of an H100 SXM 80GB; the simulator uses them whatever `model_name` says.
FB_TOTAL_MIB = 81559
PEAK_BF16_FLOPS = 989.4e12
LLAMA_70B_FLOPS_PER_TOKEN = 6 * 70e9
MAX_GPUS_PER_NODE = 64


@dataclass(frozen=True)
class JobSpec:
    """One training job: which nodes it holds (whole nodes) and when it runs."""

    name: str  # the value of the `job` label, e.g. "llama-70b-r3"
    nodes: tuple[int, ...]  # node indices (0-based) the job runs on; the first one is rank 0
    start_offset_s: int  # seconds after the cluster start
    duration_s: int
    flops_per_token: float  # model FLOPs per trained token (about 6 x parameters), for mfu
    tokens_per_second_per_gpu: float  # nominal throughput while training


@dataclass(frozen=True)
class ClusterSpec:
    """A simulated GPU cluster; the same spec always yields the same samples."""

    nodes: int = 2
    gpus_per_node: int = 8
    days: float = 14.0
    interval_s: int = 5
    seed: int = 0
    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    jobs: tuple[JobSpec, ...] | None = None  # None -> default_jobs(nodes, days)
    model_name: str = "NVIDIA H100 80GB HBM3"

    @classmethod
    def ending_at(cls, end_ms: int, days: float, **fields: Any) -> ClusterSpec:
        """The spec of ``days`` of data whose last scrape interval ends at ``end_ms`` (moved
        down to a whole interval): the demo's data reaches "now", and a test that gives the
        end and the seed gets the same samples every time."""
        spec = cls(days=days, **fields)
        interval_ms = spec.interval_s * 1000
        end = end_ms // interval_ms * interval_ms
        return dataclasses.replace(spec, start_ms=end - int(days * 86_400_000))

    @property
    def end_ms(self) -> int:
        """Where the data ends (exclusive): ``start_ms`` plus ``days``."""
        return self.start_ms + int(self.days * 86_400_000)

    def resolved_jobs(self) -> tuple[JobSpec, ...]:
        return default_jobs(self.nodes, self.days) if self.jobs is None else self.jobs


def default_jobs(nodes: int, days: float) -> tuple[JobSpec, ...]:
    """Two llama-70b runs sharing the cluster, with idle time before, between and after.

    With two or more nodes, ``llama-70b-r3`` holds the first half of the nodes (rounded up) from
    2 % to 60 % of the run and ``llama-70b-r4`` the other half from 25 % to 95 %; on a single node
    they run one after the other (2-45 % and 50-95 %).
    """
    if nodes < 1:
        raise ConfigError(f"a cluster needs at least 1 node, got nodes={nodes}")
    run_s = days * 86_400
    if nodes == 1:
        first: tuple[int, ...] = (0,)
        second: tuple[int, ...] = (0,)
        window_r3, window_r4 = (0.02, 0.45), (0.50, 0.95)
    else:
        half = (nodes + 1) // 2
        first, second = tuple(range(half)), tuple(range(half, nodes))
        window_r3, window_r4 = (0.02, 0.60), (0.25, 0.95)

    def job(name: str, on: tuple[int, ...], window: tuple[float, float], tps: float) -> JobSpec:
        start = int(window[0] * run_s)
        duration = max(1, int(window[1] * run_s) - start)
        return JobSpec(name, on, start, duration, LLAMA_70B_FLOPS_PER_TOKEN, tps)

    return (
        job("llama-70b-r3", first, window_r3, 1000.0),
        job("llama-70b-r4", second, window_r4, 1120.0),
    )


def validate_spec(spec: ClusterSpec) -> tuple[JobSpec, ...]:
    """Refuse a spec the simulator cannot honour; return its resolved jobs."""
    _check_cluster(spec)
    jobs = spec.resolved_jobs()
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"job names must be unique, got {names}: rename the duplicates")
    for job in jobs:
        _check_job(job, spec.nodes)
    _check_no_overlap(jobs)
    return jobs


def _check_cluster(spec: ClusterSpec) -> None:
    if not 1 <= spec.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise ConfigError(f"gpus_per_node={spec.gpus_per_node} is outside 1..{MAX_GPUS_PER_NODE}")
    if spec.nodes < 1:
        raise ConfigError(f"a cluster needs at least 1 node, got nodes={spec.nodes}")
    if not spec.interval_s >= 1:
        raise ConfigError(f"interval_s={spec.interval_s} must be a whole number of seconds >= 1")
    if not math.isfinite(spec.days):
        raise ConfigError(f"days={spec.days} must be a finite number of days, e.g. 14.0")
    if not spec.days * 86_400 >= spec.interval_s:
        raise ConfigError(
            f"days={spec.days} is shorter than one scrape interval ({spec.interval_s} s); "
            "simulate at least one interval"
        )
    end_ms = spec.start_ms + int(spec.days * 86_400_000)
    if spec.start_ms < MIN_TS_MS or end_ms > MAX_TS_MS:
        raise ConfigError(
            f"start_ms={spec.start_ms} with days={spec.days} leaves the accepted timestamp range "
            f"{MIN_TS_MS}..{MAX_TS_MS} ms (years 1990-2200); pick a start in that range"
        )


def _check_job(job: JobSpec, nodes: int) -> None:
    if not job.name:
        raise ConfigError("a job needs a non-empty name (it becomes the `job` label)")
    bad = [n for n in job.nodes if not 0 <= n < nodes]
    if not job.nodes or bad or len(set(job.nodes)) != len(job.nodes):
        raise ConfigError(
            f"job {job.name!r} has nodes {job.nodes}: give distinct indices in 0..{nodes - 1}"
        )
    if job.start_offset_s < 0 or job.duration_s <= 0:
        raise ConfigError(
            f"job {job.name!r}: start_offset_s={job.start_offset_s} must be >= 0 and "
            f"duration_s={job.duration_s} > 0"
        )
    if not (job.flops_per_token > 0 and job.tokens_per_second_per_gpu > 0):
        raise ConfigError(
            f"job {job.name!r}: flops_per_token and tokens_per_second_per_gpu must be positive"
        )


def _check_no_overlap(jobs: tuple[JobSpec, ...]) -> None:
    for i, first in enumerate(jobs):
        for second in jobs[i + 1 :]:
            shared = set(first.nodes) & set(second.nodes)
            first_end = first.start_offset_s + first.duration_s
            second_end = second.start_offset_s + second.duration_s
            overlap = first.start_offset_s < second_end and second.start_offset_s < first_end
            if shared and overlap:
                raise ConfigError(
                    f"jobs {first.name!r} and {second.name!r} both hold node(s) "
                    f"{sorted(shared)} at the same time; a node belongs to one job at a time"
                )
