"""What the UI's page and data modules share: where the static files are, HTML escaping,
JSON-safe numbers, the min/max-per-pixel downsampling of chart lines and the start-up heap's
freeze."""

from __future__ import annotations

import gc
import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from metricvault.errors import InputError

STATIC_DIR = Path(__file__).parent / "static"


def freeze_startup_heap() -> None:
    """Collect, then move every object alive now (the modules, the registry's records, the
    series index the warm-up read) to the collector's permanent generation (``gc.freeze``),
    for a server process about to listen: otherwise the first requests' allocations set off
    a full collection that walks them all (a fresh ``metricvault ui``'s first page answered
    in 75-233 ms instead of 17-49 ms at load 5). Refcounting still frees them; only cycles
    among them are never collected."""
    gc.collect()
    gc.freeze()


def esc(value: Any) -> str:
    """Text from data as HTML text or attribute value (quotes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def finite(value: Any) -> Any:
    """JSON has no NaN: a missing figure is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.floating):
        return finite(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return value


def downsample(x: np.ndarray, y: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``2 * width`` points: per pixel column of the x range, the points holding the
    column's minimum and maximum (in x order), so a one-sample spike still shows. NaN values
    are left out of the extremes; ``x`` must be ascending."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if width < 1:
        raise InputError(f"width must be a positive number of pixels, got {width}")
    if x.size <= 2 * width:
        return x, y
    span = x[-1] - x[0]
    column = np.minimum(((x - x[0]) / span * width).astype(np.int64), width - 1)
    # per column (columns ascend with x) the first point holding its minimum and the first
    # holding its maximum, without a Python loop over the columns
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    group = np.cumsum(np.r_[False, column[1:] != column[:-1]])
    lo_value = np.minimum.reduceat(y, starts)[group]
    hi_value = np.maximum.reduceat(y, starts)[group]
    idx = np.union1d(_firsts(y == lo_value, group), _firsts(y == hi_value, group))
    return x[idx], y[idx]


def _firsts(mask: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The first index where ``mask`` holds, in each run of equal (ascending) ``group``."""
    hits = np.flatnonzero(mask)
    keep = np.r_[True, group[hits][1:] != group[hits][:-1]]
    return hits[keep]
