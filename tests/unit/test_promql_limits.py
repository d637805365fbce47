"""The engine's own limits: a deadline checked inside evaluation, a budget of points held at
once (raw samples, range windows, subquery results, step matrices) and of distinct series,
Prometheus's 11,000-point rule, and times that overflow refused as ``bad_data``."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from metricvault.promql import (
    MAX_POINTS_PER_SERIES,
    Engine,
    EngineOptions,
    MemorySource,
    PromQLError,
    SeriesSamples,
)
from metricvault.protocols import Horizons, SelectHints
from metricvault.selector import Matcher

S = 1000
MIN = 60 * S
DAY = 86_400 * S


def _source(
    names: Sequence[str] = ("a",), n: int = 3, every_ms: int = 15 * S, span_ms: int = 3600 * S
) -> MemorySource:
    """``n`` series per name with a sample every ``every_ms`` over ``span_ms`` from 0."""
    source = MemorySource()
    ts = np.arange(0, span_ms + 1, every_ms)
    for name in names:
        for i in range(n):
            source.add({"__name__": name, "i": str(i)}, ts.tolist(), (ts / 1000.0 + i).tolist())
    return source


@dataclass
class StepClock:
    """A clock at 0 that jumps far ahead after ``jump_after`` reads (``None``: never)."""

    jump_after: int | None = None
    reads: int = 0

    def __call__(self) -> float:
        self.reads += 1
        return 1e9 if self.jump_after is not None and self.reads > self.jump_after else 0.0


@dataclass
class CountingSource:
    inner: MemorySource
    selects: list[str] = field(default_factory=list)

    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        self.selects.append(str(matchers[0].value))
        return self.inner.select(matchers, start_ms, end_ms)

    def horizons(self) -> Horizons:
        return self.inner.horizons()


def _engine(source: object, clock: StepClock | None = None, **options: Any) -> Engine:
    return Engine(source, EngineOptions(**options), clock or StepClock())  # type: ignore[arg-type]


# ------------------------------------------------------------------------ 11,000 points
@pytest.mark.parametrize(
    ("end_ms", "step_ms", "accepted"),
    [
        (11_000 * S, S, True),  # 11,000 intervals, 11,001 points: Prometheus accepts it
        (11_000 * S + 999, S, True),  # Go's integer division of the duration by the step
        (11_001 * S, S, False),
        (22_000 * S, 2 * S, True),
        (22_002 * S, 2 * S, False),
    ],
)
def test_a_range_query_is_refused_only_past_11000_intervals(
    end_ms: int, step_ms: int, accepted: bool
) -> None:
    engine = _engine(_source())
    if accepted:
        result = engine.evaluate("vector(1)", 0, end_ms, step_ms)
        assert len(result.series[0][1]) == end_ms // step_ms + 1
        return
    with pytest.raises(PromQLError) as info:
        engine.evaluate("vector(1)", 0, end_ms, step_ms)
    assert info.value.kind == "bad_data"
    assert "exceeded maximum resolution of 11,000 points per timeseries" in info.value.message
    assert MAX_POINTS_PER_SERIES == 11_000


# ------------------------------------------------------------------------ the deadline
def _run(clock: StepClock) -> tuple[int, PromQLError | None]:
    """How many selects ``a + b + c + d`` made under ``clock``, and its error."""
    source = CountingSource(_source(("a", "b", "c", "d")))
    try:
        _engine(source, clock, timeout_s=10).evaluate("a + b + c + d", 3600 * S)
    except PromQLError as exc:
        return len(source.selects), exc
    return len(source.selects), None


def test_a_query_past_its_deadline_stops_between_selects() -> None:
    free = StepClock()
    assert _run(free) == (4, None)
    ran = []
    for jump in range(1, free.reads):  # read 1 sets the deadline; a later one passes it
        selects, error = _run(StepClock(jump_after=jump))
        assert error is not None
        assert (error.kind, error.message, error.status) == (
            "timeout",
            "query timed out in expression evaluation",
            503,
        )
        ran.append(selects)
    assert ran == sorted(ran)
    assert {1, 2, 3} <= set(ran)  # stopped with one, two and three of the four selects done


@pytest.mark.parametrize(
    "expr",
    [
        "rate(a[5m])",  # the per-series loop of a range function
        "quantile_over_time(0.5, a[10m])",  # the chunks of a function that gathers windows
        "max_over_time(a[30m:15s])",  # a subquery's inner steps and series
        "topk(1, a)",  # an aggregation's groups
        'count_values("v", a)',  # one pass per distinct value
    ],
)
def test_the_deadline_is_checked_inside_the_work_of_a_node(expr: str) -> None:
    source = _source(n=20)
    free = StepClock()
    _engine(source, free, timeout_s=10).evaluate(expr, 0, 3600 * S, 15 * S)
    # Every few reads in the run without a deadline: the clock jumps halfway through.
    halfway = free.reads // 2
    stopped = StepClock(jump_after=halfway)
    with pytest.raises(PromQLError) as info:
        _engine(source, stopped, timeout_s=10).evaluate(expr, 0, 3600 * S, 15 * S)
    assert info.value.kind == "timeout"
    assert stopped.reads == halfway + 1  # stopped at the first check past the deadline
    assert free.reads > 20  # checked per series or per chunk, not only per node


def test_no_timeout_means_no_deadline() -> None:
    clock = StepClock(jump_after=0)
    result = _engine(_source(), clock).evaluate("sum(rate(a[5m]))", 3600 * S)
    assert result.series


# ------------------------------------------------------------------------ the sample budget
def _refused(
    expr: str, source: object, start: int, end: int | None = None, step: int | None = None,
    **options: Any,
) -> PromQLError:  # fmt: skip
    with pytest.raises(PromQLError) as info:
        _engine(source, **options).evaluate(expr, start, end, step)
    return info.value


@pytest.mark.parametrize(
    ("expr", "end", "budget", "accepted"),
    [
        ("a[1h]", None, 3 * 241 + 3, True),  # three series of 241 samples, one window each
        ("a[1h]", None, 3 * 241 + 2, False),
        ("a", 3600 * S, 3 * 241 * 2, True),  # the samples, then the 3 x 241 step matrix
        ("a", 3600 * S, 3 * 241, False),
        ("max_over_time(a[1h:1s])", None, 3601 + 3 * 3601 * 2 + 3, True),  # grid, matrix, copy
        ("max_over_time(a[1h:1s])", None, 3 * 3601, False),  # the subquery's inner matrix
        ("sum(rate(a[5m]))", 3600 * S, 10_000, True),
    ],
)
def test_the_sample_budget_counts_what_a_query_holds(
    expr: str, end: int | None, budget: int, accepted: bool
) -> None:
    step = 15 * S if end is not None else None
    start = 0 if end is not None else 3600 * S
    if accepted:
        _engine(_source(), max_samples=budget).evaluate(expr, start, end, step)
        return
    error = _refused(expr, _source(), start, end, step, max_samples=budget)
    assert error.kind == "execution"
    assert error.message == (
        "query processing would load too many samples into memory in query execution"
    )
    assert error.status == 422


@pytest.mark.parametrize(
    "expr",
    [
        # ~83 M points at 32 series (30 d at 1 s): refused before the inner matrix is built
        "max_over_time(rate(a[5m])[30d:1s])",
        "quantile_over_time(0.9, a[20d:1s])",
        "max_over_time(max_over_time(a[5m:1s])[30d:1s])",
    ],
)
def test_a_subquery_too_large_for_the_budget_is_refused_before_it_is_built(expr: str) -> None:
    source = _source(n=32, every_ms=5 * MIN, span_ms=30 * DAY)
    tracemalloc.start()
    try:
        error = _refused(expr, source, 30 * DAY, max_samples=50_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error.kind == "execution"
    assert peak < 100_000_000  # 83 M float64 points would be 660 MB


@pytest.mark.parametrize(
    ("expr", "budget"),
    [
        ("a @ 3600", 10_000),  # one step's answer copied to every step
        ('count_values("v", a)', 20_000),  # a row per distinct value: series x steps rows
    ],
)
def test_what_a_node_would_allocate_counts_before_it_is_allocated(expr: str, budget: int) -> None:
    error = _refused(expr, _source(n=3), 0, 3600 * S, S, max_samples=budget)
    assert error.kind == "execution"


def test_a_refused_query_keeps_no_memory() -> None:
    source = _source(n=32, every_ms=5 * MIN, span_ms=DAY)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(3):  # the subquery's matrix is built, then its copy is refused
            _refused("max_over_time(a[1d:1s])", source, DAY, max_samples=4_000_000)
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak > 10_000_000  # it did build something before the budget stopped it
    assert after - before < 1_000_000


# ------------------------------------------------------------------------ the series limit
@pytest.mark.parametrize(
    ("expr", "limit", "accepted"),
    [
        ("a + a", 3, True),  # distinct series: the same three selected twice
        ("a + a", 2, False),
        ("a or b", 5, False),
        ("a or b", 6, True),
        ("sum(rate(a[5m])) + sum(rate(b[5m]))", 5, False),
    ],
)
def test_max_series_counts_distinct_selected_series(expr: str, limit: int, accepted: bool) -> None:
    engine = _engine(_source(("a", "b")), max_series=limit)
    if accepted:
        engine.evaluate(expr, 3600 * S)
        return
    with pytest.raises(PromQLError) as info:
        engine.evaluate(expr, 3600 * S)
    assert info.value.kind == "execution"
    assert info.value.message.startswith(
        f"the query exceeded the maximum number of series (limit: {limit} series)"
    )


# ------------------------------------------------------------------------ overflowing times
@pytest.mark.parametrize(
    ("expr", "start", "message"),
    [
        ("a @ 1e300", 0, "parse error: timestamp out of bounds for @ modifier: 1000000000000"),
        ("a @ -1e17", 0, "parse error: timestamp out of bounds for @ modifier: -10000000000"),
        ("a @ 1e19", 0, "parse error: timestamp out of bounds for @ modifier: 1000000000000"),
        ("a offset 300y", 0, "parse error: duration out of range"),
        ("a offset -300y", 0, "parse error: duration out of range"),
        ("a offset -290000000y", 0, "parse error: duration out of range"),
        ("rate(a[300y])", 0, "parse error: duration out of range"),
        ("max_over_time(a[5m:300y])", 0, "parse error: duration out of range"),
        ("a @ 9.22337e15 offset -200y", 0, "is too near the ends of int64 milliseconds"),
        ("a", 10**20, "does not fit a timestamp"),
        ("a", -(10**20), "does not fit a timestamp"),
    ],
)
def test_times_past_int64_are_bad_data(expr: str, start: int, message: str) -> None:
    for end, step in ((None, None), (start + 60 * S, 15 * S)):
        error = _refused(expr, _source(), start, end, step)
        assert error.kind == "bad_data", error.message
        assert message in error.message


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("a @ -100", -100.0),  # before 1970
        ("a @ 1m", 60.0),  # a duration as the time
        ("a @ 0x10", 16.0),
        ("a @ 1e12", None),  # year 33658: nothing there, as in Prometheus
        ("last_over_time((a @ 1800)[5m:1m] @ -1e12)", 1800.0),  # the inner @ wins
        ('label_replace(a @ 60, "x", "@ 5", "i", ".*")', 60.0),  # an @ inside a string
    ],
)
def test_at_times_before_1970_and_past_9999_evaluate(expr: str, value: float | None) -> None:
    source = MemorySource()
    source.add({"__name__": "a"}, [-100 * S, 16 * S, 60 * S, 1800 * S], [-100, 16, 60, 1800])
    result = _engine(source).evaluate(expr, 3600 * S)
    got = [float(vs[0]) for _, _, vs in result.series]
    assert got == ([] if value is None else [value])
