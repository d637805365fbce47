"""Compare's step curves for many runs in two reads instead of two per run.

``metricvault.track`` gives every run the selector ``{experiment="<id>"}``; for such runs the
curves of ``history`` (each metric joined to ``train_step`` on the timestamp within the same
series, the mean per step) are computed from one read of ``train_step`` and one of the metric
over all the runs' windows, split by the ``experiment`` label and each run's own window, and
joined in numpy (each row's label set a code from its factorised label columns, not text). The
result is what one ``history`` per run gives (``tests/unit/test_ui_curves.py`` checks it);
runs with any other selector (a tenant-confined one, a job's ``or`` of label sets), or windows
before the raw horizon, are left to the per-run path (``None``).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from metricvault.experiment import Experiment
from metricvault.model import is_metric_name

_PLAIN_ID = re.compile(r"^[A-Za-z0-9_-]+$")  # no regex metacharacter: joined with | as is


def tracked(exps: Sequence[Experiment]) -> bool:
    """Every run has track()'s own selector, and an id that needs no escaping in a regex."""
    return bool(exps) and all(
        _PLAIN_ID.match(e.id) and e.selector == f'{{experiment="{e.id}"}}' for e in exps
    )


def step_curves(
    vault: Any, exps: Sequence[Experiment], metric: str, width: int, now: int
) -> dict[str, dict[str, Any] | None] | None:
    """Per run: ``{x, y, points}`` of ``metric`` by training step, downsampled to ``width``
    pixel columns as ``ui_api.history_curves`` draws it, or None where the run has no step
    series or no such metric; None for the whole call where the batch does not apply."""
    from metricvault.archive.compare import STEP
    from metricvault.server.ui_common import downsample

    if not tracked(exps) or not is_metric_name(metric) or metric == STEP:
        return None
    if getattr(vault, "tier", "raw") != "raw":
        return None
    windows = {e.id: e.window(now) for e in exps}
    start = min(s for s, _ in windows.values())
    end = max(e for _, e in windows.values())
    if not callable(getattr(vault, "horizons", None)):
        return None
    horizon = int(vault.horizons().raw_start_ms)
    if horizon and start < horizon:
        return None  # history explains what retention dropped, run by run
    ids = "|".join(windows)
    # by name, not one __name__ regex: that would load every metric's part of the series index
    frame = pd.concat(
        [vault.query(f'{name}{{experiment=~"{ids}"}}', start, end) for name in (STEP, metric)],
        ignore_index=True,
    )
    out: dict[str, dict[str, Any] | None] = dict.fromkeys(windows)
    joined = _joined_to_steps(frame, windows, STEP)
    if joined is None:
        return out
    means = joined.groupby(["run", "step"], sort=True)["value"].agg("mean")
    runs = means.index.get_level_values("run").to_numpy()
    steps = means.index.get_level_values("step").to_numpy(dtype=np.float64)
    values = means.to_numpy(dtype=np.float64)
    bounds = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1], True])
    names = list(windows)
    for lo, hi in itertools.pairwise(bounds.tolist()):
        y = values[lo:hi]
        x, y_drawn = downsample(steps[lo:hi], y, width)
        points = int(np.count_nonzero(~np.isnan(y)))
        out[names[int(runs[lo])]] = {"x": _json(x), "y": _json(y_drawn), "points": points}
    return out


