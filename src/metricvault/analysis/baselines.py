"""Baselines: what normal looks like for a series or a group of series, learned from the
rollup tiers over a training window and stored back in the vault as ordinary series.

Everything is computed from the per-hour partials of the rollup rows (``count``, ``sum``,
``m2``, ``increase`` and the DDSketch columns; docs/decisions/0005-spread-in-rollup-rows.md),
so a 28-day baseline reads 672 rows per series instead of every raw sample:

- mean and sigma (population) by Chan, Golub and LeVeque's merge of the hours' ``m2``;
- P50/P95/P99 from the merged sketches (exact merge; each within 1 % relative of the
  sample at rank ``floor(q*(n-1))``);
- median and MAD from the same sketch, each bucket's samples taken as spread uniformly over
  the bucket (:func:`_sketch_median_mad`; ``p50`` stays DDSketch's own): within half a
  bucket (1 % of the level) of the exact median and MAD, so the MAD is informative where
  the spread is well above 1 % of the level; below that use sigma;
- counters are baselined on their rates: each hour's ``increase / 3600`` is one sample, so
  their statistics describe hourly-average rates (not 5-minute ones);
- a seasonal profile (hour of week: hour of day x day of week) only where a permutation test
  says the hour of week explains the hourly means (:func:`seasonality`).

Stored under the reserved metric ``metricvault_baseline`` with the group's labels plus
``source_metric`` and ``stat``; see docs/anomaly.md "Baselines".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.durations import parse_duration_ms
from metricvault.errors import InputError
from metricvault.model import sketch_mapping
from metricvault.selector import parse_selectors

BASELINE_METRIC = "metricvault_baseline"
HOUR_MS = 3_600_000
WEEK_HOURS = 168
SCALAR_STATS = ("mean", "stddev", "p50", "p95", "p99", "median", "mad", "history_hours")
SEASONAL_STATS = ("seasonal_mean", "seasonal_stddev")
# the compute time, in seconds since the epoch (copied forward by maintain like the others)
TRAINED_AT = "trained_at"
RESERVED_LABELS = ("stat", "source_metric")
PERMUTATIONS = 199
SEASONAL_P = 0.01  # permutation p-value below which the hour of week is said to matter
SEASONAL_MIN_SHARE = 0.2  # and the share of variance it explains beyond chance at least this


@dataclass(frozen=True)
class BaselineSpec:
    """What to baseline: the series ``selector`` matches, per series (``by`` empty) or per
    group of the ``by`` label values (and metric), over ``window`` before the compute time.

    ``min_history``: a group with fewer hours of data (after warm-up) is not stored.
    ``warmup``: the first hours of each series in the window (a new job, a deploy after a gap
    of over an hour) are left out: start-up transients are not what normal looks like."""

    selector: str
    by: tuple[str, ...] = ()
    window: str = "28d"
    min_history: str = "7d"
    warmup: str = "1h"

    def __post_init__(self) -> None:
        parse_selectors(self.selector)  # a bad selector is refused here, before any read
        for name in ("window", "min_history", "warmup"):
            _duration_ms(getattr(self, name))  # refused with the parser's words
        if parse_duration_ms(self.window) < HOUR_MS:
            raise InputError(
                f"baseline window={self.window!r} is under 1h: baselines are learned from "
                "hourly rollup rows; use a window of at least 1h (default 28d)"
            )
        bad = [b for b in self.by if b in RESERVED_LABELS or b == "__name__"]
        if bad:
            raise InputError(
                f"--by {','.join(bad)}: reserved for the baseline series' own labels "
                f"({', '.join(RESERVED_LABELS)}); group by other labels"
            )

    @classmethod
    def parse(cls, text: str) -> BaselineSpec:
        """One entry of the ``baselines`` setting: ``SELECTOR [by LABEL,LABEL] [over WINDOW]
        [min MIN_HISTORY]``, e.g. ``DCGM_FI_DEV_FB_USED by Hostname,gpu over 28d min 7d``."""
        rest = text.strip()
        found: dict[str, str] = {}
        for word in ("min", "over", "by"):  # from the end: the selector may hold spaces
            head, sep, tail = rest.rpartition(f" {word} ")
            if sep and "}" not in tail and '"' not in tail:
                found[word], rest = tail.strip(), head
        if not rest.strip():
            raise InputError(
                f"baselines entry {text!r} names no selector: write `SELECTOR [by LABEL,LABEL] "
                "[over 28d] [min 7d]`"
            )
        by = tuple(x.strip() for x in found.get("by", "").split(",") if x.strip())
        return cls(rest.strip(), by, found.get("over", "28d"), found.get("min", "7d"))


@dataclass(frozen=True)
class Seasonality:
    """The permutation test of :func:`seasonality`: the share of variance the hour-of-week
    means explain (``r2``), its mean under permutation (``chance``), the p-value, and the
    verdict."""

    r2: float
    chance: float
    p_value: float
    seasonal: bool

    @property
    def share_beyond_chance(self) -> float:
        return (self.r2 - self.chance) / (1.0 - self.chance) if self.chance < 1 else 0.0


@dataclass
class Baseline:
    """One group's learned statistics (``labels``: the group's labels, ``source_metric``
    included)."""

    source_metric: str
    labels: dict[str, str]
    kind: str  # "gauge" or "counter" (counters: statistics of hourly rates)
    stats: dict[str, float]
    history_hours: int
    trusted: bool
    seasonality: Seasonality | None = None
    profile_mean: np.ndarray | None = None  # 168 hour-of-week means (NaN: hour never seen)
    profile_std: np.ndarray | None = None
    series: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stored_labels(self) -> dict[str, str]:
        return {**self.labels, "source_metric": self.source_metric}


def _duration_ms(text: str) -> int:
    """A duration where 0 is allowed (no warm-up, any history): ``"0"``, ``"0h"``."""
    return 0 if text.strip().rstrip("smhdwy") in ("0", "") else parse_duration_ms(text)


# --------------------------------------------------------------------------- statistics
def seasonality(values: np.ndarray, hours: np.ndarray, seed: int = 0) -> Seasonality:
    """Does the hour of week (``hours``: epoch hour numbers of ``values``) explain the hourly
    values? R^2 of the hour-of-week means against the same R^2 with the values randomly
    permuted (``PERMUTATIONS`` times, seeded): with few values per hour of week even noise has
    a large R^2 (167 of n-1 degrees of freedom), which the permutations measure rather than
    assume. Seasonal when p < ``SEASONAL_P`` and the share explained beyond chance
    (``(R^2 - chance)/(1 - chance)``) is at least ``SEASONAL_MIN_SHARE``."""
    ok = np.isfinite(values)
    y, h = values[ok], how(hours[ok])
    if y.size < 2 * WEEK_HOURS or float(np.var(y)) == 0.0:  # each hour of week twice at least
        return Seasonality(0.0, 0.0, 1.0, False)
    r2 = _r2(y, h)
    rng = np.random.default_rng(seed)
    null = _r2_permuted(rng.permuted(np.tile(y, (PERMUTATIONS, 1)), axis=1), h)
    p = float((1 + np.sum(null >= r2)) / (PERMUTATIONS + 1))
    chance = float(null.mean())
    share = (r2 - chance) / (1.0 - chance) if chance < 1 else 0.0
    return Seasonality(r2, chance, p, bool(p < SEASONAL_P and share >= SEASONAL_MIN_SHARE))


def how(hours: np.ndarray) -> np.ndarray:
    """Hour of week (0 = Monday 00:00 UTC) of epoch hour numbers (1970-01-01 was a Thursday)."""
    return np.asarray((hours + 3 * 24) % WEEK_HOURS, dtype=np.int64)


def _r2(y: np.ndarray, h: np.ndarray) -> float:
    n = np.bincount(h, minlength=WEEK_HOURS)
    s = np.bincount(h, weights=y, minlength=WEEK_HOURS)
    means = np.divide(s, n, out=np.zeros(WEEK_HOURS), where=n > 0)
    total = float(np.sum((y - y.mean()) ** 2))
    within = float(np.sum((y - means[h]) ** 2))
    return 1.0 - within / total if total > 0 else 0.0


def _r2_permuted(ys: np.ndarray, h: np.ndarray) -> np.ndarray:
    """:func:`_r2` of each row of ``ys`` at once (one bincount over row x hour-of-week)."""
    rows, n_values = ys.shape
    cell = (np.arange(rows)[:, None] * WEEK_HOURS + h[None, :]).ravel()
    n = np.bincount(cell, minlength=rows * WEEK_HOURS).reshape(rows, WEEK_HOURS)
    s = np.bincount(cell, weights=ys.ravel(), minlength=rows * WEEK_HOURS).reshape(rows, -1)
    means = np.divide(s, n, out=np.zeros_like(s), where=n > 0)
    fitted = np.take_along_axis(means, np.broadcast_to(h, (rows, n_values)), axis=1)
    total = np.sum((ys - ys.mean(axis=1, keepdims=True)) ** 2, axis=1)
    within = np.sum((ys - fitted) ** 2, axis=1)
    return np.asarray(1.0 - within / total)


def _profile(y: np.ndarray, hours: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = how(hours)
    n = np.bincount(h, minlength=WEEK_HOURS).astype(np.float64)
    s = np.bincount(h, weights=y, minlength=WEEK_HOURS)
    with np.errstate(all="ignore"):
        mean = s / n
        sq = np.bincount(h, weights=(y - mean[h]) ** 2, minlength=WEEK_HOURS)
        std = np.sqrt(sq / n)
    return mean, std


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value at rank ``floor(q*(n-1))`` of the weighted sample (the sketch's convention)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    rank = np.floor(q * (cum[-1] - 1))
    return float(v[min(int(np.searchsorted(cum, rank, side="right")), v.size - 1)])


# --------------------------------------------------------------------------- computing
def compute_baselines(vault: Any, spec: BaselineSpec, now_ms: int | None = None) -> list[Baseline]:
    """The baselines of ``spec`` over ``[now - window, now)`` from the vault's hourly
    partials (rollup rows; raw samples only for the hours not rolled up yet)."""
    from metricvault.durations import now_ms as clock

    end = (clock() if now_ms is None else int(now_ms)) // HOUR_MS * HOUR_MS
    start = end - parse_duration_ms(spec.window) // HOUR_MS * HOUR_MS
    reader = vault.sample_reader()
    selector = parse_selectors(spec.selector)
    ids = [
        sid
        for sid in reader.index.match(selector)
        if reader.index.get(sid).metric != BASELINE_METRIC
    ]
    if not ids:
        return []
    table = reader.partials(ids, start, end, HOUR_MS, sketch=True)
    warmup_h = _duration_ms(spec.warmup) // HOUR_MS
    groups: dict[tuple[str, ...], list[int]] = {}
    for sid in ids:
        info = reader.index.get(sid)
        labels = info.labels if not spec.by else {k: info.labels.get(k, "") for k in spec.by}
        key = (info.metric, *sorted(f"{k}={v}" for k, v in labels.items() if v))
        groups.setdefault(key, []).append(sid)
    cols = {
        name: table[name].to_numpy(zero_copy_only=False)
        for name in ("series_id", "ts", "count", "sum", "m2", "increase")
    }
    keys = table["sketch_keys"].combine_chunks()
    counts = table["sketch_counts"].combine_chunks()
    rows_of: dict[int, np.ndarray] = {}
    for sid in ids:
        rows = np.flatnonzero(cols["series_id"] == sid)
        rows = rows[np.argsort(cols["ts"][rows], kind="stable")]
        rows = rows[cols["count"][rows] > 0]
        rows_of[sid] = _after_warmup(rows, cols["ts"][rows], start, warmup_h)
    min_hours = _duration_ms(spec.min_history) / HOUR_MS
    out: list[Baseline] = []
    for key, sids in sorted(groups.items()):
        metric = key[0]
        labels = dict(part.split("=", 1) for part in key[1:])
        counter = reader.index.is_counter(sids[0])
        rows = np.concatenate([rows_of[s] for s in sids]) if sids else np.array([], np.int64)
        if rows.size == 0:
            continue
        baseline = (
            _counter_baseline(cols, rows) if counter else _gauge_baseline(cols, keys, counts, rows)
        )
        hours_seen = np.unique(cols["ts"][rows] // HOUR_MS)
        history = int(hours_seen.size)
        hourly, hour_no = _hourly_values(cols, rows, counter)
        season = seasonality(hourly, hour_no)
        result = Baseline(
            metric,
            labels,
            "counter" if counter else "gauge",
            {**baseline, "history_hours": float(history)},
            history,
            history >= min_hours,
            season,
            series=len(sids),
        )
        if season.seasonal:
            result.profile_mean, result.profile_std = _profile(hourly, hour_no)
        out.append(result)
    return out


def _after_warmup(rows: np.ndarray, ts: np.ndarray, start: int, warmup_h: int) -> np.ndarray:
    """Leave out the first ``warmup_h`` hours after each start: the series' first hour when it
    began inside the window, and the first hour after a gap of more than an hour."""
    if warmup_h <= 0 or rows.size == 0:
        return rows
    hour = ts // HOUR_MS
    starts = np.concatenate([[hour[0] > start // HOUR_MS], np.diff(hour) > 1])
    keep = np.ones(rows.size, dtype=bool)
    for i in np.flatnonzero(starts):
        keep &= ~((hour >= hour[i]) & (hour < hour[i] + warmup_h))
    return rows[keep]


def _gauge_baseline(
    cols: dict[str, np.ndarray], keys: pa.ListArray, counts: pa.ListArray, rows: np.ndarray
) -> dict[str, float]:
    n = cols["count"][rows].astype(np.float64)
    sums = cols["sum"][rows].astype(np.float64)
    m2 = np.nan_to_num(cols["m2"][rows].astype(np.float64))
    total = float(n.sum())
    mean = float(sums.sum() / total)
    means = sums / n
    m2_all = float(m2.sum() + np.sum(n * (means - mean) ** 2))  # Chan et al.'s merge
    picked = pa.array(rows, pa.int64())
    codes = np.asarray(pc.list_flatten(keys.take(picked)).to_numpy(), dtype=np.int64)
    weights = np.asarray(pc.list_flatten(counts.take(picked)).to_numpy(), dtype=np.float64)
    stats = {"mean": mean, "stddev": float(np.sqrt(max(m2_all / total, 0.0)))}
    if codes.size == 0 or weights.sum() != total:  # rows without sketches (written before)
        return stats | {s: float("nan") for s in ("p50", "p95", "p99", "median", "mad")}
    values = np.asarray(sketch_mapping().values(codes), dtype=np.float64)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        stats[name] = _weighted_quantile(values, weights, q)
    stats["median"], stats["mad"] = _sketch_median_mad(values, weights)
    return stats


def _sketch_median_mad(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Median and MAD (median of ``|x - median|``) with each sketch bucket's samples spread
    uniformly over the bucket (bounds: the representative value times ``(1+gamma)/2`` and that
    over ``gamma``), both solved by bisection on that piecewise-linear CDF ``F``: ``F(m) =
    W/2``, then ``F(m+d) - F(m-d) = W/2``. Without the spreading, a series whose spread is
    narrower than a bucket (2 % of its level) would have a MAD of 0."""
    gamma = float(sketch_mapping().gamma)
    a, b = values * (1 + gamma) / (2 * gamma), values * (1 + gamma) / 2
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    width = hi - lo
    half = float(weights.sum()) / 2

    def cdf(x: float) -> float:
        inside = np.divide(x - lo, width, out=(x >= lo).astype(np.float64), where=width > 0)
        return float(np.sum(weights * np.clip(inside, 0.0, 1.0)))

    def solve(f: Any, left: float, right: float) -> float:  # f increasing; f(x) >= half
        for _ in range(80):
            mid = (left + right) / 2
            if f(mid) < half:
                left = mid
            else:
                right = mid
        return right

    median = solve(cdf, float(lo.min()), float(hi.max()))
    spread = float(max(hi.max() - median, median - lo.min()))
    mad = solve(lambda d: cdf(median + d) - cdf(median - d), 0.0, spread)
    return median, mad


