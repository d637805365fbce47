"""Experiments side by side: summary statistics, and curves aligned by step or elapsed time.

Everything comes from vault (or snapshot) queries restricted to each experiment's selector and
time window. Metric names follow dcgm-exporter for GPUs and ``metricvault.track`` for training
(``mfu``, ``train_loss``, ``train_step``); other names can be passed in.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from metricvault.durations import ms_to_datetime
from metricvault.errors import InputError, NotFoundError
from metricvault.experiment import Experiment
from metricvault.model import TIER_RESOLUTION_MS
from metricvault.protocols import has
from metricvault.selector import Matcher, Selector, parse_selectors

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ, a counter
MFU = "mfu"
LOSS = "train_loss"
STEP = "train_step"
MJ_PER_KWH = 3.6e9
ALIGNMENTS = ("elapsed", "step", "time")
SHAPE_COLUMNS = ("timestamp", "metric", "value")  # the long shape's non-label columns
MARKERS_UP_TO = 50  # points per line; fewer are drawn with markers so one point still shows
MINUTE_MS, HOUR_MS = TIER_RESOLUTION_MS["1m"], TIER_RESOLUTION_MS["1h"]
AUTO_POINTS = 200  # step="auto": the coarsest tier that still gives this many points


def experiment_of(vault: Any, experiment_id: str | Experiment) -> Experiment:
    """The experiment record from a vault's registry, or the one an opened snapshot holds."""
    if isinstance(experiment_id, Experiment):
        return experiment_id
    if has(vault, "experiments"):  # a snapshot has no registry (it refuses the attribute)
        exp: Experiment = vault.experiments.get(experiment_id)
        return exp
    held: Experiment = vault.experiment
    if held.id != experiment_id:
        raise NotFoundError(
            f"snapshot {vault.path.name} holds experiment {held.id!r}, not {experiment_id!r}: "
            f"open {experiment_id}'s snapshot, or ask for {held.id!r}"
        )
    return held


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
    gpu_model: str
    gpu_list: str  # the GPUs it was given, e.g. "node01: 0-7; node02: 0-7"


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
    hours = (end - start) / HOUR_MS
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
        gpu_model=_gpu_model(util, exp.params),
        gpu_list=_gpu_list(util, exp.params),
    )


def _gpu_model(util: pd.DataFrame, params: Mapping[str, Any]) -> str:
    """The DCGM series' ``modelName``; else the model ``metricvault.track`` recorded."""
    if "modelName" in util.columns and util["modelName"].notna().any():
        return ", ".join(sorted(util["modelName"].dropna().unique()))
    return str(params.get("gpu") or "")


def _gpu_list(util: pd.DataFrame, params: Mapping[str, Any]) -> str:
    """Host and GPU indices of the DCGM series with data; else what ``track`` recorded."""
    if {"Hostname", "gpu"} <= set(util.columns) and len(util):
        hosts = util.dropna(subset=["Hostname", "gpu"]).groupby("Hostname")["gpu"]
        return "; ".join(f"{host}: {_ranges(gpus)}" for host, gpus in hosts)
    if params.get("gpus") and params.get("host"):
        return f"{params['host']}: {params['gpus']} GPU(s)"
    return ""


def _ranges(values: Iterable[Any]) -> str:
    """``["0", "1", "2", "5"]`` -> ``"0-2, 5"`` (non-numeric ids are listed as they are)."""
    texts = sorted(
        {str(v) for v in values}, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v)
    )
    numbers = [int(v) for v in texts if v.isdigit()]
    spans: list[str] = []
    for _, run in itertools.groupby(enumerate(numbers), lambda p: p[1] - p[0]):
        block = [n for _, n in run]
        spans.append(str(block[0]) if len(block) == 1 else f"{block[0]}-{block[-1]}")
    return ", ".join(spans + [v for v in texts if not v.isdigit()])


def _ratio(frame: pd.DataFrame, num: str, den: str) -> float:
    total = float(frame[den].sum()) if len(frame) else 0.0
    return float(frame[num].sum()) / total if total else math.nan


def compare(vault: Any, experiment_ids: Sequence[str], **options: Any) -> pd.DataFrame:
    """A table with one row of :class:`Summary` figures per experiment, then one column
    ``param.<key>`` per parameter any of them has (see :func:`params_table`)."""
    exps = [experiment_of(vault, i) for i in experiment_ids]
    frame = pd.DataFrame([asdict(summarise(vault, e, **options)) for e in exps])
    for key in sorted(set().union(*(e.params for e in exps))):
        frame[f"param.{key}"] = [e.params.get(key) for e in exps]
    return frame


def params_table(vault: Any, experiment_ids: Sequence[str]) -> pd.DataFrame:
    """One row per parameter: ``param``, its value in each experiment as text ('' where it
    has none) and ``differs`` (whether the runs disagree)."""
    exps = [experiment_of(vault, i) for i in experiment_ids]
    rows: list[dict[str, Any]] = []
    for key in sorted(set().union(*(e.params for e in exps))):
        cells = [_param_text(e.params[key]) if key in e.params else "" for e in exps]
        differs = len(set(cells)) > 1
        rows.append({"param": key, **dict(zip(experiment_ids, cells, strict=True))})
        rows[-1]["differs"] = differs
    return pd.DataFrame(rows, columns=["param", *experiment_ids, "differs"])


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