def _joined_to_steps(
    frame: pd.DataFrame, windows: dict[str, tuple[int, int]], step_metric: str
) -> pd.DataFrame | None:
    """The metric's samples inside their own run's window with the step sampled at the same
    time in the same series (same labels but the name) beside them: ``run`` (the run's
    position in ``windows``), ``step``, ``value``, as ``history`` joins them; None when there
    are none."""
    if not len(frame) or "experiment" not in frame.columns:
        return None
    ms = _epoch_ms(frame["timestamp"])
    run_of = {r: i for i, r in enumerate(windows)}
    labels, names = pd.factorize(frame["experiment"])
    position = np.array([run_of.get(str(n), -1) for n in names], np.int64)[labels]
    lo = np.array([windows[str(n)][0] if str(n) in run_of else 0 for n in names], np.int64)
    hi = np.array([windows[str(n)][1] if str(n) in run_of else 0 for n in names], np.int64)
    inside = (position >= 0) & (ms >= lo[labels]) & (ms < hi[labels])
    series = _label_sets(frame)
    is_step = (frame["metric"] == step_metric).to_numpy(dtype=bool)
    steps, samples = inside & is_step, inside & ~is_step
    if not steps.any() or not samples.any():
        return None
    # (series, time) as one sortable key: a sample's step is the step row with the same key
    times, time_code = np.unique(ms, return_inverse=True)
    key = series.astype(np.int64) * len(times) + time_code
    step_keys, step_values = key[steps], frame["value"].to_numpy(np.float64)[steps]
    order = np.argsort(step_keys, kind="stable")
    step_keys, step_values = step_keys[order], step_values[order]
    at = np.minimum(np.searchsorted(step_keys, key[samples]), len(step_keys) - 1)
    found = step_keys[at] == key[samples]
    return pd.DataFrame(
        {
            "run": position[samples][found],
            "step": step_values[at[found]],
            "value": frame["value"].to_numpy(np.float64)[samples][found],
        }
    )


def _label_sets(frame: pd.DataFrame) -> np.ndarray:
    """Per row, a code of its label set (the columns but time, name and value; a null label
    is absent): equal codes, equal label sets."""
    from metricvault.archive.compare import SHAPE_COLUMNS

    code = np.zeros(len(frame), np.int64)
    for name in sorted(c for c in frame.columns if c not in SHAPE_COLUMNS):
        values, uniques = pd.factorize(frame[name])  # null: -1
        code, _ = pd.factorize(code * (len(uniques) + 1) + (values + 1))
    return code


def _epoch_ms(timestamps: pd.Series) -> np.ndarray:
    """Epoch milliseconds of a column of datetimes."""
    since = pd.to_datetime(timestamps, utc=True) - pd.Timestamp(0, tz="UTC")
    return np.asarray((since // pd.Timedelta(milliseconds=1)).to_numpy(np.int64))


def _json(values: np.ndarray) -> list[float | None]:
    """Floats for JSON, null for NaN/inf (``ui_api.finite`` of each, vectorised)."""
    floats = values.astype(np.float64)
    if np.isfinite(floats).all():  # most curves: no per-value test
        out: list[float | None] = floats.tolist()
        return out
    return [v if math.isfinite(v) else None for v in floats.tolist()]


def keyed_runs(frame: pd.DataFrame, windows: dict[str, tuple[int, int]]) -> pd.DataFrame:
    """``_keyed`` of the rows inside their own run's window ``[start, end)``, with ``run``
    (the experiment label) beside them. Label columns other runs brought are null in a run's
    rows, which ``_keyed`` reads as absent: the keys are those of the run's own read."""
    from metricvault.archive.compare import _keyed

    if not len(frame) or "experiment" not in frame.columns:
        return pd.DataFrame(columns=["key", "timestamp", "value", "run"])
    since = pd.to_datetime(frame["timestamp"], utc=True) - pd.Timestamp(0, tz="UTC")
    ms = (since // pd.Timedelta(milliseconds=1)).to_numpy(np.int64)
    codes, runs = pd.factorize(frame["experiment"].astype(str))
    lo = np.array([windows[r][0] for r in runs], dtype=np.int64)[codes]
    hi = np.array([windows[r][1] for r in runs], dtype=np.int64)[codes]
    inside = (ms >= lo) & (ms < hi)
    return _keyed(frame[inside]).assign(run=np.asarray(runs, dtype=object)[codes[inside]])
