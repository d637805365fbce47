"""The output shapes every query API answers in: the long shape (:func:`long_table`) and an
Arrow table converted to what the caller asked for (``output="pandas" | "arrow" | "polars"``).
A leaf, so the store and the engines above it share one rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault.errors import InputError, MissingDependencyError

OUTPUTS = ("pandas", "arrow", "polars")


def convert(table: pa.Table, output: str) -> Any:
    if output == "arrow":
        return table
    if output == "polars":
        try:
            import polars as pl
        except ImportError as exc:
            raise MissingDependencyError(
                "output='polars' needs the polars package, which is not installed: "
                "pip install 'metricvault[polars]' (or use output='pandas' / 'arrow')"
            ) from exc
        return pl.from_arrow(table)
    if output == "pandas":
        return table.to_pandas()
    raise InputError(f"unknown output {output!r}; choose from {', '.join(OUTPUTS)}")


def long_table(
    ts: np.ndarray,
    series_of_row: np.ndarray,
    metrics: Sequence[str | None],
    labels: Sequence[Mapping[str, str]],
    values: Mapping[str, pa.Array],
) -> pa.Table:
    """The long shape, one row per sample: ``timestamp`` (UTC, from int64 ms), ``metric``, one
    column per label name (sorted; null where a series lacks the label), then ``values``.

    ``series_of_row[i]`` is the position in ``metrics``/``labels`` of row ``i``'s series, so
    a series' name and labels are built once and taken per row. ``vault.query`` (raw samples
    and aggregates) and ``vault.promql`` both answer in it, so their columns cannot drift."""
    rows = pa.array(np.asarray(series_of_row, dtype=np.int64), pa.int64())
    columns: dict[str, pa.Array] = {
        "timestamp": pa.array(np.asarray(ts, dtype=np.int64), pa.timestamp("ms", tz="UTC")),
        "metric": pa.array(list(metrics), pa.string()).take(rows),
    }
    for name in sorted({k for one in labels for k in one}):
        columns[name] = pa.array([one.get(name) for one in labels], pa.string()).take(rows)
    columns.update(values)
    return pa.table(columns)