# The summary as `metricvault demo` and `experiment compare` print it: (header, column, format).
DISPLAY = (
    ("experiment", "experiment", "{}"),
    ("GPUs", "gpus", "{}"),
    ("hours", "duration_h", "{:.1f}"),
    ("GPU-h", "gpu_hours", "{:,.0f}"),
    ("util %", "gpu_util_mean", "{:.1f}"),
    ("MFU", "mfu_mean", "{:.3f}"),
    ("kWh", "energy_kwh", "{:,.1f}"),
    ("final loss", "final_loss", "{:.3f}"),
)


def display_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The :func:`compare` table as text, with the headers and number formats the command
    line uses (so the demo report, the demo's console table and the CLI agree)."""
    return pd.DataFrame(
        {header: [form.format(v) for v in frame[column]] for header, column, form in DISPLAY}
    )


# --------------------------------------------------------------------------- history
def history(
    vault: Any,
    experiment: str | Experiment,
    metrics: Iterable[str],
    *,
    step_metric: str = STEP,
    agg: str = "mean",
) -> pd.DataFrame:
    """A frame indexed by training step (``step``), one column per metric.

    Each metric's raw samples are joined to the step series (``train_step``, which
    ``metricvault.track`` logs with every ``run.log``) on the exact timestamp within the same
    series labels, so nothing is bucketed by wall time. Where several samples land on one step
    (ranks logging the same step, or a sampler reading the step more often than it changes)
    they are combined with ``agg`` (``mean``, ``last``, ``min``, ``max``, ``median``). A step
    where a metric has no sample is NaN; a metric sample with no step beside it is left out.
    """
    exp = experiment_of(vault, experiment)
    _needs_raw(vault, exp)
    names = list(metrics)
    steps = _keyed(_raw(vault, exp, step_metric))
    if steps.empty:
        _check_retention(vault, exp)
        raise NotFoundError(
            f"experiment {exp.id!r} has no {step_metric!r} series between its start and end, so "
            "its metrics cannot be placed by step: log the step with metricvault.track "
            "(run.log(step, ...)), or align by time (--align elapsed)"
        )
    steps = steps.rename(columns={"value": "step"})
    columns = {}
    for metric in names:
        samples = _keyed(_raw(vault, exp, metric))
        if samples.empty:
            raise NotFoundError(
                f"experiment {exp.id!r} has no {metric!r} samples between its start and end: "
                "check the metric name with `metricvault series`"
            )
        joined = samples.merge(steps, on=["key", "timestamp"])
        columns[metric] = joined.groupby("step")["value"].agg(agg)
    frame = pd.DataFrame(columns, columns=names).sort_index()
    steps_seen = frame.index.to_numpy(dtype="float64")
    if len(frame) and (steps_seen == np.round(steps_seen)).all():
        frame.index = frame.index.astype("int64")
    frame.index.name = "step"
    return frame


def _needs_raw(vault: Any, exp: Experiment) -> None:
    tier = getattr(vault, "tier", "raw")  # an opened snapshot says which tier it holds
    if tier != "raw":
        raise InputError(
            f"{vault.path.name} holds {tier} rollups of {exp.id!r}; history joins raw samples "
            "to the step series exactly: open a raw snapshot (`metricvault archive export "
            f"{exp.id} --tier raw`)"
        )


def _check_retention(vault: Any, exp: Experiment) -> None:
    """Raw samples that retention dropped are only in a raw snapshot made before: say so."""
    horizon = int(vault.horizons().raw_start_ms)  # a snapshot's: 0, it keeps what it holds
    if horizon and exp.start_ms < horizon:
        setting = getattr(getattr(vault, "settings", None), "retention_raw", "?")
        raise NotFoundError(
            f"experiment {exp.id!r} started {ms_to_datetime(exp.start_ms):%Y-%m-%d}, before "
            f"the raw retention (retention_raw={setting}) dropped raw samples up to "
            f"{ms_to_datetime(horizon):%Y-%m-%d}: history needs them; open its raw snapshot "
            f"(`metricvault archive restore {exp.id}`, then Vault.open(path).history(...)), or "
            "compare by time from the rollups (--align elapsed)"
        )


def _raw(vault: Any, exp: Experiment, metric: str) -> pd.DataFrame:
    sel = restrict(exp.selector, metric)
    if not sel:
        return pd.DataFrame(columns=list(SHAPE_COLUMNS))
    start, end = exp.window()
    frame: pd.DataFrame = vault.query(sel, start, end)
    return frame


def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """``key`` (the series' label set as text), ``timestamp``, ``value``."""
    labels = sorted(c for c in frame.columns if c not in SHAPE_COLUMNS)
    # each present label contributes "name=value\0": equal keys mean equal label sets, even
    # when one frame has label columns (from other series) that the other lacks
    parts = [(name + "=" + frame[name].astype("string") + "\0").fillna("") for name in labels]
    key = functools.reduce(operator.add, parts) if parts else pd.Series("", index=frame.index)
    return pd.DataFrame({"key": key, "timestamp": frame["timestamp"], "value": frame["value"]})


# --------------------------------------------------------------------------- curves
def curves(
    vault: Any,
    experiment_ids: Sequence[str],
    metric: str,
    *,
    align: str = "elapsed",
    step: str = "auto",
) -> pd.DataFrame:
    """``metric`` of each experiment with an ``x`` column: the training step (``step``: the
    exact join of :func:`history`, raw resolution), hours since the experiment's start
    (``elapsed``) or wall-clock time (``time``). For the last two ``value`` is the mean over
    the experiment's series per ``step`` bucket; ``step="auto"`` picks raw samples for short
    runs and 1m or 1h buckets once that still gives 200 points, ``"raw"`` forces raw."""
    if align not in ALIGNMENTS:
        raise InputError(f"unknown alignment {align!r}; choose from {', '.join(ALIGNMENTS)}")
    exps = [experiment_of(vault, i) for i in experiment_ids]
    resolution = _resolution(exps, step)
    frames = []
    for exp in exps:
        if align == "step":
            frame = history(vault, exp, [metric]).reset_index()
            frame = frame.rename(columns={"step": "x", metric: "value"}).dropna(subset=["value"])
        else:
            frame = _time_means(vault, exp, metric, resolution)
            if frame.empty:
                raise NotFoundError(
                    f"experiment {exp.id!r} has no {metric!r} data between its start and end: "
                    "check the metric name with `metricvault series`"
                )
            frame["x"] = _x(exp, frame, align)
        frame["experiment"] = exp.id
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _resolution(exps: Sequence[Experiment], step: str) -> str | None:
    """The bucket width for time-aligned curves; None: raw samples."""
    if step == "raw":
        return None
    if step != "auto":
        return step
    longest = max(end - start for start, end in (e.window() for e in exps))
    if longest >= AUTO_POINTS * HOUR_MS:
        return "1h"
    return "1m" if longest >= AUTO_POINTS * MINUTE_MS else None


def _time_means(vault: Any, exp: Experiment, metric: str, step: str | None) -> pd.DataFrame:
    sel = restrict(exp.selector, metric)
    if not sel:
        return pd.DataFrame(columns=["timestamp", "value"])
    start, end = exp.window()
    if step is None:
        raw = vault.query(sel, start, end)
        result: pd.DataFrame = raw.groupby("timestamp", as_index=False)["value"].mean()
        return result
    buckets = vault.query(sel, start, end, step=step, aggs=("sum", "count"))
    grouped = buckets.groupby("timestamp", as_index=False)[["sum", "count"]].sum()
    grouped["value"] = grouped["sum"] / grouped["count"]
    result = grouped[["timestamp", "value"]]
    return result


def _x(exp: Experiment, frame: pd.DataFrame, align: str) -> pd.Series:
    if align == "time":
        return frame["timestamp"]
    start = pd.Timestamp(exp.start_ms, unit="ms", tz="UTC")
    hours: pd.Series = (frame["timestamp"] - start).dt.total_seconds() / 3600
    return hours


X_LABELS = {"elapsed": "hours since start", "step": "training step", "time": "time (UTC)"}


def figure(
    vault: Any,
    experiment_ids: Sequence[str],
    metrics: Sequence[str],
    *,
    align: str = "elapsed",
    step: str = "auto",
) -> Any:
    """A matplotlib figure: one panel per metric, one line per experiment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(12, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        data = curves(vault, experiment_ids, metric, align=align, step=step)
        for exp_id, part in data.groupby("experiment", sort=False):
            draw_line(ax, part["x"], part["value"], label=str(exp_id))
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel(X_LABELS[align])
    fig.suptitle(" vs ".join(experiment_ids))
    fig.tight_layout()
    return fig


def draw_line(ax: Any, x: Any, y: Any, **style: Any) -> Any:
    """``ax.plot`` with markers when there are few points: a line through one point is
    invisible."""
    marker = "o" if len(x) <= MARKERS_UP_TO else None
    (line,) = ax.plot(x, y, marker=marker, markersize=4, linewidth=1.2, **style)
    return line


def plot(
    vault: Any,
    experiment_ids: Sequence[str],
    metrics: Sequence[str],
    path: str | Path,
    *,
    align: str = "elapsed",
    step: str = "auto",
) -> Path:
    """Write one panel per metric, one line per experiment, as PNG or HTML (by suffix)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix not in (".png", ".html"):
        raise InputError(f"--plot {path}: the file must end in .png or .html")
    fig = figure(vault, experiment_ids, metrics, align=align, step=step)
    if path.suffix == ".png":
        fig.savefig(path, dpi=110)
        plt.close(fig)
    else:
        from metricvault.archive.page import figure_html, records

        table = records(display_table(compare(vault, experiment_ids)))
        params = records(params_table(vault, experiment_ids))
        path.write_text(
            figure_html(fig, title=" vs ".join(experiment_ids), table=table, params=params)
        )
    return path
