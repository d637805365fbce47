"""Streaming anomaly detectors: each scores a sample from earlier samples only.

A detector is fed one sample at a time (``update``) and answers a score in [0, 1] for it
before the sample joins its history, so the score of row i never depends on row i+1: the
scores of a prefix equal the first scores of the whole (the CLI and the vault's online
scoring rely on that). Every detector takes a vector of values (one per series) so that a
multivariate group is scored in one pass; a single series is a vector of length one.

``DETECTORS`` maps the names the CLI accepts to factories with ONE parameter set for every
input (NAB's rule: no per-file tuning); ``DEFAULT_DETECTOR`` names the one bench/anomaly.py
measured best.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from metricvault.errors import InputError

Vector = npt.NDArray[np.float64]

_SQRT2 = math.sqrt(2.0)


def _erf(x: Vector) -> Vector:
    # numpy has no erf; math.erf per element is exact and the vectors are short (one per series)
    return np.array([math.erf(v) for v in x.ravel()], dtype=np.float64).reshape(x.shape)


def ratio_score(z: Vector, k: float) -> Vector:
    """|z| / (|z| + k): 0.5 at |z| = k, never saturating to 1.0 in floating point (a threshold
    over many series still separates z = 50 from z = 500)."""
    a = np.abs(z)
    return a / (a + k)


def gaussian_score(z: Vector) -> Vector:
    """1 - the one-sided normal tail beyond |z|: 0.5 at the mean, -> 1 far away (NAB's
    windowed Gaussian maps deviations the same way)."""
    return 0.5 + 0.5 * _erf(np.abs(z) / _SQRT2)


class _Ring:
    """The last ``size`` vectors, oldest first on read."""

    def __init__(self, size: int, width: int) -> None:
        self.size = size
        self.data = np.zeros((size, width), dtype=np.float64)
        self.count = 0
        self.pos = 0

    def push(self, x: Vector) -> None:
        self.data[self.pos] = x
        self.pos = (self.pos + 1) % self.size
        self.count = min(self.count + 1, self.size)

    def values(self) -> Vector:
        if self.count < self.size:
            return self.data[: self.count]
        return np.roll(self.data, -self.pos, axis=0)


@dataclass
class GaussianDetector:
    """Rolling mean ± k sigma: the deviation of a sample from the mean of the last ``window``
    samples in units of their sigma. ``step`` > 1 refreshes mean and sigma every ``step``
    samples once the window is full (NAB's windowed Gaussian: window 6400, step 100)."""

    width: int = 1
    window: int = 6400
    step: int = 100
    k: float = 2.0
    name: str = "gaussian"
    _ring: _Ring = field(init=False)
    _mean: Vector = field(init=False)
    _std: Vector = field(init=False)
    _pending: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._ring = _Ring(self.window, self.width)
        self._mean = np.zeros(self.width)
        self._std = np.ones(self.width)

    def zscore(self, x: Vector) -> Vector:
        return (x - self._mean) / self._std

    def update(self, x: Vector) -> Vector:
        first = self._ring.count == 0
        score = np.zeros(self.width) if first else gaussian_score(self.zscore(x))
        filling = self._ring.count < self.window
        self._ring.push(x)
        self._pending += 1
        if filling or self._pending >= self.step:
            self._pending = 0
            values = self._ring.values()
            self._mean = values.mean(axis=0)
            std = values.std(axis=0)
            self._std = np.where(std == 0.0, 1e-6, std)
        return score

    def threshold(self) -> float:
        return float(gaussian_score(np.array([self.k]))[0])


@dataclass
class QuantileDetector:
    """Dynamic P95/P99 with a ``for`` duration: a sample's score is its rank among the last
    ``window`` samples (both tails: 1 at a new high or a new low), and the sample is anomalous
    when the last ``for_samples`` ranks all reach ``q`` (Prometheus's ``for``: a single spike
    does not fire). The score is the lowest rank over those samples, so it crosses ``q``
    exactly when the ``for`` condition holds."""

    width: int = 1
    window: int = 2016  # a week of 5-minute samples
    q: float = 0.99
    for_samples: int = 3
    name: str = "quantile"
    _ring: _Ring = field(init=False)
    _recent: _Ring = field(init=False)

    def __post_init__(self) -> None:
        self._ring = _Ring(self.window, self.width)
        self._recent = _Ring(self.for_samples, self.width)

    def update(self, x: Vector) -> Vector:
        if self._ring.count == 0:
            rank = np.full(self.width, 0.5)
        else:
            values = self._ring.values()
            below = (values < x).mean(axis=0)
            above = (values > x).mean(axis=0)
            rank = np.maximum(below, above)
        self._ring.push(x)
        self._recent.push(rank)
        score: Vector = self._recent.values().min(axis=0)
        if self._recent.count < self.for_samples:
            score = np.zeros(self.width) + np.minimum(score, 0.5)
        return score

    def threshold(self) -> float:
        return self.q


@dataclass
class MadDetector:
    """Median ± k*MAD: the robust z-score of a sample against the median and the median
    absolute deviation of the last ``window`` samples (sigma ≈ 1.4826*MAD), so a past spike does
    not inflate the band the way it inflates sigma. Refreshed every ``step`` samples."""

    width: int = 1
    window: int = 2016
    step: int = 12
    k: float = 3.0
    name: str = "mad"
    _ring: _Ring = field(init=False)
    _median: Vector = field(init=False)
    _scale: Vector = field(init=False)
    _pending: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._ring = _Ring(self.window, self.width)
        self._median = np.zeros(self.width)
        self._scale = np.ones(self.width)

    def zscore(self, x: Vector) -> Vector:
        return (x - self._median) / self._scale

    def _refresh(self) -> None:
        values = self._ring.values()
        self._median = np.median(values, axis=0)
        mad = 1.4826 * np.median(np.abs(values - self._median), axis=0)
        # a flat series (MAD 0) still needs a scale: a tenth of its spread, then a tiny floor
        spread = values.std(axis=0) * 0.1
        floor = 1e-3 * np.abs(self._median) + 1e-9
        self._scale = np.maximum(np.where(mad > 0, mad, spread), floor)

    def update(self, x: Vector) -> Vector:
        if self._ring.count == 0:
            score = np.zeros(self.width)
        else:
            score = ratio_score(self.zscore(x), self.k)
        self._ring.push(x)
        self._pending += 1
        if self._ring.count < 64 or self._pending >= self.step:
            self._pending = 0
            self._refresh()
        return score

    def threshold(self) -> float:
        return 0.5


@dataclass
class NoveltyDetector:
    """A robust deviation that is also *new* (the default before ``range``). The deviation of
    a sample (robust z of its value and of its change, against the median/MAD of the last
    ``window`` samples) is compared with the largest deviation seen over the last ``memory``
    samples: a series that always spikes to z = 8 is not anomalous at z = 8, one that never
    went past 3 is. After a detection the detector stays quiet for ``quiet`` samples, since
    one event is one alarm. The score is the tail probability of the excess, in [0, 1]."""

    width: int = 1
    window: int = 2016
    memory: int = 2016
    quiet: int = 288
    step: int = 12
    warmup: int = 64
    name: str = "novelty"
    _level: MadDetector = field(init=False)
    _change: MadDetector = field(init=False)
    _history: _Ring = field(init=False)
    _last: Vector | None = field(init=False, default=None)
    _since: Vector = field(init=False)
    _seen: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._level = MadDetector(self.width, self.window, self.step)
        self._change = MadDetector(self.width, self.window, self.step)
        self._history = _Ring(self.memory, self.width)
        self._since = np.full(self.width, float(self.quiet))

    def update(self, x: Vector) -> Vector:
        self._seen += 1
        dev = np.abs(self._level.zscore(x))
        change = x - self._last if self._last is not None else np.zeros(self.width)
        dev = np.maximum(dev, np.abs(self._change.zscore(change)))
        if self._seen <= 16:  # the first bands are too narrow to judge anything by
            dev = np.zeros(self.width)
        self._level.update(x)
        self._change.update(change)
        self._last = x.copy()
        past = self._history.values()
        ceiling = past.max(axis=0) if len(past) else np.zeros(self.width)
        self._history.push(dev)
        excess = np.maximum(dev - np.maximum(ceiling, 3.0), 0.0)
        score = np.where(excess > 0, 0.5 + 0.5 * ratio_score(excess, 1.0), 0.0)
        # the history learns from its first ``warmup`` samples but judges none of them
        if self._seen <= self.warmup:
            score = np.zeros(self.width)
        score = np.where(self._since < self.quiet, score * 0.5, score)
        self._since = np.where(score >= self.threshold(), 0.0, self._since + 1.0)
        return score

    def threshold(self) -> float:
        return 0.75


def range_excess(x: Vector, lo: Vector, hi: Vector, floor: Vector | float = 0.0) -> Vector:
    """How far ``x`` lies beyond ``[lo, hi]``, in units of the range's width (at least
    ``floor``); 0 inside. A range of zero width (a flat history) makes any other value an
    excess of 1."""
    span = np.maximum(hi - lo, floor)
    beyond = np.maximum(np.maximum(x - hi, lo - x), 0.0)
    safe = np.where(span > 0, span, 1.0)
    return np.where(span > 0, beyond / safe, np.where(beyond > 0, 1.0, 0.0))


def quantile_of_sorted(ordered: Vector, q: float) -> Vector:
    """The ``q`` quantile of each column of an ascending (n, m) array, interpolated linearly
    between the two nearest ranks (numpy's default method; the median at ``q = 0.5``): one sort
    serves every quantile of a window, where np.median and np.quantile each sort again."""
    h = (len(ordered) - 1) * q
    i = math.floor(h)
    j = min(i + 1, len(ordered) - 1)
    lower: Vector = ordered[i]
    value: Vector = lower + (h - i) * (ordered[j] - lower)
    return value


@dataclass
class RangeDetector:
    """The default: a value, or a rolling statistic of the last ``medians`` samples (their
    median, and their lower quantile ``low_quantile``), beyond everything the series did before,
    by a margin of its past range. It learns the lowest and highest value (and the lowest and
    highest of each rolling statistic) seen so far; a sample's excess is how far it lies outside
    that range in units of the range's width. The rolling medians catch a level shift or a
    sustained bump that stays inside the range of past spikes (a single spike moves a median of
    12 samples not at all); the rolling lower quantile (the floor of the last samples: 0.2,
    about the third lowest of 12) catches what leaves the median where it was, a floor that
    drops because the series starts to oscillate or dip, or rises under a sustained load. The
    excess ``E = max(value excess, median_weight * median excess, low_weight * low-quantile
    excess)`` maps to ``E / (E + margin)``: 0.5, the threshold, at ``E = margin``. A rolling
    statistic's range counts as at least ``median_floor`` of the values' range, so that on a
    spiky series their narrow band of noise does not make every small wander a record. After a
    detection a series stays quiet for ``quiet`` samples (scores halved): one event, one alarm.

    This is the "spatial anomaly" rule of NAB's HTM detector made continuous, plus level shifts
    and changes of the floor; on NAB's machine metrics it outscores the published detectors
    (docs/anomaly.md)."""

    width: int = 1
    medians: tuple[int, ...] = (12, 24)
    margin: float = 0.15
    median_weight: float = 2.25
    median_floor: float = 0.1
    low_quantile: float = 0.2
    low_weight: float = 1.0
    quiet: int = 72
    warmup: int = 288
    name: str = "range"
    _seen: int = field(init=False, default=0)
    _lo: Vector = field(init=False)
    _hi: Vector = field(init=False)
    _rings: list[_Ring] = field(init=False)
    _mlo: list[Vector] = field(init=False)
    _mhi: list[Vector] = field(init=False)
    _qlo: list[Vector] = field(init=False)
    _qhi: list[Vector] = field(init=False)
    _since: Vector = field(init=False)

    def __post_init__(self) -> None:
        self._lo = np.full(self.width, np.inf)
        self._hi = np.full(self.width, -np.inf)
        self._rings = [_Ring(k, self.width) for k in self.medians]
        self._mlo = [np.full(self.width, np.inf) for _ in self.medians]
        self._mhi = [np.full(self.width, -np.inf) for _ in self.medians]
        self._qlo = [np.full(self.width, np.inf) for _ in self.medians]
        self._qhi = [np.full(self.width, -np.inf) for _ in self.medians]
        self._since = np.full(self.width, float(self.quiet))

    def update(self, x: Vector) -> Vector:
        self._seen += 1
        judged = self._seen > self.warmup
        excess = range_excess(x, self._lo, self._hi) if judged else np.zeros(self.width)
        floor = self.median_floor * (self._hi - self._lo) if judged else 0.0
        self._lo = np.minimum(self._lo, x)
        self._hi = np.maximum(self._hi, x)
        for i, ring in enumerate(self._rings):
            ring.push(x)
            ordered = np.sort(ring.data[: ring.count], axis=0)  # the ring's order is irrelevant
            median = quantile_of_sorted(ordered, 0.5)
            low = quantile_of_sorted(ordered, self.low_quantile)
            if self._seen > self.warmup + ring.size:
                shifted = range_excess(median, self._mlo[i], self._mhi[i], floor)
                excess = np.maximum(excess, self.median_weight * shifted)
                dropped = range_excess(low, self._qlo[i], self._qhi[i], floor)
                excess = np.maximum(excess, self.low_weight * dropped)
            if self._seen >= ring.size:  # statistics of a full window only
                self._mlo[i] = np.minimum(self._mlo[i], median)
                self._mhi[i] = np.maximum(self._mhi[i], median)
                self._qlo[i] = np.minimum(self._qlo[i], low)
                self._qhi[i] = np.maximum(self._qhi[i], low)
        score: Vector = excess / (excess + self.margin)
        quiet = self._since < self.quiet
        score = np.where(quiet, score * 0.5, score)
        self._since = np.where(~quiet & (score >= self.threshold()), 0.0, self._since + 1.0)
        return score

    def threshold(self) -> float:
        return 0.5


@dataclass
class HistoryDetector:
    """Mean ± k sigma over ALL the history (Welford's running mean and variance), for series
    whose normal is long-lived (a machine group with a train split, a baseline): unlike a
    rolling window, a long anomaly does not become the new normal within a window's length.
    sigma is floored at ``floor`` (in the series' units; the group data are scaled 0..1) so a
    metric that was constant in the history does not score every later wiggle as infinite."""

    width: int = 1
    k: float = 2.0
    floor: float = 0.05
    name: str = "history"
    _n: int = field(init=False, default=0)
    _mean: Vector = field(init=False)
    _m2: Vector = field(init=False)

    def __post_init__(self) -> None:
        self._mean = np.zeros(self.width)
        self._m2 = np.zeros(self.width)

    def update(self, x: Vector) -> Vector:
        if self._n == 0:
            score = np.zeros(self.width)
        else:
            sd = np.maximum(np.sqrt(self._m2 / self._n), self.floor)
            score = ratio_score((x - self._mean) / sd, self.k)
        self._n += 1
        delta = x - self._mean
        self._mean = self._mean + delta / self._n
        self._m2 = self._m2 + delta * (x - self._mean)
        return score

    def threshold(self) -> float:
        return 0.5


@dataclass
class RandomDetector:
    """Uniform random scores (seeded): the floor every benchmark reports."""

    width: int = 1
    seed: int = 42
    name: str = "random"
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def update(self, x: Vector) -> Vector:
        return self._rng.random(self.width)

    def threshold(self) -> float:
        return 0.99


Detector = (
    RangeDetector
    | GaussianDetector
    | QuantileDetector
    | MadDetector
    | NoveltyDetector
    | HistoryDetector
    | RandomDetector
)

DETECTORS: dict[str, Callable[[int], Detector]] = {
    "range": lambda width: RangeDetector(width),
    "gaussian": lambda width: GaussianDetector(width),
    "gaussian-rolling": lambda width: GaussianDetector(width, window=2016, step=1),
    "quantile": lambda width: QuantileDetector(width),
    "mad": lambda width: MadDetector(width),
    "novelty": lambda width: NoveltyDetector(width),
    "history": lambda width: HistoryDetector(width),
    "random": lambda width: RandomDetector(width),
}
DEFAULT_DETECTOR = "range"


def make_detector(name: str, width: int = 1) -> Detector:
    """The detector the CLI and the bench call ``name``, for ``width`` series at once."""
    factory = DETECTORS.get(name)
    if factory is None:
        raise InputError(
            f"unknown detector {name!r}: expected one of {', '.join(sorted(DETECTORS))}"
        )
    return factory(width)


def score_series(values: npt.ArrayLike, name: str = DEFAULT_DETECTOR) -> Vector:
    """Scores of a whole (n,) or (n, m) array, row by row, as the streaming detector sees it."""
    data = np.asarray(values, dtype=np.float64)
    flat = data.ndim == 1
    rows = data.reshape(len(data), -1)
    detector = make_detector(name, rows.shape[1])
    out = np.empty_like(rows)
    for i, row in enumerate(rows):
        out[i] = detector.update(row)
    return out[:, 0] if flat else out