def _counter_baseline(cols: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, float]:
    rates = np.nan_to_num(cols["increase"][rows].astype(np.float64)) / (HOUR_MS / 1000)
    median = float(np.quantile(rates, 0.5, method="lower"))
    return {
        "mean": float(rates.mean()),
        "stddev": float(rates.std()),
        "p50": median,
        "p95": float(np.quantile(rates, 0.95, method="lower")),
        "p99": float(np.quantile(rates, 0.99, method="lower")),
        "median": median,
        "mad": float(np.quantile(np.abs(rates - median), 0.5, method="lower")),
    }


def _hourly_values(
    cols: dict[str, np.ndarray], rows: np.ndarray, counter: bool
) -> tuple[np.ndarray, np.ndarray]:
    """One value per hour of the group: the mean of its series' hourly means (gauges) or
    rates (counters)."""
    hour = cols["ts"][rows] // HOUR_MS
    if counter:
        v = np.nan_to_num(cols["increase"][rows].astype(np.float64)) / (HOUR_MS / 1000)
    else:
        v = cols["sum"][rows].astype(np.float64) / cols["count"][rows]
    uniq, inv = np.unique(hour, return_inverse=True)
    s = np.bincount(inv, weights=v)
    n = np.bincount(inv)
    return s / n, uniq


