"""What the UI's page and data modules share: where the static files are, HTML escaping,
JSON-safe numbers and the min/max-per-pixel downsampling of chart lines."""

from __future__ import annotations

import html
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np

from metricvault.errors import InputError

STATIC_DIR = Path(__file__).parent / "static"


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
    # the first index of each column, then argmin/argmax within each run of equal columns
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    chosen: list[int] = []
    bounds = [*starts.tolist(), x.size]
    for a, b in itertools.pairwise(bounds):
        lo, hi = a + int(np.argmin(y[a:b])), a + int(np.argmax(y[a:b]))
        chosen.extend(sorted({lo, hi}))
    idx = np.asarray(chosen, dtype=np.int64)
    return x[idx], y[idx]
