"""Which metrics explain an anomalous segment: ranked by how far each moved from normal.

Each metric's deviation is its largest standardized distance, over the segment's first rows,
from its own history (median and MAD of the history, so past spikes do not widen the band),
minus how far it already was just before the segment (``recent``): a metric that is always
noisy or had drifted already ranks below one that moved first and most.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from metricvault.errors import InputError

Matrix = npt.NDArray[np.float64]


def deviations(history: Matrix, segment: Matrix, recent: Matrix | None = None) -> Matrix:
    """Per metric (column): the robust z-score by which ``segment`` leaves ``history``."""
    history = np.atleast_2d(np.asarray(history, dtype=np.float64))
    segment = np.atleast_2d(np.asarray(segment, dtype=np.float64))
    if history.shape[1] != segment.shape[1] or len(history) == 0 or len(segment) == 0:
        raise InputError(
            f"history {history.shape} and segment {segment.shape} must be non-empty and have "
            "the same number of metrics (columns)"
        )
    median = np.median(history, axis=0)
    mad = 1.4826 * np.median(np.abs(history - median), axis=0)
    scale = np.maximum(mad, np.maximum(history.std(axis=0), 1e-6) * 0.1)
    head = segment[: max(1, min(len(segment), 10))]
    score: Matrix = np.abs(head - median).max(axis=0) / scale
    if recent is not None and len(recent):
        before = np.abs(np.atleast_2d(recent) - median).mean(axis=0) / scale
        score = score - before
    return score


def rank_metrics(history: Matrix, segment: Matrix, recent: Matrix | None = None) -> list[int]:
    """Column indices, the metric that explains the segment best first."""
    return [int(i) for i in np.argsort(-deviations(history, segment, recent), kind="stable")]
