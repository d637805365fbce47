"""The experiments table's summary figures for a page of runs in one or two reads.

``archive.compare.summarise`` asks four aggregate queries per experiment (GPU utilisation,
energy, MFU, final loss); a page of 50 rows cost about 200 of them. For runs with
``metricvault.track``'s selector ``{experiment="<id>"}`` (as ``ui_curves`` batches Compare's
curves) one raw read of utilisation, MFU and loss over all the page's windows gives the same
figures: per run and series, the count, sum and last of the finite samples inside the run's
own window ``[start, end)``. Energy (a counter's increase, which looks back before the
window) is read raw once to see which runs have any; only those are asked the exact
aggregate query, one each (tracked runs rarely carry DCGM series). Means are sums over
counts as the per-run path computes them; sums may differ from the rollup tiers' in the last
bits of a float (``tests/unit/test_ui_summaries.py`` compares them). Other selectors (a
tenant-confined one, a job's ``or``), other tiers, or windows before the raw horizon are left
to the per-run path (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from metricvault.experiment import Experiment
from metricvault.server.ui_curves import keyed_runs, tracked


def page_summaries(
    vault: Any, exps: Sequence[Experiment], now: int
) -> dict[str, dict[str, Any]] | None:
    """Per experiment id, ``summarise``'s figures that the table shows (``gpus``,
    ``gpu_hours``, ``energy_kwh``, ``final_loss``, ``mfu_mean``, ``gpu_util_mean``; NaN where
    the metric is absent), or None where the batch does not apply."""
    from metricvault.archive.compare import (
        GPU_ENERGY,
        GPU_UTIL,
        HOUR_MS,
        LOSS,
        MFU,
        MJ_PER_KWH,
        restrict,
    )

    if not tracked(exps) or getattr(vault, "tier", "raw") != "raw":
        return None
    if not callable(getattr(vault, "horizons", None)):
        return None
    windows = {e.id: e.window(now) for e in exps}
    start = min(s for s, _ in windows.values())
    end = max(e for _, e in windows.values())
    horizon = int(vault.horizons().raw_start_ms)
    if (horizon and start < horizon) or end <= start:
        return None
    ids = "|".join(windows)
    names = "|".join((GPU_UTIL, MFU, LOSS))
    frame = vault.query(f'{{__name__=~"{names}",experiment=~"{ids}"}}', start, end)
    per_metric = {
        name: _by_run(
            _series_figures(frame[frame["metric"] == name] if len(frame) else frame, windows)
        )
        for name in (GPU_UTIL, MFU, LOSS)
    }
    energy = vault.query(f'{GPU_ENERGY}{{experiment=~"{ids}"}}', start, end)
    with_energy = set(_series_figures(energy, windows)["run"]) if len(energy) else set()
    out: dict[str, dict[str, Any]] = {}
    for exp in exps:
        lo, hi = windows[exp.id]
        hours = (hi - lo) / HOUR_MS
        util = per_metric[GPU_UTIL].get(exp.id, _EMPTY)
        mfus = per_metric[MFU].get(exp.id, _EMPTY)
        losses = per_metric[LOSS].get(exp.id, _EMPTY)
        gpus = len(util)
        kwh = math.nan
        if exp.id in with_energy:
            sel = restrict(exp.selector, GPU_ENERGY)
            got = vault.query(sel, lo, hi, step="all", aggs=("increase",))
            if len(got):
                kwh = float(got["increase"].sum()) / MJ_PER_KWH
        out[exp.id] = {
            "gpus": gpus,
            "gpu_hours": gpus * hours,
            "energy_kwh": kwh,
            "final_loss": float(losses["last"].mean()) if len(losses) else math.nan,
            "mfu_mean": _ratio(mfus),
            "gpu_util_mean": _ratio(util),
        }
    return out


_EMPTY = pd.DataFrame(columns=["run", "key", "count", "sum", "last"])


def _by_run(figures: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(run): part for run, part in figures.groupby("run", sort=False)}


def _ratio(figures: pd.DataFrame) -> float:
    total = float(figures["count"].sum()) if len(figures) else 0.0
    return float(figures["sum"].sum()) / total if total else math.nan


def _series_figures(frame: pd.DataFrame, windows: dict[str, tuple[int, int]]) -> pd.DataFrame:
    """Per (run, series) with a finite sample in the run's window: ``count``, ``sum`` and
    ``last`` (the value of the latest) of its finite samples there, as ``step="all"`` answers
    (a series whose samples there are all NaN has no row)."""
    if not len(frame):
        return _EMPTY
    rows = keyed_runs(frame, windows)
    values = pd.to_numeric(rows["value"], errors="coerce").to_numpy(np.float64)
    rows = rows[np.isfinite(values)]
    if not len(rows):
        return _EMPTY
    rows = rows.assign(value=rows["value"].astype(np.float64)).sort_values(
        ["run", "key", "timestamp"], kind="stable"
    )
    grouped = rows.groupby(["run", "key"], sort=True)["value"]
    figures: pd.DataFrame = grouped.agg(["count", "sum", "last"]).reset_index()
    return figures
