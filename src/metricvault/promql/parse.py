"""Parsing with the ``promql-parser`` package (the Rust parser of the GreptimeDB project)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import promql_parser as pp

from metricvault.promql.errors import PromQLError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def parse(expr: str) -> Any:
    """The AST of ``expr``; a :class:`PromQLError` (bad_data) worded by the parser if not."""
    try:
        return pp.parse(expr)
    except ValueError as exc:
        raise PromQLError(f"parse error: {exc}", kind="bad_data") from exc


def duration_ms(delta: timedelta | None) -> int:
    if delta is None:
        return 0
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


def datetime_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(milliseconds=1)