# --------------------------------------------------------------------------- storing
def baseline_rows(
    baselines: Iterable[Baseline], at_ms: int, *, profile_week: bool = True
) -> list[tuple[str, dict[str, str], int, float]]:
    """The samples that store ``baselines`` as of ``at_ms``: each scalar stat at ``at_ms``,
    ``trained_at`` (seconds), and for a seasonal one its profile over the week before
    ``at_ms`` at one-minute steps (``profile_week``; else only at ``at_ms``), so it plots
    beside the data and an instant query finds it within the lookback."""
    out: list[tuple[str, dict[str, str], int, float]] = []
    for b in baselines:
        if not b.trusted:
            continue
        base = b.stored_labels
        for stat in SCALAR_STATS:
            value = b.stats.get(stat, float("nan"))
            if np.isfinite(value):
                out.append((BASELINE_METRIC, {**base, "stat": stat}, at_ms, float(value)))
        out.append((BASELINE_METRIC, {**base, "stat": TRAINED_AT}, at_ms, at_ms / 1000))
        if b.profile_mean is None or b.profile_std is None:
            continue
        times = (
            np.arange(at_ms - 7 * 24 * HOUR_MS + 60_000, at_ms + 1, 60_000)
            if profile_week
            else np.array([at_ms])
        )
        slot = how(times // HOUR_MS)
        for stat, profile in (
            ("seasonal_mean", b.profile_mean),
            ("seasonal_stddev", b.profile_std),
        ):
            labels = {**base, "stat": stat}
            for t, s in zip(times.tolist(), slot.tolist(), strict=True):
                if np.isfinite(profile[s]):
                    out.append((BASELINE_METRIC, labels, int(t), float(profile[s])))
    return out


def store_baselines(vault: Any, baselines: Sequence[Baseline], at_ms: int) -> int:
    """Write ``baselines`` (the trusted ones) through the vault's write path; returns how many
    samples. All-or-nothing, as ``vault.write``."""
    rows = baseline_rows(baselines, at_ms)
    return int(vault.write(rows, {BASELINE_METRIC: "gauge"})) if rows else 0


def run_baselines(
    vault: Any, specs: Sequence[BaselineSpec], now_ms: int | None = None
) -> list[Baseline]:
    """Compute and store the baselines of every spec at ``now_ms``; all specs are computed
    before anything is written, so a failing one writes nothing."""
    from metricvault.durations import now_ms as clock

    at = clock() if now_ms is None else int(now_ms)
    found = [b for spec in specs for b in compute_baselines(vault, spec, at)]
    store_baselines(vault, found, at)
    return found


# --------------------------------------------------------------------------- maintain
def maintain_baselines(
    vault: Any, specs: Sequence[BaselineSpec], interval: str, now_ms: int | None = None
) -> dict[str, int]:
    """One maintain round's share: recompute the specs whose stored baselines were trained
    more than ``interval`` ago (or never), and copy the others' last values forward to
    ``now`` so instant queries keep finding them within the lookback. Returns counts."""
    from metricvault.durations import now_ms as clock

    at = clock() if now_ms is None else int(now_ms)
    interval_ms = parse_duration_ms(interval)
    due: list[BaselineSpec] = []
    carried = 0
    for spec in specs:
        last = _stored(vault, spec, at, interval_ms)
        trained = [v for labels, _, v in last if labels.get("stat") == TRAINED_AT]
        if not trained or at - min(trained) * 1000 >= interval_ms:
            due.append(spec)
            continue
        rows = [
            (BASELINE_METRIC, labels, at, value)
            for labels, ts, value in last
            if ts < at and not labels.get("stat", "").startswith("seasonal_")
        ]
        week_ago = _stored(vault, spec, at - WEEK_HOURS * HOUR_MS, 60_000)
        rows += [  # the profile's value for this hour of week: the stored week's, 7 days back
            (BASELINE_METRIC, labels, at, value)
            for labels, ts, value in week_ago
            if labels.get("stat", "").startswith("seasonal_") and ts + WEEK_HOURS * HOUR_MS <= at
        ]
        if rows:
            carried += int(vault.write(rows, {BASELINE_METRIC: "gauge"}))
    computed = run_baselines(vault, due, at) if due else []
    trusted = sum(b.trusted for b in computed)
    return {
        "recomputed": trusted,
        "untrusted": len(computed) - trusted,
        "carried_forward": carried,
    }


def _stored(
    vault: Any, spec: BaselineSpec, at: int, interval_ms: int
) -> list[tuple[dict[str, str], int, float]]:
    """The last stored sample of each baseline series of ``spec``'s source metrics within
    ``interval`` before ``at``."""
    reader = vault.sample_reader()
    metrics = {
        reader.index.get(sid).metric for sid in reader.index.match(parse_selectors(spec.selector))
    } - {BASELINE_METRIC}
    out: list[tuple[dict[str, str], int, float]] = []
    for metric in sorted(metrics):
        sel = f'{BASELINE_METRIC}{{source_metric="{metric}"}}'
        for labels, ts, values in vault.select_series(
            sel, at - interval_ms, at + 1, stale_markers=False
        ):
            if ts.size:
                lab = {k: v for k, v in labels.items() if k != "__name__"}
                if spec.by and set(lab) - {"stat", "source_metric"} - set(spec.by):
                    continue
                out.append((lab, int(ts[-1]), float(values[-1])))
    return out
