"""Training-loop series of one simulated job: loss, learning rate, grad norm, mfu, throughput.

Tokens trained drive everything: the loss follows a power law in tokens, the learning rate a
warmup plus cosine schedule over the job's planned tokens. Outside training steps (startup,
checkpoint, evaluation) throughput and mfu drop to zero and loss and grad norm hold their last
value, as a gauge set by the training loop would.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from metricvault.sim import noise
from metricvault.sim.plan import TRAIN, Plan, job_emits, job_timeline
from metricvault.sim.spec import PEAK_BF16_FLOPS

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

TRAINING_METRICS = (
    "train_loss",
    "learning_rate",
    "grad_norm",
    "mfu",
    "tokens_per_second",
    "train_tokens_total",
    "train_step",
)

PEAK_LR = 1.5e-4
MIN_LR_SHARE = 0.1
WARMUP_SHARE = 0.01  # of the planned tokens
LOSS_TOKENS_SCALE = 2e7
LOSS_EXPONENT = 0.38
LOSS_START = 10.4  # about ln(vocabulary size): the loss of an untrained model
LOSS_SPIKE_CHANCE = 5e-4
GRAD_SPIKE_CHANCE = 1e-3
TOKENS_PER_STEP = 4 * 1024 * 1024  # global batch: 1,024 sequences of 4,096 tokens


def job_efficiency(plan: Plan, j: int, steps: I64) -> F64:
    """The job's throughput relative to nominal: slow drift plus step-to-step jitter."""
    k = np.array([noise.key(plan.spec.seed, "job-efficiency", j)], dtype=np.uint64)
    drift = noise.smooth(k, steps, max(1, 600 // plan.spec.interval_s))[0]
    jitter = noise.normal(k ^ np.uint64(1), steps)[0]
    efficiency: F64 = 1.0 + 0.025 * drift + 0.015 * jitter
    return efficiency


def job_mfu(plan: Plan, j: int, steps: I64) -> F64:
    """Model FLOPs utilisation while training (ignores phases)."""
    job = plan.jobs[j]
    nominal = job.tokens_per_second_per_gpu * job.flops_per_token / PEAK_BF16_FLOPS
    return nominal * job_efficiency(plan, j, steps)


class JobSimulator:
    """Yields one job's training series chunk by chunk, carrying tokens and held gauges."""

    def __init__(self, plan: Plan, j: int) -> None:
        self.plan = plan
        self.j = j
        job = plan.jobs[j]
        self.gpus = len(job.nodes) * plan.spec.gpus_per_node
        self.nominal_tps = job.tokens_per_second_per_gpu * self.gpus
        self.planned_tokens = self.nominal_tps * job.duration_s * 0.9
        rng = np.random.default_rng(noise.key(plan.spec.seed, "rng", "job", j))
        self.loss_floor = float(rng.uniform(1.65, 1.85))
        self.tokens = 0
        self.last_loss = LOSS_START
        self.last_grad = 1.0
        self.next_step = 0
        self._keys = noise.keys(plan.spec.seed, "job", j, count=4)

    def chunk(self, first: int, end: int) -> tuple[I64, F64]:
        """Steps [first, end): the steps with samples and values of shape (metrics, steps)."""
        if first != self.next_step:
            raise ValueError(f"chunks must be consecutive: expected step {self.next_step}")
        self.next_step = end
        steps = np.arange(first, end, dtype=np.int64)
        training = job_timeline(self.plan, self.j, steps).phase == TRAIN
        emits = job_emits(self.plan, self.j, steps)
        if not training.any() and not emits.any():
            return steps[:0], np.empty((len(TRAINING_METRICS), 0))
        tps = np.where(training, self.nominal_tps * job_efficiency(self.plan, self.j, steps), 0.0)
        tokens = self.tokens + np.cumsum(np.rint(tps * self.plan.spec.interval_s).astype(np.int64))
        self.tokens = int(tokens[-1])
        loss = self._held(training, self._loss(steps, tokens), "last_loss")
        grad = self._held(training, self._grad_norm(steps, tokens), "last_grad")
        mfu = tps * self.plan.jobs[self.j].flops_per_token / (self.gpus * PEAK_BF16_FLOPS)
        lr = self._learning_rate(tokens)
        step = (tokens // TOKENS_PER_STEP).astype(np.float64)  # optimizer steps so far
        values = np.stack([loss, lr, grad, mfu, tps, tokens.astype(np.float64), step])
        return steps[emits], values[:, emits]

    def _held(self, training: NDArray[np.bool_], fresh: F64, attr: str) -> F64:
        """Fresh values at training steps; elsewhere the last training step's value."""
        position = np.where(training, np.arange(len(fresh)), -1)
        np.maximum.accumulate(position, out=position)
        held = np.where(position >= 0, fresh[np.maximum(position, 0)], getattr(self, attr))
        setattr(self, attr, float(held[-1]))
        return held

    def _loss(self, steps: I64, tokens: I64) -> F64:
        progress = 1.0 + tokens.astype(np.float64) / LOSS_TOKENS_SCALE
        curve = self.loss_floor + (LOSS_START - self.loss_floor) * progress**-LOSS_EXPONENT
        z = noise.normal(self._keys[:1], steps)[0]
        spike = noise.uniform(self._keys[1:2], steps)[0] < LOSS_SPIKE_CHANCE
        loss: F64 = curve * (1.0 + 0.012 * z) + np.where(spike, 0.4 * curve, 0.0)
        return loss

    def _grad_norm(self, steps: I64, tokens: I64) -> F64:
        early = np.exp(-tokens.astype(np.float64) / (0.05 * self.planned_tokens))
        z = noise.normal(self._keys[2:3], steps)[0]
        spike = noise.uniform(self._keys[3:4], steps)[0] < GRAD_SPIKE_CHANCE
        base = (0.22 + 1.6 * early) * np.exp(0.12 * z)
        grad: F64 = np.where(spike, base * 4.0, base)
        return grad

    def _learning_rate(self, tokens: I64) -> F64:
        done = tokens.astype(np.float64) / self.planned_tokens
        warm = np.minimum(1.0, done / WARMUP_SHARE)
        decay = np.clip((done - WARMUP_SHARE) / (1.0 - WARMUP_SHARE), 0.0, 1.0)
        cosine = MIN_LR_SHARE + (1.0 - MIN_LR_SHARE) * 0.5 * (1.0 + np.cos(np.pi * decay))
        return PEAK_LR * np.where(done < WARMUP_SHARE, warm, cosine)
