"""The concrete events of a simulated run: time grid, scrape offsets, gaps, restart, job phases.

Everything here is drawn once per spec from ``numpy.random.default_rng`` with sub-seeds derived
from the spec's seed (never from Python's ``hash()``), so the same spec gives the same events.
Times are step indices: step ``k`` is scraped at ``start_ms + k * interval_s * 1000`` plus the
scrape target's constant offset of a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from metricvault.sim import noise
from metricvault.sim.spec import ClusterSpec, JobSpec, validate_spec

I8 = NDArray[np.int8]
BoolArray = NDArray[np.bool_]

# Phases of a GPU (and of the job holding it).
IDLE, STARTUP, TRAIN, CHECKPOINT, EVAL = 0, 1, 2, 3, 4
PHASE_NAMES = ("idle", "startup", "train", "checkpoint", "eval")

STARTUP_S = 240  # loading the model / the checkpoint before the first step
CHECKPOINT_EVERY_S = 2 * 3600
CHECKPOINT_MIN_S, CHECKPOINT_MAX_S = 120, 180
EVAL_EVERY_S = 6 * 3600  # evaluation follows the checkpoint taken at every 6-hour mark
EVAL_S = 600
RESTART_DOWN_S = 300  # a rebooting node reports nothing for this long
RESTART_MIN_DAYS = 2.0
GAPS_PER_NODE_PER_DAY = 1.5
MAX_GAP_STEPS = 6
MAX_SCRAPE_OFFSET_MS = 40


@dataclass(frozen=True)
class Restart:
    """A node reboot: no samples for steps [down_start, down_end); counters restart at zero."""

    node: int
    down_start: int
    down_end: int


@dataclass(frozen=True)
class Plan:
    spec: ClusterSpec
    jobs: tuple[JobSpec, ...]
    n_steps: int
    step_ms: int
    node_offset_ms: tuple[int, ...]
    job_offset_ms: tuple[int, ...]
    gaps: tuple[tuple[tuple[int, int], ...], ...]  # per node: (first step, end step) pairs
    restart: Restart | None

    def jobs_on(self, node: int) -> tuple[int, ...]:
        return tuple(j for j, job in enumerate(self.jobs) if node in job.nodes)


def make_plan(spec: ClusterSpec) -> Plan:
    jobs = validate_spec(spec)
    n_steps = int(spec.days * 86_400 // spec.interval_s)
    offsets = _rng(spec, "scrape-offsets").integers(1, MAX_SCRAPE_OFFSET_MS, size=spec.nodes)
    job_offsets = tuple(
        int(offsets[job.nodes[0]]) + 1 + j % (MAX_SCRAPE_OFFSET_MS // 2)
        for j, job in enumerate(jobs)
    )
    return Plan(
        spec=spec,
        jobs=jobs,
        n_steps=n_steps,
        step_ms=spec.interval_s * 1000,
        node_offset_ms=tuple(int(o) for o in offsets),
        job_offset_ms=job_offsets,
        gaps=tuple(_draw_gaps(spec, node, n_steps) for node in range(spec.nodes)),
        restart=_draw_restart(spec, n_steps),
    )


def _rng(spec: ClusterSpec, *purpose: object) -> np.random.Generator:
    return np.random.default_rng(noise.key(spec.seed, "rng", *purpose))


def _draw_gaps(spec: ClusterSpec, node: int, n_steps: int) -> tuple[tuple[int, int], ...]:
    # At least one gap per node, so every run has one to test against.
    rng = _rng(spec, "gaps", node)
    count = max(1, int(rng.poisson(GAPS_PER_NODE_PER_DAY * spec.days)))
    starts = np.sort(rng.integers(0, n_steps, size=count))
    lengths = rng.integers(1, MAX_GAP_STEPS + 1, size=count)
    return tuple((int(s), min(n_steps, int(s + n))) for s, n in zip(starts, lengths, strict=True))


def _draw_restart(spec: ClusterSpec, n_steps: int) -> Restart | None:
    if spec.days < RESTART_MIN_DAYS:
        return None
    rng = _rng(spec, "restart")
    node = int(rng.integers(0, spec.nodes))
    start = int(rng.integers(int(0.4 * n_steps), int(0.6 * n_steps)))
    down_steps = -(-RESTART_DOWN_S // spec.interval_s)
    return Restart(node, start, start + down_steps)


def node_present(plan: Plan, node: int, steps: NDArray[np.int64]) -> BoolArray:
    """True where the node's scrape succeeded (no gap, not rebooting)."""
    present = np.ones(len(steps), dtype=np.bool_)
    first, end = (int(steps[0]), int(steps[-1]) + 1) if len(steps) else (0, 0)
    windows = list(plan.gaps[node])
    if plan.restart is not None and plan.restart.node == node:
        windows.append((plan.restart.down_start, plan.restart.down_end))
    for start, stop in windows:
        if start < end and stop > first:
            present[max(start, first) - first : min(stop, end) - first] = False
    return present


