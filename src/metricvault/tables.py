"""The output shapes every query API answers in: an Arrow table converted to what the caller
asked for (``output="pandas" | "arrow" | "polars"``). A leaf, so the store and the engines
above it share one rule."""

from __future__ import annotations

from typing import Any

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
