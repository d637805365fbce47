"""What one query may cost, checked inside evaluation wherever the engine runs (``serve``,
``vault.promql``, the CLI, rules): a deadline, a budget of points held at once, a number of
distinct series, and Prometheus's 11,000-point rule for range queries.

Points are counted as Prometheus's evaluator counts ``currentSamples`` (promql/engine.go): what
a node materialises is added while it computes (raw samples, rollup rows, range windows,
subquery results, dense step matrices *before* they are allocated), and once a node is done
its inputs are released and only its output stays counted. A query whose peak would pass
``max_samples`` is refused before the allocation that would pass it, so a subquery such as
``max_over_time(rate(x[5m])[30d:1s])`` is refused without building its inner matrix. The
engine's matrices are dense (series x steps), so a cell counts whether or not it holds a point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from metricvault.errors import PromQLError, ResolutionError

# Prometheus's API refuses (end - start) / step > 11000 (web/api/v1/api.go; Go Durations, so
# the integer division of nanoseconds): 11,000 intervals, 11,001 points, is still accepted.
MAX_POINTS_PER_SERIES = 11_000
TIMEOUT_MESSAGE = "query timed out in expression evaluation"
TOO_MANY_SAMPLES_MESSAGE = (
    "query processing would load too many samples into memory in query execution"
)

Clock = Callable[[], float]


def timed_out() -> PromQLError:
    """Prometheus's words (503 ``timeout``) for a query past ``--query.timeout``."""
    return PromQLError(TIMEOUT_MESSAGE, kind="timeout")


def too_many_samples() -> PromQLError:
    """Prometheus's words (422 ``execution``) for a query past ``--query.max-samples``."""
    return PromQLError(TOO_MANY_SAMPLES_MESSAGE, kind="execution")


def too_many_series(limit: int) -> PromQLError:
    """Mimir's words and status (422 ``execution``) for its -querier.max-fetched-series-per-query
    limit (Prometheus has no such limit; Thanos and Mimir answer 422 for theirs)."""
    return PromQLError(
        f"the query exceeded the maximum number of series (limit: {limit} series): add label "
        "matchers to select fewer series, or raise the setting query_max_series",
        kind="execution",
    )


def check_resolution(start_ms: int, end_ms: int, step_ms: int) -> None:
    """Prometheus's guard on a range query's number of points per series (``step_ms > 0``)."""
    if (end_ms - start_ms) // step_ms > MAX_POINTS_PER_SERIES:
        raise ResolutionError(range_ms=end_ms - start_ms, step_ms=step_ms)


class Limits:
    """One query's running costs against its limits. ``check()`` is cheap (one clock read):
    the evaluator calls it at every node and inside its per-series and per-step loops."""

    def __init__(
        self,
        max_samples: int,
        max_series: int = 0,
        timeout_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.max_samples = max_samples
        self.max_series = max_series
        self.clock = clock
        self.deadline = None if timeout_s is None else clock() + timeout_s
        self.current = 0  # points held now
        self.peak = 0
        self._series: set[object] = set()

    def check(self) -> None:
        """The timeout error once the deadline has passed."""
        if self.deadline is not None and self.clock() > self.deadline:
            raise timed_out()

    def reserve(self, points: int) -> None:
        """``points`` more are about to be held: refused if that passes the budget."""
        self.check()
        self._hold(self.current + points)

    def settle(self, before: int, held: int) -> None:
        """A node is done: what it read and its inputs are released, its output (``held``
        points) stays, on top of the ``before`` held when it started."""
        self._hold(before + held)

    def selected(self, series: Iterable[object]) -> None:
        """Count distinct selected series (any hashable identity, e.g. label tuples)."""
        if not self.max_series:
            return
        self._series.update(series)
        if len(self._series) > self.max_series:
            raise too_many_series(self.max_series)

    def _hold(self, current: int) -> None:
        self.current = current
        self.peak = max(self.peak, current)
        if current > self.max_samples:
            raise too_many_samples()
