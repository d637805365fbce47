"""PromQL answers in the vault's long shape: ``vault.promql(...)`` and ``metricvault promql``.

One row per series and evaluation time: ``timestamp`` (UTC), ``metric`` (the result's
``__name__``, null where PromQL dropped it, e.g. after ``rate`` or ``sum``), one column per
label, ``value``. Without ``end`` it is an instant query at ``start``; with ``end`` and ``step``
a range query at ``start, start + step, ... <= end``, exactly as Prometheus aligns it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from metricvault.durations import TimeLike, now_ms, parse_duration_ms, parse_time_ms
from metricvault.errors import ApproximateAnswer, PromQLError
from metricvault.promql.eval import Engine, EngineOptions
from metricvault.promql.values import QueryResult
from metricvault.protocols import SampleSource

if TYPE_CHECKING:
    from metricvault.config import Settings


def promql_frame(
    store: SampleSource,
    expr: str,
    start: TimeLike = "now",
    end: TimeLike | None = None,
    step: str | int | None = None,
    output: str = "pandas",
    options: EngineOptions | None = None,
    settings: Settings | None = None,
) -> Any:
    """Evaluate ``expr`` over ``store`` (any store with the read seam) as a frame.
    Without ``options``, the limits of ``settings`` (the vault's: ``query_max_samples``,
    ``query_max_series``, ``query_timeout``, ``lookback_delta``) hold, as they do on ``serve``."""
    from metricvault.tables import convert

    now = now_ms()
    at = parse_time_ms(start, now=now)
    if options is None and settings is not None:
        options = EngineOptions.from_settings(settings)
    engine = Engine(store, options)
    if end is None:
        result = engine.evaluate(expr, at)
    else:
        if step is None:
            raise PromQLError("a range query needs a step, e.g. step='1m'", kind="bad_data")
        result = engine.evaluate(expr, at, parse_time_ms(end, now=now), parse_duration_ms(step))
    for note in result.warnings:  # what the HTTP API puts in "warnings"
        warnings.warn(note, ApproximateAnswer, stacklevel=3)
    return convert(long_table(result), output)


def long_table(result: QueryResult) -> pa.Table:
    """The result in the vault's long shape (:func:`metricvault.tables.long_table`): the
    series in the engine's order, ``metric`` from ``__name__``."""
    from metricvault.tables import long_table as build

    if result.result_type == "string":
        raise PromQLError("a string result has no samples to tabulate", kind="bad_data")
    ts_parts, value_parts, index = [], [], []
    for i, (_, ts, values) in enumerate(result.series):
        ts_parts.append(np.asarray(ts, dtype=np.int64))
        value_parts.append(np.asarray(values, dtype=np.float64))
        index.append(np.full(len(ts), i, dtype=np.int64))
    rows = np.concatenate(index) if index else np.zeros(0, dtype=np.int64)
    timestamps = np.concatenate(ts_parts) if ts_parts else np.zeros(0, np.int64)
    metrics = [labels.get("__name__") for labels, _, _ in result.series]
    labels = [{k: v for k, v in one.items() if k != "__name__"} for one, _, _ in result.series]
    value = pa.array(np.concatenate(value_parts) if value_parts else np.zeros(0), pa.float64())
    return build(timestamps, rows, metrics, labels, {"value": value})
