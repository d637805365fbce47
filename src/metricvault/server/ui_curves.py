"""Compare's step curves for many runs in two reads instead of two per run.

``metricvault.track`` gives every run the selector ``{experiment="<id>"}``; for such runs the
curves of ``history`` (each metric joined to ``train_step`` on the timestamp within the same
series, the mean per step) are computed from one read of ``train_step`` and one of the metric
over all the runs' windows, split by the ``experiment`` label and each run's own window. The
result is what one ``history`` per run gives (``tests/unit/test_ui_curves.py`` checks it);
runs with any other selector (a tenant-confined one, a job's ``or`` of label sets), or windows
before the raw horizon, are left to the per-run path (``None``).
"""

from __future__ import annotations

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
    steps = keyed_runs(vault.query(f'{STEP}{{experiment=~"{ids}"}}', start, end), windows)
    samples = keyed_runs(vault.query(f'{metric}{{experiment=~"{ids}"}}', start, end), windows)
    out: dict[str, dict[str, Any] | None] = dict.fromkeys(windows)
    if steps.empty or samples.empty:
        return out
    # the experiment label is in the key: rows join within their own run only
    joined = samples.merge(steps.rename(columns={"value": "step"}), on=["key", "timestamp", "run"])
    means = joined.groupby(["run", "step"], sort=True)["value"].agg("mean")
    for run, column in means.groupby(level="run", sort=False):
        column = column.droplevel("run")
        x, y = downsample(column.index.to_numpy(dtype=np.float64), column.to_numpy(), width)
        out[str(run)] = {"x": _json(x), "y": _json(y), "points": int(column.notna().sum())}
    return out


def _json(values: np.ndarray) -> list[float | None]:
    """Floats for JSON, null for NaN/inf (``ui_api.finite`` of each, vectorised)."""
    return [v if math.isfinite(v) else None for v in values.astype(np.float64).tolist()]


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
