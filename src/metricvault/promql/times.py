"""Times and durations inside an expression, checked before evaluation as Prometheus's parser
checks them, so an overflow is a ``bad_data`` answer and never an ``OverflowError``.

- Durations (ranges, offsets, subquery steps) are Go ``time.Duration``\\ s in Prometheus:
  past int64 nanoseconds (about 292 years) is ``duration out of range``.
- ``@ t`` is refused where ``t`` is not finite or does not fit int64 *seconds*
  (parser's ``setTimestamp``); here it must also fit int64 *milliseconds*, which Prometheus
  silently wraps. promql-parser cannot hand over an ``@`` time before 1970 or after 9999 (it
  converts to a Python ``datetime``), so the times are read from the expression's text, which
  names them in the order a post-order walk of the tree meets them (a modifier follows the
  text of the expression it modifies).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import promql_parser as pp

from metricvault.errors import PromQLError
from metricvault.promql.parse import datetime_ms, duration_ms, post_order

INT64_MAX = 2**63 - 1
# What a vault can hold (Python's datetime: years 1 to 9999); selects are clamped to it.
MIN_STORED_MS = -62_135_596_800_000
MAX_STORED_MS = 253_402_300_799_999
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 604_800_000, "y": 31_536_000_000}  # fmt: skip
_STRINGS_AND_COMMENTS = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`|#[^\n]*""")
_AT = re.compile(
    r"@\s*(?:(?P<pre>start|end)\s*\(\s*\)|(?P<sign>[+-]?)\s*(?P<num>(?:0x[0-9a-f]+"
    r"|(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?|inf|nan|(?:\d+(?:ms|[smhdwy]))+)(?![\w.])))",
    re.IGNORECASE,
)
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")


def check_int64(what: str, ms: int) -> int:
    """``ms`` if it fits int64 milliseconds, else a ``bad_data`` error naming ``what``."""
    if not -INT64_MAX - 1 <= ms <= INT64_MAX:
        raise PromQLError(
            f"{what} {ms} ms does not fit a timestamp (int64 milliseconds, about ±292 million "
            "years from 1970); give a time within that range",
            kind="bad_data",
        )
    return ms


def at_times(tree: Any, expr: str) -> dict[int, int]:
    """The ``@ <time>`` of every selector and subquery in ``tree`` (parsed from ``expr``), in
    milliseconds, keyed by ``id()`` of the node that carries it; every duration checked too."""
    texts = list(_AT.finditer(_STRINGS_AND_COMMENTS.sub('""', expr)))
    carriers = list(_carriers(tree))
    times: dict[int, int] = {}
    in_step = len(texts) == len(carriers)
    for i, node in enumerate(carriers):
        at = node.at
        if at.type != pp.AtModifierType.At:
            continue
        if in_step and texts[i].group("num") is not None:
            times[id(node)] = _at_ms(texts[i])
        else:  # the text and the tree disagree (never seen): the parser's own value
            times[id(node)] = parser_at_ms(at)
    return times


def _carriers(node: Any) -> Iterator[Any]:
    """Nodes with an ``@`` modifier, post-order, children in the order the text names them;
    durations are checked on the way."""
    for each in post_order(node):
        if isinstance(each, pp.VectorSelector):
            duration_ms(each.offset)
        elif isinstance(each, pp.MatrixSelector):
            duration_ms(each.range)
        elif isinstance(each, pp.SubqueryExpr):
            duration_ms(each.range)
            duration_ms(each.step)
            duration_ms(each.offset)
        if isinstance(each, pp.VectorSelector | pp.SubqueryExpr) and each.at is not None:
            yield each


def _at_ms(match: re.Match[str]) -> int:
    text = match.group("num").lower()
    sign = -1.0 if match.group("sign") == "-" else 1.0
    if text.startswith("0x"):
        seconds = sign * int(text, 16)
    elif _DURATION.fullmatch(text):
        seconds = sign * sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(text)) / 1e3
    else:
        seconds = sign * float(text)
    return at_seconds_ms(seconds)


def at_seconds_ms(seconds: float) -> int:
    """Prometheus's ``timestamp.FromFloatSeconds`` with its parser's bounds, and int64 ms."""
    if not math.isfinite(seconds) or not -(2.0**63) < seconds < 2.0**63:
        raise PromQLError(
            f"parse error: timestamp out of bounds for @ modifier: {_go_f(seconds)}",
            kind="bad_data",
        )
    ms = math.floor(abs(seconds) * 1000 + 0.5) * (1 if seconds >= 0 else -1)  # Go math.Round
    if not -INT64_MAX - 1 <= ms <= INT64_MAX:
        raise PromQLError(
            f"parse error: timestamp out of bounds for @ modifier: {_go_f(seconds)} (times "
            "are int64 milliseconds: at most ±9223372036854775.807 seconds)",
            kind="bad_data",
        )
    return int(ms)


def parser_at_ms(at: Any) -> int:
    try:
        return datetime_ms(at.at)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # promql-parser panics (a BaseException) on times before 1970
        raise PromQLError(
            "parse error: timestamp out of bounds for @ modifier", kind="bad_data"
        ) from None


def _go_f(value: float) -> str:
    """Go's ``%f``: six decimals, ``+Inf``/``-Inf``/``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:f}"
