"""The query_range answer's JSON, written straight from the QueryResult
(``server/prometheus_json.py``): byte for byte what ``JSONResponse(to_prometheus())`` writes,
for every kind of value (shortest digits, no exponent, NaN/±Inf, -0) and label text."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from metricvault.promql import Engine, MemorySource
from metricvault.promql.source import STALE_NAN
from metricvault.promql.values import QueryResult, format_value
from metricvault.server.prometheus_json import answer_body
from tests.e2e.test_promql_oracle import dataset

T0 = 1_767_225_600_000
EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 1e15, 1e16, 1.5e16, 123456789012345680.0, 1e22, 1e-4,
         1e-5, 1.2345e-7, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -3.25e-300,
         math.nan, math.inf, -math.inf, STALE_NAN, 99.99999999999999, 2.0**53,
         2.0**53 + 2]  # fmt: skip


def _fmt(value: float) -> str:
    """The reference: Go's FormatFloat(v, 'f', -1, 64) through numpy alone."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(np.format_float_positional(value, unique=True, trim="-"))


@pytest.mark.parametrize("value", EDGES)
def test_values_are_written_as_prometheus_writes_them(value: float) -> None:
    assert format_value(value) == _fmt(value)


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, 2**64 - 1))
def test_any_double_is_written_the_same(bits: int) -> None:
    value = struct.unpack("<d", struct.pack("<Q", bits))[0]
    assert format_value(value) == _fmt(value)


def reference(result: QueryResult, warnings: list[str]) -> bytes:
    body: dict[str, object] = {"status": "success", "data": result.to_prometheus()}
    if warnings:
        body["warnings"] = warnings
    return bytes(JSONResponse(body).body)


def memory() -> MemorySource:
    source = MemorySource()
    for metric, labels, ts, values in dataset(T0):
        source.add({"__name__": metric, **labels}, ts, values)
    ts = T0 + np.arange(100) * 15_000
    source.add({"__name__": "signed_zero", "zone": "süd ✓", "q": 'a"b\\c'}, ts, -0.0 * ts)
    return source


@pytest.mark.parametrize(
    "expr",
    [
        "nan_gauge",
        "stale_gauge",
        "signed_zero",
        "rate(http_requests_total[1m]) * 1e-9",
        "node_temp_celsius * 1e18",
        "histogram_quantile(0.9, sum by (le) (rate(request_duration_seconds_bucket[2m])))",
        "gpu_util_ratio / 3",
        "sum(gpu_util_ratio)",  # one series
        "absent(nope)",
        "nope",  # an empty matrix
    ],
)
@pytest.mark.parametrize("warnings", [[], ["answered from rollups: ≤ 1 % off"]])
def test_range_answers_are_the_bytes_json_response_writes(expr: str, warnings: list[str]) -> None:
    result = Engine(memory()).evaluate(expr, T0 + 60_000, T0 + 30 * 60_000, 15_000)
    assert result.result_type == "matrix"
    assert answer_body(result, warnings) == reference(result, warnings)


@pytest.mark.parametrize("expr", ["nan_gauge", "1.5", '"text"', "sum(gpu_util_ratio)"])
def test_other_result_types_too(expr: str) -> None:
    result = Engine(memory()).evaluate(expr, T0 + 600_000)
    assert answer_body(result, []) == reference(result, [])
