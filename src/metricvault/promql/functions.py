"""Function calls (functions.go): range-vector functions per series over all steps, and
instant-vector functions as numpy array operations."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

from metricvault.errors import PromQLError, SelectorError
from metricvault.model import is_label_name
from metricvault.promql import rangefuncs as rf
from metricvault.promql import tiers
from metricvault.promql.values import (
    NAME,
    Labels,
    RangeSeries,
    RangeVector,
    Scalar,
    StepVector,
    drop_name,
    get_label,
    make_labels,
    per_series,
)
from metricvault.selector import re2_compile

if TYPE_CHECKING:
    from metricvault.promql.eval import Evaluator


def _sgn(v: np.ndarray) -> np.ndarray:
    return np.asarray(np.sign(v))


MATH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "ln": np.log,
    "log2": np.log2, "log10": np.log10, "sqrt": np.sqrt, "sgn": _sgn, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "deg": np.degrees, "rad": np.radians,
}  # fmt: skip
OVER_TIME = {
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "stddev_over_time", "stdvar_over_time", "present_over_time",
}  # fmt: skip
DATE = {
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month",
    "year",
}  # fmt: skip


def call(ev: Evaluator, node: Any, steps: np.ndarray) -> StepVector | Scalar:
    name = node.func.name
    args = list(node.args)
    if name in RANGE_FUNCTIONS:
        return _range_call(ev, name, args, steps)
    if name in MATH:
        vec = ev.eval_vector(args[0], steps)
        with np.errstate(all="ignore"):
            return _values(vec, MATH[name](vec.values))
    if name == "time":
        return Scalar(steps / 1000.0)
    if name == "pi":
        return Scalar(np.full(steps.size, np.pi))
    if name in DATE:
        vec = ev.eval_vector(args[0], steps) if args else _time_vector(steps)
        return _values(vec, _date(name, vec.values))
    handler = INSTANT_FUNCTIONS.get(name)
    if handler is None:
        raise PromQLError(f"function {name!r} is not implemented yet", kind="bad_data")
    return handler(ev, args, steps)


def _values(vec: StepVector, values: np.ndarray, keep_name: bool = False) -> StepVector:
    out = StepVector(vec.labels, np.asarray(values, dtype=np.float64), vec.present)
    return out if keep_name else out.with_labels([drop_name(x) for x in vec.labels])


def _time_vector(steps: np.ndarray) -> StepVector:
    return StepVector([()], (steps / 1000.0)[None, :], np.ones((1, steps.size), dtype=bool))


# ------------------------------------------------------------------------------ range
def _range_call(ev: Evaluator, name: str, args: list[Any], steps: np.ndarray) -> StepVector:
    matrix_pos = next(
        i
        for i, a in enumerate(args)
        if _unwrap(a).__class__ in (pp.MatrixSelector, pp.SubqueryExpr)
    )
    from_rollups = tiers.range_call(
        ev, name, args[matrix_pos], steps, args, lambda part: raw_range_call(ev, name, args, part)
    )
    if from_rollups is not None:
        return from_rollups
    return raw_range_call(ev, name, args, steps)


def raw_range_call(ev: Evaluator, name: str, args: list[Any], steps: np.ndarray) -> StepVector:
    """``name(args)`` from raw samples (tiers.py asks for the steps its rows do not answer)."""
    matrix_pos = next(
        i
        for i, a in enumerate(args)
        if _unwrap(a).__class__ in (pp.MatrixSelector, pp.SubqueryExpr)
    )
    rv = ev.eval_range(args[matrix_pos], steps)
    scalars = [ev.eval_scalar(a, steps) for i, a in enumerate(args) if i != matrix_pos]
    if name == "absent_over_time":
        return _absent_over_time(rv, args[0], steps)
    ev.limits.reserve(len(rv.series) * steps.size)  # one row of answers per series
    if name in BATCHED and len(rv.series) > 1:
        return _batched(ev, name, rv, steps)
    rows = []
    for s, (lo, hi) in zip(rv.series, rv.bounds, strict=True):
        ev.limits.check()
        rows.append((s.labels, *_range_value(name, s, lo, hi, rv, scalars, steps, ev)))
    return per_series(rows, steps.size, keep_name=name == "last_over_time")


# Functions whose per-series code indexes its samples only through the windows' ``lo``/``hi``
# (or sums of them): run once over every series' samples laid end to end, with each series'
# bounds shifted by where its samples start, they give each series' answer exactly as one call
# per series does (a window never reaches across into the next series' samples).
BATCHED = {
    "rate", "increase", "delta", "avg_over_time", "min_over_time", "max_over_time",
    "sum_over_time", "count_over_time", "last_over_time", "present_over_time",
}  # fmt: skip


BATCH_CELLS = 1 << 20  # (series x steps) cells per batch: its temporaries stay tens of MB


def _batched(ev: Evaluator, name: str, rv: RangeVector, steps: np.ndarray) -> StepVector:
    """``name`` over ``rv``'s series a batch at a time, each batch in one numpy pass (see
    :data:`BATCHED`); the query's deadline checked between batches."""
    n_steps = steps.size
    per_batch = max(1, BATCH_CELLS // max(n_steps, 1))
    rows: list[tuple[Labels, np.ndarray, np.ndarray]] = []
    for first in range(0, len(rv.series), per_batch):
        ev.limits.check()
        rows += _batch(name, rv, first, min(first + per_batch, len(rv.series)), n_steps)
    return per_series(rows, n_steps, keep_name=name == "last_over_time")


def _batch(
    name: str, rv: RangeVector, first: int, last: int, n_steps: int
) -> list[tuple[Labels, np.ndarray, np.ndarray]]:
    series, bounds = rv.series[first:last], rv.bounds[first:last]
    n_series = len(series)
    sizes = np.fromiter((s.ts.size for s in series), dtype=np.int64, count=n_series)
    offsets = np.zeros(n_series, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    flat = RangeSeries(
        (), np.concatenate([s.ts for s in series]), np.concatenate([s.values for s in series])
    )
    lo = (np.array([b[0] for b in bounds], dtype=np.int64) + offsets[:, None]).ravel()
    hi = (np.array([b[1] for b in bounds], dtype=np.int64) + offsets[:, None]).ravel()
    if name in OVER_TIME:
        values, ok = rf.over_time(name, flat, lo, hi)
    else:
        tiled = RangeVector(
            [], np.tile(rv.starts, n_series), np.tile(rv.ends, n_series), rv.range_ms,
            left_open=rv.left_open,
        )  # fmt: skip
        values, ok = rf.extrapolated_rate(flat, lo, hi, tiled, name != "delta", name == "rate")
    values = np.asarray(values, dtype=np.float64).reshape(n_series, n_steps)
    ok = np.asarray(ok, dtype=bool).reshape(n_series, n_steps)
    return [(s.labels, values[i], ok[i]) for i, s in enumerate(series)]


def _range_value(
    name: str, s: Any, lo: np.ndarray, hi: np.ndarray, rv: RangeVector,
    scalars: list[np.ndarray], steps: np.ndarray, ev: Evaluator,
) -> rf.Result:  # fmt: skip
    check = ev.limits.check  # between the chunks of the functions that gather windows
    if name in ("rate", "increase", "delta"):
        return rf.extrapolated_rate(s, lo, hi, rv, name != "delta", name == "rate")
    if name in ("irate", "idelta"):
        return rf.instant_value(s, lo, hi, name == "irate")
    if name in OVER_TIME:
        return rf.over_time(name, s, lo, hi, check)
    if name == "quantile_over_time":
        return rf.quantile_over_time(s, lo, hi, scalars[0], check)
    if name in ("resets", "changes"):
        return rf.resets_changes(name, s, lo, hi)
    if name == "deriv":
        return rf.deriv(s, lo, hi, check)
    if name == "predict_linear":
        return rf.predict_linear(s, lo, hi, steps, scalars[0], check)
    if name == "holt_winters":
        return rf.holt_winters(s, lo, hi, scalars[0], scalars[1], check)
    raise PromQLError(f"function {name!r} is not implemented yet", kind="bad_data")


RANGE_FUNCTIONS = {
    "rate", "increase", "delta", "irate", "idelta", "quantile_over_time", "resets",
    "changes", "deriv", "predict_linear", "holt_winters", "absent_over_time", *OVER_TIME,
}  # fmt: skip


def _unwrap(node: Any) -> Any:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def _absent_labels(node: Any) -> Labels:
    node = _unwrap(node)
    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    out: dict[str, str] = {}
    seen: set[str] = set()
    for m in node.matchers.matchers:
        if m.name == NAME:
            continue
        if m.op == pp.MatchOp.Equal and m.name not in seen:
            out[m.name] = m.value
            seen.add(m.name)
        else:
            out.pop(m.name, None)
    return make_labels(out.items())


def _absent_over_time(rv: RangeVector, arg: Any, steps: np.ndarray) -> StepVector:
    any_present = np.zeros(steps.size, dtype=bool)
    for lo, hi in rv.bounds:
        any_present |= hi > lo
    vec = StepVector([_absent_labels(arg)], np.ones((1, steps.size)), ~any_present[None, :])
    return vec if (~any_present).any() else StepVector.empty(steps.size)


# ------------------------------------------------------------------------------ instant
def _absent(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    vec = ev.eval_vector(args[0], steps)
    missing = np.ones(steps.size, dtype=bool)
    if vec.labels:
        missing = ~np.asarray(vec.present.any(axis=0))
    if not missing.any():
        return StepVector.empty(steps.size)
    return StepVector([_absent_labels(args[0])], np.ones((1, steps.size)), missing[None, :])


def _scalar(ev: Evaluator, args: list[Any], steps: np.ndarray) -> Any:
    vec = ev.eval_vector(args[0], steps)
    if not vec.labels:
        return Scalar(np.full(steps.size, np.nan))
    count = vec.present.sum(axis=0)
    pick = np.argmax(vec.present, axis=0)
    value = vec.values[pick, np.arange(steps.size)]
    return Scalar(np.where(count == 1, value, np.nan))


def _vector(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    values = ev.eval_scalar(args[0], steps)
    return StepVector([()], values[None, :].copy(), np.ones((1, steps.size), dtype=bool))


def _sort(order: str) -> Callable[[Evaluator, list[Any], np.ndarray], StepVector]:
    def handler(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
        vec = ev.eval_vector(args[0], steps)
        return StepVector(vec.labels, vec.values, vec.present, sort_order=order)

    return handler


def _round(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    vec = ev.eval_vector(args[0], steps)
    nearest = ev.eval_scalar(args[1], steps) if len(args) > 1 else np.ones(steps.size)
    with np.errstate(all="ignore"):
        inverse = 1.0 / nearest
        return _values(vec, np.floor(vec.values * inverse + 0.5) / inverse)


def _clamp(kind: str) -> Callable[[Evaluator, list[Any], np.ndarray], StepVector]:
    def handler(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
        vec = ev.eval_vector(args[0], steps)
        low = ev.eval_scalar(args[1], steps) if kind in ("clamp", "clamp_min") else None
        high_arg = 2 if kind == "clamp" else 1
        high = ev.eval_scalar(args[high_arg], steps) if kind in ("clamp", "clamp_max") else None
        values, present = vec.values, vec.present
        if high is not None:
            values = np.minimum(high[None, :], values)  # Go's math.Min: NaN wins
        if low is not None:
            values = np.maximum(low[None, :], values)
        if low is not None and high is not None:
            present = present & ~(high < low)[None, :]
        out = StepVector(vec.labels, values, present)
        return out.with_labels([drop_name(x) for x in vec.labels])

    return handler


def _timestamp(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    arg = _unwrap(args[0])
    if isinstance(arg, pp.VectorSelector):
        vec, sample_ts = ev.vector_selector(arg, steps)
        return _values(vec, sample_ts / 1000.0)
    vec = ev.eval_vector(args[0], steps)
    return _values(vec, np.broadcast_to(steps / 1000.0, vec.values.shape))


def _string_arg(ev: Evaluator, node: Any, steps: np.ndarray) -> str:
    value = ev.eval(node, steps[:1])
    if not isinstance(value, str):
        raise PromQLError("expected a string argument", kind="bad_data")
    return value


def _go_template(repl: str) -> Callable[[re.Match[str]], str]:
    """Go's Regexp.ExpandString: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``."""
    tokens = re.compile(r"\$\$|\$\{([a-zA-Z0-9_]+)\}|\$([a-zA-Z0-9_]+)")

    def expand(match: re.Match[str]) -> str:
        def one(tok: re.Match[str]) -> str:
            if tok.group(0) == "$$":
                return "$"
            ref = tok.group(1) or tok.group(2)
            try:
                value = match.group(int(ref)) if ref.isdigit() else match.group(ref)
            except (IndexError, KeyError, re.error):
                return ""  # Go expands a group that does not exist to nothing
            return value or ""

        return tokens.sub(one, repl)

    return expand


def _label_replace(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    vec = ev.eval_vector(args[0], steps)
    dst, repl, src, regex = (_string_arg(ev, a, steps) for a in args[1:5])
    try:
        # RE2, as Go's regexp: linear time whatever the regex. Anchored as Go anchors
        # ^(?:re)$: "$" is the very end, "." stops at a newline.
        pattern = re2_compile(f"^(?:{regex})$")
    except SelectorError as exc:
        raise PromQLError(f"invalid regular expression in label_replace(): {regex}") from exc
    if not is_label_name(dst):
        raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
    expand = _go_template(repl)
    labels = []
    for lab in vec.labels:
        match = pattern.match(get_label(lab, src))
        if match is None:
            labels.append(lab)
            continue
        rest = [p for p in lab if p[0] != dst]
        labels.append(make_labels([*rest, (dst, expand(match))]))
    return StepVector(labels, vec.values, vec.present).with_labels(labels)


def _label_join(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    vec = ev.eval_vector(args[0], steps)
    dst, sep = _string_arg(ev, args[1], steps), _string_arg(ev, args[2], steps)
    sources = [_string_arg(ev, a, steps) for a in args[3:]]
    for src in sources:
        if not is_label_name(src):
            raise PromQLError(f"invalid source label name in label_join(): {src}")
    if not is_label_name(dst):
        raise PromQLError(f"invalid destination label name in label_join(): {dst}")
    labels = []
    for lab in vec.labels:
        joined = sep.join(get_label(lab, s) for s in sources)
        labels.append(make_labels([*(p for p in lab if p[0] != dst), (dst, joined)]))
    return StepVector(labels, vec.values, vec.present).with_labels(labels)


def _histogram_quantile(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    from metricvault.promql.histogram import histogram_quantile

    q = ev.eval_scalar(args[0], steps)
    return histogram_quantile(q, ev.eval_vector(args[1], steps))


def _no_native_histograms(ev: Evaluator, args: list[Any], steps: np.ndarray) -> StepVector:
    for arg in args:
        ev.eval(arg, steps)  # still evaluated, so its errors surface
    return StepVector.empty(steps.size)


# What Go's time.Unix(int64(v), 0) gives where int64(v) overflows (NaN, ±Inf, |v| >= 2^63):
# int64(v) is then -2^63, i.e. 292277026596-12-04 15:30 UTC, a Sunday.
_GO_OVERFLOW_DATE = {
    "year": 292277026596.0, "month": 12.0, "day_of_month": 4.0, "day_of_year": 339.0,
    "day_of_week": 0.0, "days_in_month": 31.0, "hour": 15.0, "minute": 30.0,
}  # fmt: skip


def _date(name: str, values: np.ndarray) -> np.ndarray:
    finite = np.abs(values) < 2.0**63
    seconds = np.where(finite, np.trunc(values), 0).astype(np.int64)
    moment = seconds.astype("datetime64[s]")
    days = moment.astype("datetime64[D]")
    months = moment.astype("datetime64[M]")
    if name == "year":
        out = moment.astype("datetime64[Y]").astype(np.int64) + 1970
    elif name == "month":
        out = months.astype(np.int64) % 12 + 1
    elif name == "day_of_month":
        out = (days - months.astype("datetime64[D]")).astype(np.int64) + 1
    elif name == "day_of_year":
        years = moment.astype("datetime64[Y]").astype("datetime64[D]")
        out = (days - years).astype(np.int64) + 1
    elif name == "day_of_week":
        out = (days.astype(np.int64) + 4) % 7  # 1970-01-01 was a Thursday
    elif name == "days_in_month":
        out = ((months + 1).astype("datetime64[D]") - months.astype("datetime64[D]")).astype(
            np.int64
        )
    elif name == "hour":
        out = (seconds // 3600) % 24
    else:
        out = (seconds // 60) % 60
    return np.where(finite, out.astype(np.float64), _GO_OVERFLOW_DATE[name])


INSTANT_FUNCTIONS: dict[str, Callable[[Evaluator, list[Any], np.ndarray], StepVector | Scalar]] = {
    "absent": _absent,
    "scalar": _scalar,
    "vector": _vector,
    "sort": _sort("asc"),
    "sort_desc": _sort("desc"),
    "round": _round,
    "clamp": _clamp("clamp"),
    "clamp_min": _clamp("clamp_min"),
    "clamp_max": _clamp("clamp_max"),
    "timestamp": _timestamp,
    "label_replace": _label_replace,
    "label_join": _label_join,
    "histogram_quantile": _histogram_quantile,
    # Native-histogram functions: float samples hold no native histograms, so nothing.
    "histogram_count": _no_native_histograms,
    "histogram_sum": _no_native_histograms,
    "histogram_fraction": _no_native_histograms,
}
