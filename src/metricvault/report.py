"""A self-contained HTML report (plots as embedded PNGs) of a vault and its training jobs."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from metricvault.durations import ms_to_datetime

if TYPE_CHECKING:
    import pandas as pd

    from metricvault.sim import ClusterSpec
    from metricvault.store.vault import Vault


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_STYLE = """<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}
table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"""


def figure_html(fig: Any, title: str, table: list[dict[str, Any]] | None = None) -> str:
    """A standalone HTML page holding one figure (embedded PNG) and an optional table."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"{_STYLE}</head><body><h1>{html.escape(title)}</h1>{_table(table or [])}"
        f"<img src='data:image/png;base64,{_png(fig)}'></body></html>\n"
    )


def _job_curves(vault: Vault, ids: list[str], metric: str, step: str) -> Any:
    from metricvault.archive.compare import curves

    fig, ax = plt.subplots(figsize=(9, 3.2))
    for exp_id, part in curves(vault, ids, metric, align="elapsed", step=step).groupby(
        "experiment", sort=False
    ):
        ax.plot(part["x"], part["value"], label=str(exp_id))
    ax.set_xlabel("hours since the experiment started")
    ax.set_ylabel(f"{metric} ({step} mean)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _node_band(vault: Vault, spec: ClusterSpec, metric: str) -> Any:
    fig, ax = plt.subplots(figsize=(9, 3.2))
    frame = vault.query(metric, spec.start_ms, _end(spec), step="1h", aggs=("mean", "min", "max"))
    for host, rows in frame.groupby("Hostname"):
        per_hour = rows.groupby("timestamp").agg({"mean": "mean", "min": "min", "max": "max"})
        times = [t.to_pydatetime() for t in per_hour.index]
        ax.plot(times, per_hour["mean"], label=f"{host} mean")
        ax.fill_between(times, per_hour["min"], per_hour["max"], alpha=0.15)
    ax.set_ylabel(f"{metric}\n(1h mean, min-max band)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def _end(spec: ClusterSpec) -> int:
    return spec.start_ms + int(spec.days * 86_400_000)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row.values()) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def write_report(
    vault: Vault,
    spec: ClusterSpec,
    ids: list[str],
    jobs: pd.DataFrame,
    stats: dict[str, Any],
    path: Path,
) -> None:
    plots = {
        "MFU of the two runs, aligned by elapsed time": _job_curves(vault, ids, "mfu", "1h"),
        "Training loss, aligned by elapsed time": _job_curves(vault, ids, "train_loss", "1h"),
        "GPU utilisation per node": _node_band(vault, spec, "DCGM_FI_DEV_GPU_UTIL"),
        "GPU power per node (W)": _node_band(vault, spec, "DCGM_FI_DEV_POWER_USAGE"),
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
    period = f"{ms_to_datetime(spec.start_ms):%Y-%m-%d} to {ms_to_datetime(_end(spec)):%Y-%m-%d}"
    path.write_text(
        f"""<!doctype html><html><head><meta charset="utf-8"><title>metricvault demo</title>
{_STYLE}
</head><body><h1>metricvault demo report</h1>
<p><b>Simulated data</b> (metricvault.sim, seed {spec.seed}): {spec.nodes} nodes x
{spec.gpus_per_node} GPUs, {period}, 5 s samples. Every series carries
<code>simulated="true"</code>. Vault: <code>{html.escape(stats["uri"])}</code>,
{stats["series"]:,} series.</p>
<h2>Training jobs (experiments compared)</h2>{_table(records(jobs))}
<h2>Storage per tier</h2>{_table(storage)}
<h2>Plots</h2>{figures}
</body></html>
"""
    )
