"""Experiments side by side: summary statistics, and curves aligned by step or elapsed time.

Everything comes from vault (or snapshot) queries restricted to each experiment's selector and
time window. Metric names follow dcgm-exporter for GPUs and ``metricvault.track`` for training
(``mfu``, ``train_loss``, ``train_step``); other names can be passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from metricvault.archive.experiments import Experiment
from metricvault.errors import InputError, NotFoundError
from metricvault.selector import Matcher, Selector, parse_selectors

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ, a counter
MFU = "mfu"
LOSS = "train_loss"
STEP = "train_step"
MJ_PER_KWH = 3.6e9
ALIGNMENTS = ("elapsed", "step", "time")


def restrict(selector: str, metric: str) -> str:
    """The experiment's selector narrowed to one metric (each ``or`` part gets the name)."""
    parts = []
    for part in parse_selectors(selector).parts:
        pinned = part.metric
        if pinned is not None and pinned != metric:
            continue
        rest = tuple(m for m in part.matchers if m.name != "__name__" or m.op != "=")
        parts.append(str(Selector((Matcher("__name__", "=", metric), *rest))))
    return " or ".join(parts)


@dataclass(frozen=True)
class Summary:
    experiment: str
    duration_h: float
    gpus: int
    gpu_hours: float
    gpu_util_mean: float
    gpu_util_max: float
    mfu_mean: float
    energy_kwh: float
    final_loss: float


def summarise(
    vault: Any, exp: Experiment, *, mfu: str = MFU, loss: str = LOSS, now: int | None = None
) -> Summary:
    """One experiment's figures; a figure whose metric is absent is NaN (never a guess)."""
    start, end = exp.window(now)

    def ask(metric: str, aggs: tuple[str, ...]) -> pd.DataFrame:
        sel = restrict(exp.selector, metric)
        if not sel:
            return pd.DataFrame(columns=list(aggs))
        frame: pd.DataFrame = vault.query(sel, start, end, step="all", aggs=aggs)
        return frame

    util = ask(GPU_UTIL, ("sum", "count", "max"))
    energy = ask(GPU_ENERGY, ("increase",))
    mfus = ask(mfu, ("sum", "count"))
    losses = ask(loss, ("last",))
    hours = (end - start) / 3_600_000
    gpus = len(util)
    return Summary(
        experiment=exp.id,
        duration_h=hours,
        gpus=gpus,
        gpu_hours=gpus * hours,
        gpu_util_mean=_ratio(util, "sum", "count"),
        gpu_util_max=float(util["max"].max()) if gpus else math.nan,
        mfu_mean=_ratio(mfus, "sum", "count"),
        energy_kwh=float(energy["increase"].sum()) / MJ_PER_KWH if len(energy) else math.nan,
        final_loss=float(losses["last"].mean()) if len(losses) else math.nan,
    )


def _ratio(frame: pd.DataFrame, num: str, den: str) -> float:
    total = float(frame[den].sum()) if len(frame) else 0.0
    return float(frame[num].sum()) / total if total else math.nan


def compare(vault: Any, experiment_ids: Sequence[str], **options: Any) -> pd.DataFrame:
    """A table with one row of :class:`Summary` figures per experiment."""
    rows = [asdict(summarise(vault, vault.experiments.get(i), **options)) for i in experiment_ids]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- curves
def curves(
    vault: Any,
    experiment_ids: Sequence[str],
    metric: str,
    *,
    align: str = "elapsed",
    step: str = "1m",
) -> pd.DataFrame:
    """``metric`` of each experiment (mean over its series per ``step`` bucket) with an ``x``
    column: hours since the experiment's start (``elapsed``), the training step (``step``, from
    the ``train_step`` series) or wall-clock time (``time``)."""
    if align not in ALIGNMENTS:
        raise InputError(f"unknown alignment {align!r}; choose from {', '.join(ALIGNMENTS)}")
    frames = []
    for exp_id in experiment_ids:
        exp = vault.experiments.get(exp_id)
        frame = _bucket_means(vault, exp, metric, step)
        if frame.empty:
            raise NotFoundError(
                f"experiment {exp_id!r} has no {metric!r} data between its start and end: "
                "check the metric name with `metricvault series`"
            )
        frame["x"] = _x(vault, exp, frame, align, step)
        frame["experiment"] = exp_id
        frames.append(frame.dropna(subset=["x"]))
    return pd.concat(frames, ignore_index=True)


def _bucket_means(vault: Any, exp: Experiment, metric: str, step: str) -> pd.DataFrame:
    sel = restrict(exp.selector, metric)
    if not sel:
        return pd.DataFrame(columns=["timestamp", "value"])
    start, end = exp.window()
    raw = vault.query(sel, start, end, step=step, aggs=("sum", "count"))
    grouped = raw.groupby("timestamp", as_index=False)[["sum", "count"]].sum()
    grouped["value"] = grouped["sum"] / grouped["count"]
    result: pd.DataFrame = grouped[["timestamp", "value"]]
    return result


def _x(vault: Any, exp: Experiment, frame: pd.DataFrame, align: str, step: str) -> pd.Series:
    if align == "time":
        return frame["timestamp"]
    if align == "elapsed":
        start = pd.Timestamp(exp.start_ms, unit="ms", tz="UTC")
        return (frame["timestamp"] - start).dt.total_seconds() / 3600
    steps = _bucket_means(vault, exp, STEP, step)
    if steps.empty:
        raise NotFoundError(
            f"experiment {exp.id!r} has no {STEP!r} series, so its curves cannot be aligned by "
            "step: log the step with metricvault.track (run.log(step, ...)) or use --align elapsed"
        )
    mapped = frame[["timestamp"]].merge(steps, on="timestamp", how="left")["value"]
    return mapped.set_axis(frame.index)


def plot(
    vault: Any,
    experiment_ids: Sequence[str],
    metrics: Sequence[str],
    path: str | Path,
    *,
    align: str = "elapsed",
    step: str = "1m",
) -> Path:
    """Write one panel per metric, one line per experiment, as PNG or HTML (by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix not in (".png", ".html"):
        raise InputError(f"--plot {path}: the file must end in .png or .html")
    fig, axes = plt.subplots(len(metrics), 1, figsize=(9, 3 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        data = curves(vault, experiment_ids, metric, align=align, step=step)
        for exp_id, part in data.groupby("experiment", sort=False):
            ax.plot(part["x"], part["value"], label=str(exp_id), linewidth=1)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel(
        {"elapsed": "hours since start", "step": "training step", "time": "time (UTC)"}[align]
    )
    fig.suptitle(" vs ".join(experiment_ids))
    fig.tight_layout()
    if path.suffix == ".png":
        fig.savefig(path, dpi=110)
    else:
        from metricvault.report import figure_html, records

        table = records(compare(vault, experiment_ids))
        path.write_text(figure_html(fig, title=" vs ".join(experiment_ids), table=table))
    plt.close(fig)
    return path
