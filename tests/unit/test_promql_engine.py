"""The PromQL engine over an in-memory source: semantics checked against values worked out by
hand from Prometheus 2.x's rules (the e2e oracle compares against a real Prometheus)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from metricvault.promql import STALE_NAN, Engine, EngineOptions, MemorySource, PromQLError

S = 1000
M = 60 * S


def engine(*series: tuple[dict[str, str], list[int], list[float]], **options: Any) -> Engine:
    source = MemorySource()
    for labels, ts, values in series:
        source.add(labels, ts, values)
    return Engine(source, EngineOptions(**options))


def counter(name: str = "c_total", **labels: str) -> tuple[dict[str, str], list[int], list[float]]:
    """0, 10, 20, ... every 15 s from t=0 to 10 min."""
    ts = list(range(0, 10 * M + 1, 15 * S))
    return {"__name__": name, **labels}, ts, [10.0 * i for i in range(len(ts))]


def instant(e: Engine, expr: str, t: int) -> dict[tuple[tuple[str, str], ...], float]:
    result = e.evaluate(expr, t)
    assert result.result_type == "vector", result.result_type
    return {tuple(sorted(lab.items())): float(vs[0]) for lab, _, vs in result.series}


def one(e: Engine, expr: str, t: int) -> float:
    values = list(instant(e, expr, t).values())
    assert len(values) == 1, values
    return values[0]


GAUGE = ({"__name__": "g", "i": "a"}, [0, 60 * S, 120 * S], [1.0, 2.0, 3.0])


# ------------------------------------------------------------------------------ selectors
@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0, 1.0),
        (59_999, 1.0),
        (60_000, 2.0),
        (120_000 + 5 * M, 3.0),  # exactly lookback old: Prometheus 2.x still takes it
        (120_001 + 5 * M, None),
    ],
)
def test_instant_selector_takes_the_latest_sample_within_lookback(
    t: int, expected: float | None
) -> None:
    got = instant(engine(GAUGE), "g", t)
    assert got == ({} if expected is None else {(("__name__", "g"), ("i", "a")): expected})


def test_lookback_delta_is_configurable() -> None:
    e = engine(GAUGE, lookback_delta_ms=30 * S)
    assert instant(e, "g", 120 * S + 30 * S) != {}
    assert instant(e, "g", 120 * S + 31 * S) == {}


@pytest.mark.parametrize(
    ("expr", "t", "expected"),
    [
        ("g offset 1m", 120 * S, 2.0),
        ("g offset -1m", 0, 2.0),
        ("g @ 60", 0, 2.0),
        ("g @ 60 offset 1m", 500 * S, 1.0),
        ("g @ start()", 120 * S, 3.0),
        ("count_over_time(g[1m])", 120 * S, 2.0),  # [t-1m, t] is closed in Prometheus 2.x
        ("count_over_time(g[1m] offset 1m)", 120 * S, 2.0),
        ("last_over_time(g[10m])", 200 * S, 3.0),
    ],
)
def test_offset_at_and_window_bounds(expr: str, t: int, expected: float) -> None:
    assert one(engine(GAUGE), expr, t) == expected


def test_left_open_windows_follow_prometheus_3() -> None:
    e = engine(GAUGE, left_open_windows=True)
    assert one(e, "count_over_time(g[1m])", 120 * S) == 1.0


def test_range_query_steps_start_at_start_and_stop_at_or_before_end() -> None:
    result = engine(GAUGE).evaluate("g", 0, 100 * S, 30 * S)
    assert result.result_type == "matrix"
    ((_, ts, values),) = result.series
    assert ts.tolist() == [0, 30 * S, 60 * S, 90 * S]
    assert values.tolist() == [1.0, 1.0, 2.0, 2.0]


def test_at_end_and_start_refer_to_the_range_query_bounds() -> None:
    result = engine(GAUGE).evaluate("g @ end()", 0, 120 * S, 60 * S)
    assert result.series[0][2].tolist() == [3.0, 3.0, 3.0]
    result = engine(GAUGE).evaluate("g @ start()", 60 * S, 120 * S, 60 * S)
    assert result.series[0][2].tolist() == [2.0, 2.0]


def test_stale_marker_ends_the_series_and_nan_is_a_value() -> None:
    e = engine(
        ({"__name__": "s"}, [0, 15 * S, 30 * S], [1.0, STALE_NAN, 3.0]),
        ({"__name__": "n"}, [0, 15 * S], [1.0, math.nan]),
    )
    assert instant(e, "s", 20 * S) == {}  # the marker is the latest sample: nothing
    assert one(e, "s", 30 * S) == 3.0
    assert one(e, "count_over_time(s[1m])", 30 * S) == 2.0  # windows skip markers
    assert math.isnan(one(e, "n", 20 * S))
    assert one(e, "count_over_time(n[1m])", 20 * S) == 2.0


# ------------------------------------------------------------------------------ rates
@pytest.mark.parametrize(
    ("expr", "t", "expected"),
    [
        ("rate(c_total[1m])", 5 * M, 10.0 / 15),
        ("increase(c_total[1m])", 5 * M, 40.0),  # 4 intervals in the closed window, no edge gap
        ("irate(c_total[1m])", 5 * M, 10.0 / 15),
        ("idelta(c_total[1m])", 5 * M, 10.0),
        ("delta(c_total[1m])", 5 * M, 40.0),
        ("resets(c_total[5m])", 5 * M, 0.0),
        ("changes(c_total[1m])", 5 * M, 4.0),
        ("deriv(c_total[2m])", 5 * M, 10.0 / 15),
        ("predict_linear(c_total[2m], 60)", 5 * M, 200.0 + 40.0),
    ],
)
def test_counter_functions(expr: str, t: int, expected: float) -> None:
    assert one(engine(counter()), expr, t) == pytest.approx(expected, rel=1e-12)


def test_rate_extrapolates_to_the_window_edges_and_corrects_resets() -> None:
    # Samples at 10 s, 20 s, 30 s, 40 s; the counter resets to 5 at 30 s.
    e = engine(({"__name__": "r_total"}, [10 * S, 20 * S, 30 * S, 40 * S], [10, 20, 5, 15]))
    # Over the samples: (15 - 10) + 20 (the value before the reset) = 25 in 30 s. Window
    # [0, 60 s]: 10 s to the start (< 1.1 x the 10 s average, and the zero point is 12 s
    # away, so extrapolate 10 s); 20 s to the end (> 11 s: only half an interval, 5 s).
    expected = 25 * (30 + 10 + 5) / 30
    assert one(e, "increase(r_total[1m])", 60 * S) == pytest.approx(expected)
    assert one(e, "resets(r_total[1m])", 60 * S) == 1.0


def test_rate_after_an_inf_sample_is_finite_again() -> None:
    values = [1.0, 2.0, math.inf, 1.0, 2.0, 3.0, 4.0, 5.0]
    e = engine(({"__name__": "x_total"}, [i * 15 * S for i in range(8)], values))
    # A range query, so the samples read include the +Inf before the last window.
    result = e.evaluate("rate(x_total[1m])", 30 * S, 105 * S, 75 * S)
    assert result.series[0][2][-1] == pytest.approx(4.0 / 60)


def test_holt_winters_matches_the_recurrence() -> None:
    ts = [0, 15 * S, 30 * S, 45 * S]
    values = [1.0, 3.0, 2.0, 5.0]
    s1, b = values[0], values[1] - values[0]
    s0 = 0.0
    for i in range(1, 4):
        if i > 1:
            b = 0.5 * (s1 - s0) + 0.5 * b
        s0, s1 = s1, 0.3 * values[i] + 0.7 * (s1 + b)
    e = engine(({"__name__": "h"}, ts, values))
    assert one(e, "holt_winters(h[1m], 0.3, 0.5)", 45 * S) == pytest.approx(s1)


# ------------------------------------------------------------------------------ aggregations
GROUP = [
    ({"__name__": "m", "job": "a", "i": "1"}, [0], [1.0]),
    ({"__name__": "m", "job": "a", "i": "2"}, [0], [4.0]),
    ({"__name__": "m", "job": "b", "i": "1"}, [0], [10.0]),
]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("sum(m)", {(): 15.0}),
        ("sum by (job) (m)", {(("job", "a"),): 5.0, (("job", "b"),): 10.0}),
        ("max without (i) (m)", {(("job", "a"),): 4.0, (("job", "b"),): 10.0}),
        ("avg(m)", {(): 5.0}),
        ("count by (i) (m)", {(("i", "1"),): 2.0, (("i", "2"),): 1.0}),
        ("stdvar by (job) (m)", {(("job", "a"),): 2.25, (("job", "b"),): 0.0}),
        ("quantile(0.5, m)", {(): 4.0}),
        ("group by (job) (m)", {(("job", "a"),): 1.0, (("job", "b"),): 1.0}),
        ("topk(1, m)", {(("__name__", "m"), ("i", "1"), ("job", "b")): 10.0}),
        ("bottomk by (job) (1, m)", {
            (("__name__", "m"), ("i", "1"), ("job", "a")): 1.0,
            (("__name__", "m"), ("i", "1"), ("job", "b")): 10.0,
        }),
        ('count_values("v", m)', {(("v", "1"),): 1.0, (("v", "4"),): 1.0, (("v", "10"),): 1.0}),
    ],
)  # fmt: skip
def test_aggregations(expr: str, expected: dict[Any, float]) -> None:
    assert instant(engine(*GROUP), expr, 0) == expected


# ------------------------------------------------------------------------------ binary ops
SIDES = [
    ({"__name__": "l", "i": "1", "x": "a"}, [0], [6.0]),
    ({"__name__": "l", "i": "2", "x": "b"}, [0], [8.0]),
    ({"__name__": "r", "i": "1", "v": "9"}, [0], [2.0]),
    ({"__name__": "r", "i": "2", "v": "7"}, [0], [4.0]),
]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("l / on(i) r", {(("i", "1"),): 3.0, (("i", "2"),): 2.0}),
        ("l - ignoring(x, v) r", {(("i", "1"),): 4.0, (("i", "2"),): 4.0}),
        ("l - ignoring(x) group_left r", {}),
        ("l * on(i) group_left(v) r", {
            (("i", "1"), ("v", "9"), ("x", "a")): 12.0,
            (("i", "2"), ("v", "7"), ("x", "b")): 32.0,
        }),
        ("l > on(i) r", {(("i", "1"),): 6.0, (("i", "2"),): 8.0}),  # on() keeps only i
        ("l > bool 7", {(("i", "1"), ("x", "a")): 0.0, (("i", "2"), ("x", "b")): 1.0}),
        ("l and on(i) r < 3", {(("__name__", "l"), ("i", "1"), ("x", "a")): 6.0}),
        ("l unless on(i) r < 3", {(("__name__", "l"), ("i", "2"), ("x", "b")): 8.0}),
        ("2 * l", {(("i", "1"), ("x", "a")): 12.0, (("i", "2"), ("x", "b")): 16.0}),
        ("7 < l", {(("__name__", "l"), ("i", "2"), ("x", "b")): 8.0}),
    ],
)  # fmt: skip
def test_vector_matching(expr: str, expected: dict[Any, float]) -> None:
    assert instant(engine(*SIDES), expr, 0) == expected


def test_atan2_keeps_the_metric_name() -> None:
    got = instant(engine(*SIDES), "l atan2 1", 0)
    assert (("__name__", "l"), ("i", "1"), ("x", "a")) in got


def test_scalar_results() -> None:
    result = engine().evaluate("1 + 2 * 3", 5 * S)
    assert result.result_type == "scalar"
    assert result.to_prometheus() == {"resultType": "scalar", "result": [5.0, "7"]}
    assert engine().evaluate('"hi"', 0).to_prometheus()["result"] == [0.0, "hi"]


# ------------------------------------------------------------------------------ functions
BUCKETS = [
    ({"__name__": "h_bucket", "le": le}, [0], [count])
    for le, count in [("0.1", 10.0), ("0.5", 30.0), ("1", 40.0), ("+Inf", 40.0)]
]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("histogram_quantile(0.5, h_bucket)", 0.1 + 0.4 * (20 - 10) / 20),
        ("histogram_quantile(0.9, h_bucket)", 0.5 + 0.5 * (36 - 30) / 10),
        ("histogram_quantile(1, h_bucket)", 1.0),
        ("histogram_quantile(2, h_bucket)", math.inf),
    ],
)
def test_histogram_quantile(expr: str, expected: float) -> None:
    assert one(engine(*BUCKETS), expr, 0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            'label_replace(l, "y", "$1-${1}", "x", "(.)")',
            {"__name__": "l", "i": "1", "x": "a", "y": "a-a"},
        ),
        ('label_replace(l, "x", "", "x", ".*")', {"__name__": "l", "i": "1"}),
        ('label_replace(l, "y", "z", "x", "nomatch")', {"__name__": "l", "i": "1", "x": "a"}),
        ('label_join(l, "y", ":", "i", "x")', {"__name__": "l", "i": "1", "x": "a", "y": "1:a"}),
    ],
)  # fmt: skip
def test_label_functions(expr: str, expected: dict[str, str]) -> None:
    labels = [dict(k) for k in instant(engine(SIDES[0]), expr, 0)]
    assert labels == [expected]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('absent(nope{job="a", i=~"x"})', {(("job", "a"),): 1.0}),
        ("absent(l)", {}),
        ("clamp(l, 1, 2)", {(("i", "1"), ("x", "a")): 2.0}),
        ("clamp(l, 2, 1)", {}),
        ("round(l / 4, 0.5)", {(("i", "1"), ("x", "a")): 1.5}),
        ("vector(3)", {(): 3.0}),
        ("timestamp(l)", {(("i", "1"), ("x", "a")): 0.0}),
        ("year(vector(1700000000))", {(): 2023.0}),
        ("month(vector(1700000000))", {(): 11.0}),
        ("day_of_month(vector(1700000000))", {(): 14.0}),
        ("day_of_week(vector(1700000000))", {(): 2.0}),
        ("days_in_month(vector(1709251200 - 86400))", {(): 29.0}),
        ("hour(vector(1700000000))", {(): 22.0}),
        ("minute(vector(1700000000))", {(): 13.0}),
    ],
)
def test_instant_functions(expr: str, expected: dict[Any, float]) -> None:
    assert instant(engine(SIDES[0]), expr, 0) == expected


def test_sort_orders_an_instant_vector() -> None:
    result = engine(*GROUP).evaluate("sort_desc(m)", 0)
    assert [float(vs[0]) for _, _, vs in result.series] == [10.0, 4.0, 1.0]
    result = engine(*GROUP).evaluate("sort(m)", 0)
    assert [float(vs[0]) for _, _, vs in result.series] == [1.0, 4.0, 10.0]


def test_subquery_steps_are_aligned_to_multiples_of_the_step() -> None:
    result = engine(counter()).evaluate("c_total[1m:20s]", 70 * S)
    assert result.result_type == "matrix"
    assert result.series[0][1].tolist() == [20 * S, 40 * S, 60 * S]


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("expr", "message", "kind"),
    [
        ("sum(", "parse error", "bad_data"),
        ('x{a=~"("}', "illegal regex", "bad_data"),
        ("rate(l)", "expected type matrix", "bad_data"),
        ("l + on(x) r", "many-to-many", "execution"),  # r has no x: both r rows match {}
        (
            "l + ignoring(i, x, v) r",
            "found duplicate series for the match group {} on the right hand-side of the "
            'operation: [{__name__="r", i="2", v="7"}, {__name__="r", i="1", v="9"}];'
            "many-to-many matching not allowed: matching labels must be unique on one side",
            "execution",
        ),
        (
            "sum by (i) (l) + on() group_left sum by (i) (r)",
            "many-to-many matching not allowed",
            "execution",
        ),
        ("r - on() group_right l", "many-to-many matching not allowed", "execution"),
        (
            '{__name__=~"l|r", i="1"} * 0 + ignoring(x, v) l',
            "multiple matches for labels: many-to-one matching must be explicit",
            "execution",
        ),
        (
            'label_replace(label_replace(l, "x", "", "x", ".*"), "i", "", "i", ".*")',
            "vector cannot contain metrics with the same labelset",
            "execution",
        ),
        (
            'label_replace(l, "y", "$1", "x", "(")',
            "invalid regular expression in label_replace(): (",
            "execution",
        ),
        ('count_values("1x", l)', 'invalid label name "1x"', "execution"),
        ("holt_winters(l[1m], 1, 0.5)", "invalid smoothing factor", "execution"),
    ],
)
def test_errors_are_worded_as_prometheus_words_them(expr: str, message: str, kind: str) -> None:
    with pytest.raises(PromQLError) as info:
        engine(*SIDES).evaluate(expr, 0)
    assert message in info.value.message
    assert info.value.kind == kind
    assert info.value.status == (400 if kind == "bad_data" else 422)


@pytest.mark.parametrize(
    ("expr", "start", "end", "step", "message"),
    [
        ("l[1m]", 0, 60 * S, 15 * S, 'invalid expression type "range vector" for range query'),
        ('"s"', 0, 60 * S, 15 * S, 'invalid expression type "string" for range query'),
        ("l", 0, 60 * S, 0, "zero or negative query resolution step widths are not accepted"),
        ("l", 60 * S, 0, 15 * S, "end timestamp must not be before start time"),
        ("l", 0, 11_001 * S, S, "exceeded maximum resolution of 11,000 points per timeseries"),
    ],
)
def test_range_query_errors(expr: str, start: int, end: int, step: int, message: str) -> None:
    with pytest.raises(PromQLError) as info:
        engine(*SIDES).evaluate(expr, start, end, step)
    assert message in info.value.message
    assert info.value.kind == "bad_data"


def test_memory_source_selects_a_closed_range_with_regex_matchers() -> None:
    source = MemorySource()
    source.add({"__name__": "a", "k": "xy"}, [0, 10, 20, 30], [0, 1, 2, 3])
    source.add({"__name__": "a", "k": "z"}, [0], [0])
    from metricvault.selector import Matcher

    got = source.select([Matcher("__name__", "=", "a"), Matcher("k", "=~", "x.")], 10, 20)
    assert len(got) == 1
    assert got[0].ts.tolist() == [10, 20]
    assert np.array_equal(got[0].values, [1.0, 2.0])


def test_the_example_in_docs_promql_md_runs() -> None:
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "promql.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    assert blocks, "docs/promql.md lost its example"
    for block in blocks:
        exec(compile(block, str(page), "exec"), {})  # its asserts check the answers


def test_stddev_of_one_sample_is_zero_even_when_it_is_nan() -> None:
    e = engine(({"__name__": "n", "i": "a"}, [0], [math.nan]))
    assert one(e, "stddev(n)", 0) == 0.0
    assert one(e, "stdvar by (i) (n)", 0) == 0.0


def test_variance_of_a_constant_window_is_exactly_zero() -> None:
    # 0.1 x 3 / 3 is not exactly 0.1 in binary floating point.
    e = engine(({"__name__": "k"}, [0, 15 * S, 30 * S], [0.1, 0.1, 0.1]))
    assert one(e, "stdvar_over_time(k[1m])", 30 * S) == 0.0
    e = engine(*[({"__name__": "k", "i": str(i)}, [0], [0.1]) for i in range(3)])
    assert one(e, "stdvar(k)", 0) == 0.0


def test_date_functions_of_nan_and_inf_give_what_go_gives() -> None:
    # Go's int64(NaN) is -2^63: time.Unix of that is 292277026596-12-04 15:30 UTC, a Sunday.
    e = engine()
    assert one(e, "year(vector(0/0))", 0) == 292277026596.0
    assert one(e, "day_of_week(vector(1/0))", 0) == 0.0
    assert one(e, "hour(vector(-1/0))", 0) == 15.0
    assert one(e, "minute(vector(-1))", 0) == 59.0  # int64(-1.0) is -1: 1969-12-31 23:59:59


def test_deep_and_out_of_range_queries_are_refused_by_the_engine_itself() -> None:
    """Not only the HTTP API: vault.promql and the CLI evaluate through Engine too. A very deep
    query would crash promql-parser (Rust stack overflow) or exhaust Python's recursion."""
    from metricvault.promql import Engine, MemorySource, PromQLError
    from metricvault.promql.parse import MAX_QUERY_DEPTH

    engine = Engine(MemorySource())
    for expr in (
        "1" + " + 1" * 20_000,
        "(" * (MAX_QUERY_DEPTH + 1) + "1" + ")" * (MAX_QUERY_DEPTH + 1),
    ):
        with pytest.raises(PromQLError, match="nests") as info:
            engine.evaluate(expr, 0)
        assert info.value.kind == "bad_data"
    with pytest.raises(PromQLError, match="duration out of range"):
        engine.evaluate("rate(x[300000000y])", 0)
