"""The evaluator: walks the parsed AST and evaluates every node at all steps at once.

Semantics are Prometheus 2.x's (``promql/engine.go`` of v2.42): instant selectors take the
latest sample in ``[t - lookback, t]``, range selectors the samples in ``[t - range, t]`` (both
ends closed; Prometheus 3 made them left-open, ``left_open_windows=True``), ``offset`` and ``@``
move the reference time, subqueries evaluate their inner expression on a grid aligned to
multiples of their step, and subtrees that do not depend on the step (everything pinned with
``@``) are evaluated once, at the first step, as Prometheus does.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

from metricvault.errors import PromQLError, SelectorError
from metricvault.promql import aggregate, binary, functions, tiers
from metricvault.promql.head_cache import HeadCache
from metricvault.promql.limits import MAX_POINTS_PER_SERIES, Clock, Limits, check_resolution
from metricvault.promql.parse import duration_ms, parse
from metricvault.promql.source import SampleSource, hints_for, is_stale
from metricvault.promql.times import (
    INT64_MAX,
    MAX_STORED_MS,
    MIN_STORED_MS,
    at_times,
    check_int64,
    parser_at_ms,
)
from metricvault.promql.values import (
    Labels,
    QueryResult,
    RangeSeries,
    RangeVector,
    Scalar,
    StepVector,
    make_labels,
)
from metricvault.promql.window_cache import WindowCache
from metricvault.protocols import BucketSelection, SelectHints
from metricvault.selector import Matcher

if TYPE_CHECKING:
    from metricvault.config import Settings

__all__ = ["MAX_POINTS_PER_SERIES", "Engine", "EngineOptions", "Evaluator"]
# The parser's enum values do not hash; their str() does.
_MATCH_OPS = {
    "MatchOp.Equal": "=",
    "MatchOp.NotEqual": "!=",
    "MatchOp.Re": "=~",
    "MatchOp.NotRe": "!~",
}
# Functions whose value depends on the evaluation time itself (engine.go AtModifierUnsafeFunctions).
_AT_UNSAFE = {
    "days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute",
    "month", "year", "predict_linear", "time",
}  # fmt: skip


Value = StepVector | Scalar | RangeVector | str


@dataclass(frozen=True)
class EngineOptions:
    lookback_delta_ms: int = 300_000
    subquery_step_ms: int = 60_000  # Prometheus's default: the global evaluation_interval
    left_open_windows: bool = False
    # Answer rate/increase/delta/*_over_time from rollup tiers where that is exact (tiers.py)
    use_rollups: bool = True
    # Opt-in: windows that are not whole minutes (Grafana's $__rate_interval) answered from
    # the 1m rollups within raw retention too, moved to whole minutes (tiers.py ROUNDED_NOTE);
    # off, answers there are exactly Prometheus's
    round_windows: bool = False
    # Plain selectors on whole-minute steps within raw retention answered from the rows'
    # first and last samples where that is exact (tiers.selector_from_rows; off: raw reads,
    # the bench's peer)
    selector_rows: bool = True
    # Points one query may hold at once (Prometheus's --query.max-samples), distinct series it
    # may select (0: no limit) and seconds it may run from evaluate()'s start (None: no
    # deadline); checked while it runs (limits.py).
    max_samples: int = 50_000_000
    max_series: int = 0
    timeout_s: float | None = None
    # Long windows (days, before the raw horizon) of instant queries kept between
    # evaluations, so a rule re-evaluated every interval reads only what entered its window
    # (window_cache.py; off: every evaluation reads all its rows, the bench's baseline)
    window_cache: bool = True
    # Recent raw samples of instant queries kept per selector while the catalog shows no
    # change, so the rules of a group that read one metric read it once (head_cache.py)
    head_cache: bool = True

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> EngineOptions:
        """The options a vault's settings give (``lookback_delta``, ``query_max_samples``,
        ``query_max_series``, ``query_timeout``), so every place the engine runs holds the
        same limits."""
        from metricvault.durations import parse_duration_ms

        given: dict[str, Any] = {
            "lookback_delta_ms": parse_duration_ms(settings.lookback_delta),
            "max_samples": settings.query_max_samples,
            "max_series": settings.query_max_series,
            "timeout_s": parse_duration_ms(settings.query_timeout) / 1000,
            "round_windows": settings.promql_round_windows,
        }
        return cls(**{**given, **overrides})


class Engine:
    """PromQL over a :class:`~metricvault.promql.source.SampleSource`.

    ``evaluate(expr, start_ms)`` is an instant query; with ``end_ms`` and ``step_ms`` a range
    query at ``start, start + step, ... <= end``.
    """

    def __init__(
        self,
        source: SampleSource,
        options: EngineOptions | None = None,
        clock: Clock = time.monotonic,  # the deadline's clock (tests move it by hand)
        shared_heads: HeadCache | None = None,
    ) -> None:
        self.source = source
        self.options = options or EngineOptions()
        self.clock = clock
        self.windows = WindowCache() if self.options.window_cache else None
        keep = self.options.head_cache
        self.heads = (HeadCache() if shared_heads is None else shared_heads) if keep else None
        # range queries read through ``heads`` too where it outlives one engine (the query
        # API's, shared by its queries); one engine's own would only widen a first read
        self.heads_for_ranges = keep and shared_heads is not None

    def evaluate(
        self, expr: str, start_ms: int, end_ms: int | None = None, step_ms: int | None = None
    ) -> QueryResult:
        o = self.options
        limits = Limits(o.max_samples, o.max_series, o.timeout_s, self.clock)
        try:
            return self._evaluate(expr, start_ms, end_ms, step_ms, limits)
        except PromQLError as exc:
            # Without the frames of the evaluation, which hold every array it built: a refused
            # query gives its memory back as soon as the error is handled.
            raise exc.with_traceback(None) from None
        except RecursionError:  # a shape the depth check let through: refused, not a crash
            raise PromQLError(
                "the expression nests too deeply to be evaluated (past Python's recursion "
                f"limit of {sys.getrecursionlimit()} frames); split it into smaller expressions"
            ) from None
        except ValueError as exc:  # promql-parser's AST cannot hand over a duration past
            text = str(exc)  # int64 (rate(x[300000000y]), offset -300000000y): what
            if "too large to fit" not in text and "too small to fit" not in text:
                raise  # Prometheus's parser refuses as "duration out of range"
            raise PromQLError("parse error: duration out of range", "bad_data") from None

    def _evaluate(
        self, expr: str, start_ms: int, end_ms: int | None, step_ms: int | None, limits: Limits
    ) -> QueryResult:
        tree = parse(expr)
        at = at_times(tree, expr)
        check_int64("the query time", start_ms)
        if end_ms is None:
            ev = Evaluator(self.source, self.options, start_ms, start_ms, limits, at)
            ev.windows, ev.heads = self.windows, self.heads
            value = ev.eval(tree, np.array([start_ms], dtype=np.int64))
            return ev.annotate(_instant_result(value, start_ms))
        check_int64("the query's end time", end_ms)
        steps = _steps(start_ms, end_ms, step_ms)
        ev = Evaluator(self.source, self.options, start_ms, end_ms, limits, at)
        if self.heads_for_ranges:
            ev.heads = self.heads
        value = ev.eval(tree, steps)
        if isinstance(value, RangeVector | str):
            kind = "range vector" if isinstance(value, RangeVector) else "string"
            raise PromQLError(
                f'invalid expression type "{kind}" for range query, must be Scalar or '
                "instant Vector",
                kind="bad_data",
            )
        return ev.annotate(_range_result(value, steps))


def _steps(start_ms: int, end_ms: int, step_ms: int | None) -> np.ndarray:
    if step_ms is None or step_ms <= 0:
        raise PromQLError(
            "zero or negative query resolution step widths are not accepted. "
            "Try a positive integer",
            kind="bad_data",
        )
    if end_ms < start_ms:
        raise PromQLError("end timestamp must not be before start time", kind="bad_data")
    check_resolution(start_ms, end_ms, step_ms)
    return np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)


def _as_dict(labels: Labels) -> dict[str, str]:
    return dict(labels)


def _instant_result(value: Value, t: int) -> QueryResult:
    stamp = np.array([t], dtype=np.int64)
    if isinstance(value, str):
        return QueryResult("string", [({}, stamp, np.zeros(1))], text=value)
    if isinstance(value, Scalar):
        return QueryResult("scalar", [({}, stamp, value.values[:1].copy())])
    if isinstance(value, RangeVector):
        series = []
        for s, (lo, hi) in zip(value.series, value.bounds, strict=True):
            a, b = int(lo[0]), int(hi[0])
            if b > a:
                series.append((_as_dict(s.labels), s.ts[a:b], s.values[a:b]))
        return QueryResult("matrix", sorted(series, key=lambda e: sorted(e[0].items())))
    rows = np.flatnonzero(value.present[:, 0]).tolist()
    if value.sort_order is not None:
        vals = value.values[:, 0]
        sign = 1.0 if value.sort_order == "asc" else -1.0
        rows.sort(key=lambda r: (bool(np.isnan(vals[r])), sign * float(vals[r])))
    return QueryResult(
        "vector",
        [(_as_dict(value.labels[r]), stamp, value.values[r, :1].copy()) for r in rows],
    )


def _range_result(value: StepVector | Scalar, steps: np.ndarray) -> QueryResult:
    if isinstance(value, Scalar):
        return QueryResult("matrix", [({}, steps, value.values)])
    series = []
    for r in np.flatnonzero(value.present.any(axis=1)).tolist():
        mask = value.present[r]
        series.append((value.labels[r], steps[mask], value.values[r][mask]))
    series.sort(key=lambda e: e[0])
    return QueryResult("matrix", [(_as_dict(lab), ts, vs) for lab, ts, vs in series])


class Evaluator:
    def __init__(
        self,
        source: SampleSource,
        options: EngineOptions,
        query_start: int,
        query_end: int,
        limits: Limits | None = None,
        at_ms: dict[int, int] | None = None,  # each @ time, by id() of its node (times.py)
    ) -> None:
        self.source = source
        self.options = options
        self.limits = limits or Limits(options.max_samples, options.max_series, options.timeout_s)
        self.at_ms = at_ms or {}
        self.query_start = query_start
        self.query_end = query_end
        self.notes: list[str] = []  # warnings for the answer (approximations)
        self.served_by: set[str] = set()  # rollup tiers that answered a range function
        self.windows: WindowCache | None = None  # kept long windows (instant queries)
        self.heads: HeadCache | None = None  # kept recent raw samples (instant queries)

    def annotate(self, result: QueryResult) -> QueryResult:
        result.warnings = list(dict.fromkeys(self.notes))
        result.served_by = set(self.served_by)
        return result

    # ------------------------------------------------------------------ dispatch
    def eval(self, node: Any, steps: np.ndarray) -> Value:
        # Range vectors keep their per-step windows even when pinned with @ (the function
        # over them decides); literals are cheap anyway.
        self.limits.check()
        before = self.limits.current
        kinds = (pp.NumberLiteral, pp.StringLiteral, pp.MatrixSelector, pp.SubqueryExpr)
        if steps.size > 1 and not isinstance(node, kinds) and step_invariant(node):
            once = self._eval(node, steps[:1])
            self.limits.reserve(points(once) * steps.size)
            value = _broadcast(once, steps.size)
        else:
            value = self._eval(node, steps)
        self.limits.settle(before, points(value))
        return value

    def _eval(self, node: Any, steps: np.ndarray) -> Value:
        if isinstance(node, pp.NumberLiteral):
            return Scalar(np.full(steps.size, float(node.val)))
        if isinstance(node, pp.StringLiteral):
            return str(node.val)
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, steps)
        if isinstance(node, pp.UnaryExpr):
            return _negate(self.eval(node.expr, steps))
        if isinstance(node, pp.VectorSelector):
            return self.vector_selector(node, steps)[0]
        if isinstance(node, pp.MatrixSelector):
            return self.matrix_selector(node, steps)
        if isinstance(node, pp.SubqueryExpr):
            return self.subquery(node, steps)
        if isinstance(node, pp.AggregateExpr):
            return aggregate.evaluate(self, node, steps)
        if isinstance(node, pp.BinaryExpr):
            return binary.evaluate(self, node, steps)
        if isinstance(node, pp.Call):
            return functions.call(self, node, steps)
        raise PromQLError(f"unsupported expression {type(node).__name__}: {node}", "bad_data")

    def eval_vector(self, node: Any, steps: np.ndarray) -> StepVector:
        value = self.eval(node, steps)
        if not isinstance(value, StepVector):
            raise PromQLError(f"expected an instant vector, got {type(value).__name__}")
        return value

    def eval_scalar(self, node: Any, steps: np.ndarray) -> np.ndarray:
        value = self.eval(node, steps)
        if not isinstance(value, Scalar):
            raise PromQLError(f"expected a scalar, got {type(value).__name__}")
        return value.values

    def eval_range(self, node: Any, steps: np.ndarray) -> RangeVector:
        value = self.eval(node, steps)
        if not isinstance(value, RangeVector):
            raise PromQLError(f"expected a range vector, got {type(value).__name__}")
        return value

    # ------------------------------------------------------------------ selectors
    def reference_times(self, node: Any, steps: np.ndarray) -> np.ndarray:
        """The times a selector or subquery looks at: the step (or its ``@``) minus offset."""
        at = node.at
        if at is None:
            base = steps
        elif at.type == pp.AtModifierType.Start:
            base = np.full(steps.size, self.query_start, dtype=np.int64)
        elif at.type == pp.AtModifierType.End:
            base = np.full(steps.size, self.query_end, dtype=np.int64)
        else:
            base = np.full(steps.size, self.at_time(node), dtype=np.int64)
        offset = duration_ms(node.offset)
        # Room below for the widest window (a range, the lookback) so no later subtraction
        # wraps around int64: Prometheus's Go arithmetic would wrap silently.
        room = max(self.options.lookback_delta_ms, 0) + (1 << 44)
        lo, hi = int(base.min()) - offset, int(base.max()) - offset
        if lo - room < -INT64_MAX - 1 or hi > INT64_MAX:
            raise PromQLError(
                f"the evaluation time {hi if hi > INT64_MAX else lo} ms (the query time moved "
                "by @ and offset) is too near the ends of int64 milliseconds; use @ and offset "
                "values that keep it within about ±292 million years of 1970",
                kind="bad_data",
            )
        return base - offset

    def at_time(self, node: Any) -> int:
        found = self.at_ms.get(id(node))
        return parser_at_ms(node.at) if found is None else found

    def matchers(self, vs: Any) -> list[Matcher]:
        if vs.matchers.or_matchers:  # {a="x" or b="y"}: refused, not read as {}
            raise PromQLError(
                "parse error: 'or' between label matchers is not supported: join whole "
                'selectors with or (m{a="x"} or m{b="y"})',
                kind="bad_data",
            )
        try:
            matchers = [
                Matcher(m.name, _MATCH_OPS[str(m.op)], m.value) for m in vs.matchers.matchers
            ]
        except SelectorError as exc:  # a regex promql-parser's engine took but RE2 refuses
            raise PromQLError(f"parse error: {exc}", kind="bad_data") from None
        if vs.name is not None:
            matchers.insert(0, Matcher("__name__", "=", vs.name))
        return matchers

    def select(
        self, vs: Any, lo: int, hi: int, hints: SelectHints | None = None
    ) -> list[RangeSeries]:
        matchers = self.matchers(vs)
        self.limits.check()
        # Nothing is stored outside what a datetime holds; a store asked for it may overflow.
        lo, hi = max(lo, MIN_STORED_MS), min(hi, MAX_STORED_MS)
        if lo > hi:
            found = []
        elif self.heads is not None:
            found = self.heads.select(self.source, matchers, lo, hi, hints)
        else:
            found = self.source.select(matchers, lo, hi, hints)
        series = [RangeSeries(make_labels(s.labels.items()), s.ts, s.values) for s in found]
        self.limits.selected(s.labels for s in series)
        self.limits.reserve(sum(int(s.ts.size) for s in series))
        # Sorted by label set, as Prometheus's storage returns them (error messages and
        # the order of equal-valued results depend on it).
        return sorted(series, key=lambda s: s.labels)

    def count_buckets(self, selection: BucketSelection, n_steps: int) -> None:
        """The rollup path's reads against the limits: a row counts as a sample, and each
        series' answer as a row of ``n_steps`` points."""
        self.limits.selected(make_labels(s.labels.items()) for s in selection.series)
        rows = sum(int(s.columns["ts"].size) for s in selection.series)
        self.limits.reserve(rows + len(selection.series) * n_steps)

    def vector_selector(self, vs: Any, steps: np.ndarray) -> tuple[StepVector, np.ndarray]:
        """The vector and, per cell, the timestamp of the sample it took (for timestamp())."""
        refs = self.reference_times(vs, steps)
        lookback: int | np.ndarray = self.options.lookback_delta_ms
        lo = int(refs.min()) - self.options.lookback_delta_ms
        # Before the raw horizon, each rollup bucket's first and last sample (tiers.py).
        kept = tiers.selector_before_horizon(self, vs, refs, self.options.lookback_delta_ms)
        if kept is not None:
            old, horizon, widened = kept
            lookback = np.where(refs - widened < horizon, widened, lookback)
            lo = max(lo, horizon)  # raw samples: only after the horizon
        # Within raw retention, on whole-minute steps: the rows' samples, where exact.
        exact = (
            None
            if kept is not None
            else tiers.selector_from_rows(self, vs, refs, self.options.lookback_delta_ms)
        )
        if exact is not None:
            series = exact
        else:
            series = self.select(vs, lo, int(refs.max()), hints_for(refs))
        if kept is not None:
            series = tiers.merge_before(old, series)
        n, t = len(series), steps.size
        self.limits.reserve(n * t)
        values = np.zeros((n, t))
        present = np.zeros((n, t), dtype=bool)
        sample_ts = np.zeros((n, t), dtype=np.int64)
        for i, s in enumerate(series):
            self.limits.check()
            idx = np.searchsorted(s.ts, refs, side="right") - 1
            safe = np.maximum(idx, 0)
            ok = idx >= 0
            if s.ts.size:
                ok &= s.ts[safe] >= refs - lookback
                ok &= ~is_stale(s.values[safe])
            else:
                ok[:] = False
            present[i] = ok
            if s.ts.size:
                values[i] = s.values[safe]
                sample_ts[i] = s.ts[safe]
        return StepVector([s.labels for s in series], values, present), sample_ts

    def matrix_selector(self, ms: Any, steps: np.ndarray) -> RangeVector:
        vs = ms.vector_selector
        refs = self.reference_times(vs, steps)
        range_ms = duration_ms(ms.range)
        series = []
        hints = hints_for(refs, range_ms, left_open=self.options.left_open_windows)
        for s in self.select(vs, int(refs.min()) - range_ms, int(refs.max()), hints):
            self.limits.check()
            keep = ~is_stale(s.values)
            series.append(RangeSeries(s.labels, s.ts[keep], s.values[keep]))
        self.limits.reserve(len(series) * steps.size)  # each series' window at each step
        return RangeVector(
            series, refs - range_ms, refs, range_ms, left_open=self.options.left_open_windows
        )

    def subquery(self, sq: Any, steps: np.ndarray) -> RangeVector:
        refs = self.reference_times(sq, steps)
        range_ms = duration_ms(sq.range)
        step = duration_ms(sq.step) or self.options.subquery_step_ms
        first = int(refs.min()) - range_ms
        inner_start = step * (first // step)
        if inner_start < first:
            inner_start += step
        # The grid alone is refused before it is built where one series of it is too many.
        self.limits.reserve(max(0, (int(refs.max()) - inner_start) // step + 1))
        inner_steps = np.arange(inner_start, int(refs.max()) + 1, step, dtype=np.int64)
        series: list[RangeSeries] = []
        if inner_steps.size:
            inner = self.eval_vector(sq.expr, inner_steps)
            self.limits.reserve(int(inner.present.sum()))
            for r, labels in enumerate(inner.labels):
                self.limits.check()
                mask = inner.present[r]
                if mask.any():
                    series.append(RangeSeries(labels, inner_steps[mask], inner.values[r][mask]))
        self.limits.reserve(len(series) * steps.size)  # each series' window at each step
        return RangeVector(
            series, refs - range_ms, refs, range_ms, left_open=self.options.left_open_windows
        )


def points(value: Value) -> int:
    """What ``value`` holds, as the sample budget counts it (limits.py)."""
    if isinstance(value, StepVector):
        return int(value.values.size)
    if isinstance(value, RangeVector):  # the samples, and each series' window per step
        return sum(int(s.ts.size) for s in value.series) + len(value.series) * value.ends.size
    return 0


def _negate(value: Value) -> Value:
    if isinstance(value, Scalar):
        return Scalar(-value.values)
    if isinstance(value, StepVector):
        from metricvault.promql.values import drop_name

        negated = StepVector(value.labels, -value.values, value.present)
        return negated.with_labels([drop_name(x) for x in value.labels], per_step=False)
    raise PromQLError("unary minus is only allowed on scalars and instant vectors", "bad_data")


def _broadcast(value: Value, n_steps: int) -> Value:
    if isinstance(value, Scalar):
        return Scalar(np.repeat(value.values[:1], n_steps))
    if isinstance(value, StepVector):
        return StepVector(
            value.labels,
            np.repeat(value.values[:, :1], n_steps, axis=1),
            np.repeat(value.present[:, :1], n_steps, axis=1),
            value.sort_order,
        )
    return value


def step_invariant(node: Any) -> bool:
    """Whether ``node`` gives the same answer at every step (engine.go preprocessExpr)."""
    if isinstance(node, pp.VectorSelector):
        return node.at is not None
    if isinstance(node, pp.MatrixSelector):
        return bool(node.vector_selector.at is not None)
    if isinstance(node, pp.SubqueryExpr):
        return node.at is not None
    if isinstance(node, pp.NumberLiteral | pp.StringLiteral):
        return True
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return step_invariant(node.expr)
    if isinstance(node, pp.AggregateExpr):
        return step_invariant(node.expr)
    if isinstance(node, pp.BinaryExpr):
        return step_invariant(node.lhs) and step_invariant(node.rhs)
    if isinstance(node, pp.Call):
        if node.func.name in _AT_UNSAFE:
            return False
        return all(step_invariant(a) for a in node.args)
    return False
