"""A self-contained HTML report (plots as embedded PNGs) of a vault and its training jobs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from metricvault import __version__
from metricvault.archive.page import STYLE as _STYLE
from metricvault.archive.page import png as _png
from metricvault.archive.page import records
from metricvault.archive.page import table_html as _table
from metricvault.durations import ms_to_datetime, now_ms

if TYPE_CHECKING:
    import pandas as pd

    from metricvault.demo_archive import ArchiveOutcome
    from metricvault.sim import ClusterSpec
    from metricvault.store.vault import Vault

FIGURE_SIZE = (14, 3.8)  # inches; the page shows every plot at its full width
BAND_ALPHA = 0.15  # the min-max band stays light, under its mean line


def _job_curves(vault: Vault, ids: list[str], metric: str, align: str, step: str) -> Any:
    from metricvault.archive.compare import X_LABELS, curves, draw_line

    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    data = curves(vault, ids, metric, align=align, step=step)
    for exp_id, part in data.groupby("experiment", sort=False):
        draw_line(ax, part["x"], part["value"], label=str(exp_id))
    ax.set_xlabel(X_LABELS[align])
    ax.set_ylabel(metric if align == "step" else f"{metric} ({step} mean)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def node_band(vault: Vault, spec: ClusterSpec, metric: str) -> Any:
    """Per node: the hourly mean over its GPUs as a line, drawn over a light band from the
    lowest to the highest GPU in the same colour."""
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    frame = vault.query(metric, spec.start_ms, _end(spec), step="1h", aggs=("mean", "min", "max"))
    for host, rows in frame.groupby("Hostname"):
        per_hour = rows.groupby("timestamp").agg({"mean": "mean", "min": "min", "max": "max"})
        times = [t.to_pydatetime() for t in per_hour.index]
        (line,) = ax.plot(times, per_hour["mean"], label=f"{host} mean", linewidth=1.4, zorder=3)
        ax.fill_between(
            times,
            per_hour["min"],
            per_hour["max"],
            color=line.get_color(),
            alpha=BAND_ALPHA,
            linewidth=0,
            zorder=1,
            label=f"{host} min-max",
        )
    ax.set_ylabel(f"{metric}\n(1h mean, min-max band)")
    ax.legend(fontsize=8, ncols=2)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def _end(spec: ClusterSpec) -> int:
    return spec.start_ms + int(spec.days * 86_400_000)


def _when(ms: int | None) -> str:
    return f"{ms_to_datetime(ms):%Y-%m-%d %H:%M} UTC" if ms is not None else "running"


def _runs(vault: Vault, ids: list[str]) -> list[dict[str, Any]]:
    """Per run: what reproduces it (commit, params) and when it ran."""
    rows = []
    for exp in (vault.experiments.get(i) for i in ids):
        rows.append(
            {
                "experiment": exp.id,
                "git SHA": exp.git_sha[:12] or "not recorded",
                "start": _when(exp.start_ms),
                "end": _when(exp.end_ms),
                "params": json.dumps(dict(exp.params), sort_keys=True),
                "tags": ", ".join(exp.tags),
            }
        )
    return rows


def _archive(archived: ArchiveOutcome | None) -> str:
    if archived is None:
        return "<p>Not archived.</p>"
    info = archived.snapshot
    row: dict[str, Any] = {
        "experiment": info.experiment.id,
        "snapshot": info.path.name,
        "tier": info.tier,
        "rows": info.rows,
        "bytes": info.bytes,
        "content hash": info.content_hash,
        "git tag": archived.tag or f"not versioned: {archived.note}",
        "commit": archived.commit[:12],
    }
    if archived.restored is not None:
        row["restored by tag"] = "byte-identical" if archived.restored else "DIFFERENT"
    if archived.verified:
        row["verify"] = archived.verified
    return _table([row])


def write_report(
    vault: Vault,
    spec: ClusterSpec,
    ids: list[str],
    jobs: pd.DataFrame,
    stats: dict[str, Any],
    path: Path,
    *,
    archived: ArchiveOutcome | None = None,
    generated_ms: int | None = None,
    took_s: float | None = None,
) -> None:
    from metricvault.archive.compare import display_table

    plots = {
        "MFU of the two runs, aligned by elapsed time": _job_curves(
            vault, ids, "mfu", "elapsed", "1h"
        ),
        "Training loss against training step": _job_curves(
            vault, ids, "train_loss", "step", "auto"
        ),
        "GPU utilisation per node": node_band(vault, spec, "DCGM_FI_DEV_GPU_UTIL"),
        "GPU power per node (W)": node_band(vault, spec, "DCGM_FI_DEV_POWER_USAGE"),
    }
    storage = [
        {
            "tier": tier,
            **{k: v for k, v in t.items() if k in ("files", "rows", "bytes", "bytes_per_row")},
        }
        for tier, t in stats["tiers"].items()
    ]
    figures = "".join(
        f"<h3>{html.escape(title)}</h3><img src='data:image/png;base64,{_png(fig)}'>"
        for title, fig in plots.items()
    )
    summary = display_table(jobs)
    summary["GPUs given"] = list(jobs["gpu_list"])
    period = f"{ms_to_datetime(spec.start_ms):%Y-%m-%d} to {ms_to_datetime(_end(spec)):%Y-%m-%d}"
    generated = ms_to_datetime(now_ms() if generated_ms is None else generated_ms)
    took = f" in {took_s:.0f} s" if took_s is not None else ""
    path.write_text(
        f"""<!doctype html><html><head><meta charset="utf-8"><title>metricvault demo</title>
{_STYLE}
</head><body><h1>metricvault demo report</h1>
<p>generated {generated:%Y-%m-%d %H:%M:%S} UTC by metricvault {__version__}{took}</p>
<p><b>Simulated data</b> (metricvault.sim, seed {spec.seed}): {spec.nodes} nodes x
{spec.gpus_per_node} GPUs, {period}, 5 s samples. Every series carries
<code>simulated="true"</code>. Vault: <code>{html.escape(stats["uri"])}</code>,
{stats["series"]:,} series.</p>
<h2>Training jobs (metricvault experiment compare)</h2>{_table(records(summary))}
<h2>Runs: commit, params, when</h2>{_table(_runs(vault, ids))}
<h2>Archive</h2>{_archive(archived)}
<h2>Storage per tier</h2>{_table(storage)}
<h2>Plots</h2>{figures}
</body></html>
"""
    )
