"""NAB's scoring function, re-implemented (numenta/NAB ``nab/sweeper.py`` and ``runner.py``).

Per file: every row after the probationary period (the first min(15 %, 750) rows) that a
detector flags scores by its position relative to the labelled windows through a scaled
sigmoid: inside a window the earliest detection earns up to +1*tpWeight (only the best one
per window counts), after a window a false positive costs up to fpWeight, falling off with
the distance; a missed window costs fnWeight. The threshold is ONE for the whole set, chosen
to maximise the summed score; the total is normalised so that the null detector (never
flags) scores 0 and a perfect one (flags every window's first row) 100.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

PROFILES: dict[str, dict[str, float]] = {
    "standard": {"tp": 1.0, "fp": 0.11, "fn": 1.0},
    "reward_low_FP_rate": {"tp": 1.0, "fp": 0.22, "fn": 1.0},
    "reward_low_FN_rate": {"tp": 1.0, "fp": 0.11, "fn": 2.0},
}


def scaled_sigmoid(position: float) -> float:
    """NAB's weight of a detection at ``position``: -1 (window start) ... 0 (window end) earns
    ~0.987 ... 0; past the window (position > 0, in window widths) it turns negative, and
    beyond 3 widths it is -1."""
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def probation_length(rows: int, percent: float = 0.15) -> int:
    return int(min(math.floor(percent * rows), percent * 5000))


@dataclass(frozen=True)
class LabelledFile:
    """One file's scores and windows as row indices (start, end inclusive)."""

    scores: npt.NDArray[np.float64]
    windows: tuple[tuple[int, int], ...]


def window_rows(
    timestamps: npt.NDArray[np.int64], windows: list[tuple[int, int]]
) -> tuple[tuple[int, int], ...]:
    """Label windows given as (start, end) epoch values -> inclusive row index pairs."""
    out = []
    for start, end in windows:
        lo = int(np.searchsorted(timestamps, start, side="left"))
        hi = int(np.searchsorted(timestamps, end, side="right")) - 1
        if hi >= lo:
            out.append((lo, hi))
    return tuple(out)


@dataclass(frozen=True)
class _Points:
    """Per scorable row: its anomaly score, its sweep weight (before the profile's weights),
    and its window (-1 outside)."""

    scores: npt.NDArray[np.float64]
    weight: npt.NDArray[np.float64]
    window: npt.NDArray[np.int64]
    windows: int


def _points(file: LabelledFile, window_base: int) -> _Points:
    n = len(file.scores)
    weight = np.empty(n)
    window = np.full(n, -1, dtype=np.int64)
    prev_right: int | None = None
    prev_width = 0.0
    pending = list(file.windows)
    current: tuple[int, int] | None = None
    number = window_base - 1
    for i in range(n):
        if current is None and pending and i == pending[0][0]:
            current = pending.pop(0)
            number += 1
        if current is not None:
            width = float(current[1] - current[0] + 1)
            weight[i] = scaled_sigmoid(-(current[1] - i + 1) / width)
            window[i] = number
        elif prev_right is None:
            weight[i] = -1.0
        else:
            weight[i] = scaled_sigmoid(abs(prev_right - i) / max(prev_width - 1.0, 1.0))
        if current is not None and i == current[1]:
            prev_right, prev_width = i, float(current[1] - current[0] + 1)
            current = None
    keep = slice(probation_length(n), n)
    return _Points(file.scores[keep], weight[keep], window[keep], len(file.windows))


def raw_scores_by_threshold(
    points: list[_Points], profile: dict[str, float]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(thresholds, summed raw score at each): a row is flagged when score >= threshold."""
    scores = np.concatenate([p.scores for p in points])
    weight = np.concatenate([p.weight for p in points])
    window = np.concatenate([p.window for p in points])
    n_windows = sum(p.windows for p in points)
    max_tp = scaled_sigmoid(-1.0)
    order = np.argsort(-scores, kind="stable")
    scores, weight, window = scores[order], weight[order], window[order]
    # walk the rows from the highest score down, as NAB's sweep does
    fp_total = 0.0
    best = np.full(n_windows, -profile["fn"])
    total = float(best.sum())
    thresholds = [1.1]
    totals = [total]
    i = 0
    n = len(scores)
    while i < n:
        j = i
        value = scores[i]
        while j < n and scores[j] == value:
            w = window[j]
            if w < 0:
                fp_total += weight[j] * profile["fp"]
            else:
                gain = weight[j] * profile["tp"] / max_tp
                if gain > best[w]:
                    total_window_delta = gain - best[w]
                    best[w] = gain
                    total += total_window_delta
            j += 1
        thresholds.append(float(value))
        totals.append(total + fp_total)
        i = j
    return np.array(thresholds), np.array(totals)


@dataclass(frozen=True)
class NabResult:
    profile: str
    score: float  # normalised: null 0, perfect 100
    threshold: float
    raw: float


def nab_score(files: list[LabelledFile], profile: str = "standard") -> NabResult:
    """The normalised NAB score of one detector over ``files`` under ``profile``."""
    weights = PROFILES[profile]
    base = 0
    points = []
    for f in files:
        points.append(_points(f, base))
        base += len(f.windows)
    thresholds, totals = raw_scores_by_threshold(points, weights)
    best = int(np.argmax(totals))
    null = -weights["fn"] * base
    perfect = weights["tp"] * base
    raw = float(totals[best])
    return NabResult(profile, 100.0 * (raw - null) / (perfect - null), thresholds[best], raw)
