"""Parsing with the ``promql-parser`` package (the Rust parser of the GreptimeDB project)."""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import promql_parser as pp

from metricvault.errors import PromQLError
from metricvault.selector import explain_parse_error, rewrite_strings

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Deeper expressions are refused before parsing: promql-parser (Rust) overflows its stack and
# kills the process near 10,000 chained operators, and the engine recurses per level (Python's
# recursion limit ends near 300). Prometheus has no such limit; no dashboard comes near it.
MAX_QUERY_DEPTH = 128
MAX_DURATION_MS = (2**63 - 1) // 1_000_000  # Go's time.Duration: int64 nanoseconds
_NOT_NESTING = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`|#[^\n]*""")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_WORD_OPERATORS = ("and", "or", "unless", "atan2")
_WORDS = re.compile(r"\b(?:and|or|unless|atan2)\b")


def _register_extra_functions() -> None:
    # The parser follows Prometheus 3, which renamed holt_winters; Prometheus 2.x still has it.
    with contextlib.suppress(ValueError):  # already registered (module reloaded)
        pp.register_extra_functions(
            [
                pp.Function(
                    "holt_winters",
                    [pp.ValueType.Matrix, pp.ValueType.Scalar, pp.ValueType.Scalar],
                    pp.ValueType.Vector,
                )
            ]
        )


_register_extra_functions()


# Trees of recently parsed expressions (a dashboard sends the same few again and again; a
# request parses its expression three times: the route's depth check, the result cache's
# check, the engine). Trees are only read, never changed, so they are shared; refusals are not kept.
PARSED_KEPT = 512
_parsed: OrderedDict[str, Any] = OrderedDict()
_parsed_lock = threading.Lock()


def parse(expr: str) -> Any:
    """The AST of ``expr``; a :class:`PromQLError` (bad_data) worded by the parser if not."""
    with _parsed_lock:
        tree = _parsed.get(expr)
        if tree is not None:
            _parsed.move_to_end(expr)
            return tree
    check_depth(expr)
    try:
        # raw (backtick) strings without escapes, as Prometheus reads them: promql-parser
        # refuses `\d` in one
        tree = pp.parse(rewrite_strings(expr))
    except ValueError as exc:
        reason = explain_parse_error(str(exc))  # a refused regex: in Prometheus's words
        raise PromQLError(f"parse error: {reason}", kind="bad_data") from exc
    with _parsed_lock:
        _parsed[expr] = tree
        while len(_parsed) > PARSED_KEPT:
            _parsed.popitem(last=False)
    return tree


def children(node: Any) -> list[Any]:
    """The sub-expressions of a parsed node, in the order the expression's text names them."""
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, pp.SubqueryExpr | pp.ParenExpr | pp.UnaryExpr):
        return [node.expr]
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.expr] if node.param is None else [node.param, node.expr]
    if isinstance(node, pp.Call):
        return list(node.args)
    return []


def post_order(node: Any) -> Iterator[Any]:
    """Every node of a parsed tree, children before their parent, in text order."""
    for child in children(node):
        yield from post_order(child)
    yield node


def query_depth(expr: str) -> int:
    """An upper bound of the depth of ``expr``'s syntax tree, read without parsing it: its
    binary operators plus its deepest nesting of parentheses (strings, comments and label
    matchers left out). C-speed string counts: a body may be 32 MB and this runs before any
    other check."""
    bare = _MATCHERS.sub("", _NOT_NESTING.sub('""', expr))
    operators = sum(bare.count(c) for c in "+-*/%^<>") + bare.count("==") + bare.count("!=")
    if any(word in bare for word in _WORD_OPERATORS):
        operators += len(_WORDS.findall(bare))
    if operators > MAX_QUERY_DEPTH:
        return operators
    chars = np.frombuffer(bare.encode(), dtype=np.uint8)
    nesting = np.cumsum((chars == ord("(")).astype(np.int64) - (chars == ord(")")))
    return max(int(nesting.max()) if nesting.size else 0, 0) + operators


def check_depth(expr: str) -> None:
    if expr in _parsed:  # parsed before: its depth was checked then
        return
    depth = query_depth(expr)
    if depth > MAX_QUERY_DEPTH:
        raise PromQLError(
            f"the expression nests {depth} operators and parentheses; metricvault evaluates "
            f"at most {MAX_QUERY_DEPTH} (split it, or use an aggregation)",
            kind="bad_data",
        )


def duration_ms(delta: timedelta | None) -> int:
    """Milliseconds of a duration in the tree; past Go's ``time.Duration`` (int64 ns, about
    292 years) Prometheus's parser refuses it, and so does this."""
    if delta is None:
        return 0
    ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    if abs(ms) > MAX_DURATION_MS:
        raise PromQLError("parse error: duration out of range", kind="bad_data")
    return ms


def datetime_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)
