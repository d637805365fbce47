"""Standalone HTML pieces (a figure as an embedded PNG, tables) shared by the comparison page
(``experiment compare --plot x.html``) and the full report (``metricvault report``).

Its own module so that :mod:`metricvault.archive.compare` and :mod:`metricvault.report` need
not import each other (that would be an import cycle); it sits in ``archive``, which the
report may import.
"""

from __future__ import annotations

import base64
import html
import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

STYLE = """<style>body{font-family:sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}
img{width:100%;height:auto}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td.text{text-align:left}
tr.differs td{background:#fff3c4;font-weight:bold}</style>"""


def png(fig: Any) -> str:
    """The figure as base64 PNG; the figure is closed (pyplot would keep it alive)."""
    # lazily: importing this module (e.g. for records) must not load matplotlib
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def figure_html(
    fig: Any,
    title: str,
    table: list[dict[str, Any]] | None = None,
    params: list[dict[str, Any]] | None = None,
) -> str:
    """A standalone HTML page holding one figure (embedded PNG), an optional table and an
    optional params table (rows whose ``differs`` is true highlighted)."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"{STYLE}</head><body><h1>{html.escape(title)}</h1>{table_html(table or [])}"
        f"{table_html(params or [])}"
        f"<img src='data:image/png;base64,{png(fig)}'></body></html>\n"
    )


def table_html(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    columns = [k for k in rows[0] if k != "differs"]
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in columns)
    body = "".join(
        f"<tr{' class=differs' if row.get('differs') else ''}>"
        + "".join(_cell(row[k]) for k in columns)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    text = _fmt(value)
    numeric = isinstance(value, int | float) or text.replace(",", "").replace(".", "").isdigit()
    return f"<td>{text}</td>" if numeric else f"<td class=text>{text}</td>"


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))
