"""PromQL over the vault: ``Engine(source).evaluate(expr, start_ms, end_ms, step_ms)``.

The engine reads through the leaf's read seam (:class:`metricvault.protocols.SampleSource`),
which every readable store implements (``Engine(vault)``; ``MemorySource`` for tests), and
evaluates with numpy; see docs/promql.md for what is implemented.
"""

from metricvault.errors import PromQLError
from metricvault.promql.eval import Engine, EngineOptions
from metricvault.promql.limits import (
    MAX_POINTS_PER_SERIES,
    check_resolution,
    timed_out,
    too_many_samples,
    too_many_series,
)
from metricvault.promql.source import (
    STALE_NAN,
    MemorySource,
    SampleSource,
    SeriesSamples,
)
from metricvault.promql.values import QueryResult

__all__ = [
    "MAX_POINTS_PER_SERIES",
    "STALE_NAN",
    "Engine",
    "EngineOptions",
    "MemorySource",
    "PromQLError",
    "QueryResult",
    "SampleSource",
    "SeriesSamples",
    "check_resolution",
    "timed_out",
    "too_many_samples",
    "too_many_series",
]
