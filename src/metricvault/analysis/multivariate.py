"""Multivariate anomaly detection for a machine group: PCA reconstruction error against history.

The metrics of one machine (CPU, memory, disk, network, ...) move together in normal operation;
an anomaly is often a row that breaks their usual relations even when no single metric leaves
its own range. ``PcaDetector`` learns the relations from a history (the train split, or the
first ``warmup`` rows it is fed):

1. each metric is scaled robustly: centred on its median, divided by the larger of 1.4826 x MAD
   and half its standard deviation, floored at ``floor`` x its range in the history (a metric
   constant in the history does not make every later wiggle infinite);
2. the principal components that explain ``variance`` of the scaled history span "normal";
3. a row's residual (its distance from that subspace, per metric) is divided by the metric's
   residual RMS over the history (at least ``residual_floor`` in scaled units, so a metric the
   components explain almost exactly, or one constant in the history, does not turn a tiny
   residual into an enormous one), and averaged over the last ``smooth`` rows (causal: only this
   row and earlier ones), so that one noisy sample scores lower than a sustained break;
4. the per-metric score is ratio_score(residual, k) in [0, 1] (0.5 at ``k`` times the usual
   residual); the group's score is their maximum.

Streaming: the model is fixed once fitted, so the score of row t depends on the history and on
rows t - smooth + 1 .. t only; the scores of a prefix equal the first scores of the whole.
Deterministic: an SVD, no random part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from metricvault.analysis.detectors import ratio_score
from metricvault.errors import InputError

Vector = npt.NDArray[np.float64]
Matrix = npt.NDArray[np.float64]


@dataclass
class PcaModel:
    """What ``fit_pca`` learns: the robust scaling, the normal subspace and residual scales."""

    center: Vector
    scale: Vector
    mean: Vector
    components: Matrix  # (width, k), orthonormal columns
    residual_scale: Vector

    def residuals(self, rows: Matrix) -> Matrix:
        """|residual| per metric, in units of the history's residual RMS, for each row."""
        z = (np.atleast_2d(rows) - self.center) / self.scale - self.mean
        r = z - (z @ self.components) @ self.components.T
        out: Matrix = np.abs(r) / self.residual_scale
        return out


def fit_pca(
    history: Matrix, variance: float = 0.9, floor: float = 0.05, residual_floor: float = 0.1
) -> PcaModel:
    """The PCA model of ``history`` (rows x metrics); see the module's description."""
    data = np.atleast_2d(np.asarray(history, dtype=np.float64))
    if len(data) < 2 or not np.isfinite(data).all():
        raise InputError(f"PCA history needs at least 2 finite rows, got shape {data.shape}")
    if not 0.0 < variance <= 1.0:
        raise InputError(f"variance must be in (0, 1], got {variance}")
    center = np.median(data, axis=0)
    mad = 1.4826 * np.median(np.abs(data - center), axis=0)
    spread = data.max(axis=0) - data.min(axis=0)
    scale = np.maximum(np.maximum(mad, 0.5 * data.std(axis=0)), floor * spread)
    scale = np.where(scale > 0.0, scale, floor)
    scaled = (data - center) / scale
    mean = scaled.mean(axis=0)
    centred = scaled - mean
    _, sing, vt = np.linalg.svd(centred, full_matrices=False)
    energy = sing**2
    total = float(energy.sum())
    share = np.cumsum(energy) / total if total > 0.0 else np.zeros(0)
    k = int(np.searchsorted(share, variance - 1e-12) + 1) if total > 0.0 else 0
    k = min(k, data.shape[1] - 1) if data.shape[1] > 1 else 0
    components = np.ascontiguousarray(vt[:k].T)
    resid = centred - (centred @ components) @ components.T
    residual_scale = np.maximum(np.sqrt((resid**2).mean(axis=0)), residual_floor)
    return PcaModel(center, scale, mean, components, residual_scale)


@dataclass
class PcaDetector:
    """Streaming PCA reconstruction error of a group of ``width`` metrics (module docstring).

    ``fit(history)`` learns from a history given at once (a train split); without it the
    detector learns from the first ``warmup`` rows it is fed, scoring them 0.
    """

    width: int = 1
    variance: float = 0.9
    smooth: int = 5
    k: float = 3.0
    floor: float = 0.05
    residual_floor: float = 0.1
    warmup: int = 2016
    name: str = "pca"
    model: PcaModel | None = field(init=False, default=None)
    _seen: list[Vector] = field(init=False, default_factory=list)
    _recent: Matrix = field(init=False)
    _count: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.smooth < 1:
            raise InputError(f"smooth must be at least 1, got {self.smooth}")
        self._recent = np.zeros((self.smooth, self.width))

    def fit(self, history: Matrix) -> PcaDetector:
        history = np.atleast_2d(np.asarray(history, dtype=np.float64))
        if history.shape[1] != self.width:
            raise InputError(f"history has {history.shape[1]} metrics, expected {self.width}")
        self.model = fit_pca(history, self.variance, self.floor, self.residual_floor)
        self._seen = []
        return self

    def update(self, x: Vector) -> Vector:
        row = np.asarray(x, dtype=np.float64).reshape(self.width)
        if self.model is None:
            self._seen.append(row.copy())
            if len(self._seen) >= self.warmup:
                self.fit(np.vstack(self._seen))
            return np.zeros(self.width)
        self._recent[self._count % self.smooth] = self.model.residuals(row)[0]
        self._count += 1
        filled = min(self._count, self.smooth)
        mean = self._recent[:filled].mean(axis=0)
        return ratio_score(mean, self.k)

    def score(self, rows: Matrix) -> Matrix:
        """Scores of many rows at once, equal to calling ``update`` on each in turn (the
        detector must be fitted and is left as if it had been fed them)."""
        rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
        if self.model is None:
            raise InputError("score() needs a fitted detector: call fit(history) first")
        resid = self.model.residuals(rows)
        full = np.vstack([self._recent_in_order(), resid])
        csum = np.vstack([np.zeros((1, self.width)), np.cumsum(full, axis=0)])
        start = len(full) - len(resid)
        idx = np.arange(start + 1, len(full) + 1)
        lo = np.maximum(idx - self.smooth, 0)
        mean = (csum[idx] - csum[lo]) / (idx - lo)[:, None]
        for r in resid:
            self._recent[self._count % self.smooth] = r
            self._count += 1
        return ratio_score(mean, self.k)

    def _recent_in_order(self) -> Matrix:
        filled = min(self._count, self.smooth)
        if filled == 0:
            return np.zeros((0, self.width))
        order = [(self._count - filled + i) % self.smooth for i in range(filled)]
        out: Matrix = self._recent[order]
        return out

    def threshold(self) -> float:
        return 0.5