@dataclass(frozen=True)
class JobTimeline:
    """A job over a range of steps: its phase, whether its processes run, seconds since start."""

    phase: I8
    alive: BoolArray
    since_start_s: NDArray[np.float64]


def job_timeline(plan: Plan, j: int, steps: NDArray[np.int64]) -> JobTimeline:
    job = plan.jobs[j]
    tau = steps * plan.spec.interval_s - job.start_offset_s
    alive = (tau >= 0) & (tau < job.duration_s)
    since = tau.astype(np.float64)
    phase = np.full(len(steps), TRAIN, dtype=np.int8)
    checkpoint_n = tau // CHECKPOINT_EVERY_S
    in_checkpoint = (checkpoint_n >= 1) & (
        tau - checkpoint_n * CHECKPOINT_EVERY_S < checkpoint_seconds(plan, j, checkpoint_n)
    )
    eval_n = tau // EVAL_EVERY_S
    eval_from = tau - eval_n * EVAL_EVERY_S - checkpoint_seconds(plan, j, eval_n * 3)
    in_eval = (eval_n >= 1) & (eval_from >= 0) & (eval_from < EVAL_S)
    phase[in_checkpoint] = CHECKPOINT
    phase[in_eval] = EVAL
    phase[tau < STARTUP_S] = STARTUP
    restart = plan.restart
    if restart is not None and restart.node in job.nodes:
        # The job dies with the node and resumes from its checkpoint once the node is back.
        down = (steps >= restart.down_start) & (steps < restart.down_end)
        since_back = (steps - restart.down_end) * plan.spec.interval_s
        resuming = alive & (since_back >= 0) & (since_back < STARTUP_S)
        alive = alive & ~down
        phase[resuming] = STARTUP
        since = np.where(resuming, since_back, since)
    phase[~alive] = IDLE
    return JobTimeline(phase, alive, since)


def checkpoint_seconds(plan: Plan, j: int, index: NDArray[np.int64]) -> NDArray[np.int64]:
    """How long checkpoint number ``index`` of job ``j`` takes (120-180 s)."""
    spread = CHECKPOINT_MAX_S - CHECKPOINT_MIN_S + 1
    draws = noise.hashes(np.array([noise.key(plan.spec.seed, "ckpt", j)], np.uint64), index)[0]
    seconds: NDArray[np.int64] = CHECKPOINT_MIN_S + (draws % np.uint64(spread)).astype(np.int64)
    return seconds


@dataclass(frozen=True)
class NodeTimeline:
    phase: I8
    job: NDArray[np.int64]  # index into plan.jobs, -1 where no job holds the node
    since_start_s: NDArray[np.float64]


def node_timeline(plan: Plan, node: int, steps: NDArray[np.int64]) -> NodeTimeline:
    phase = np.full(len(steps), IDLE, dtype=np.int8)
    job = np.full(len(steps), -1, dtype=np.int64)
    since = np.zeros(len(steps), dtype=np.float64)
    for j in plan.jobs_on(node):
        timeline = job_timeline(plan, j, steps)
        phase = np.where(timeline.alive, timeline.phase, phase)
        job[timeline.alive] = j
        since = np.where(timeline.alive, timeline.since_start_s, since)
    return NodeTimeline(phase, job, since)


def job_emits(plan: Plan, j: int, steps: NDArray[np.int64]) -> BoolArray:
    """True where the job's training series have a sample (alive, rank 0 scraped)."""
    alive = job_timeline(plan, j, steps).alive
    return alive & node_present(plan, plan.jobs[j].nodes[0], steps)
