"""Binary operators: scalar/scalar, vector/scalar and vector/vector with matching
(``on``/``ignoring``, ``group_left``/``group_right``, ``bool``) and the set operators
``and``/``or``/``unless`` — engine.go's VectorBinop, VectorscalarBinop, VectorAnd/Or/Unless."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import promql_parser as pp

from metricvault.errors import PromQLError
from metricvault.promql.values import (
    NAME,
    Labels,
    Scalar,
    StepVector,
    drop_name,
    format_labels,
    get_label,
    make_labels,
)

if TYPE_CHECKING:
    from metricvault.promql.eval import Evaluator

ARITHMETIC = {"+", "-", "*", "/", "%", "^", "atan2"}
# Prometheus 2.x keeps the metric name for atan2 (engine.go shouldDropMetricName).
DROPS_NAME = ARITHMETIC - {"atan2"}
COMPARISON = {"==", "!=", ">", "<", ">=", "<="}
SET_OPS = {"and", "or", "unless"}


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.power(a, b))


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.fmod(a, b))  # Go's math.Mod: the sign of the dividend, like C fmod


_OPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
    "%": _mod,
    "^": _pow,
    "atan2": np.arctan2,
    "==": np.equal,
    "!=": np.not_equal,
    ">": np.greater,
    "<": np.less,
    ">=": np.greater_equal,
    "<=": np.less_equal,
}


def apply(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(_OPS[op](a, b))


def evaluate(ev: Evaluator, node: Any, steps: np.ndarray) -> StepVector | Scalar:
    op = str(node.op)
    lhs = ev.eval(node.lhs, steps)
    rhs = ev.eval(node.rhs, steps)
    modifier = node.modifier
    return_bool = bool(modifier is not None and modifier.return_bool)
    if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
        out = apply(op, lhs.values, rhs.values)
        return Scalar(out.astype(np.float64))
    if isinstance(lhs, StepVector) and isinstance(rhs, Scalar):
        return _vector_scalar(op, lhs, rhs.values, False, return_bool)
    if isinstance(lhs, Scalar) and isinstance(rhs, StepVector):
        return _vector_scalar(op, rhs, lhs.values, True, return_bool)
    if isinstance(lhs, StepVector) and isinstance(rhs, StepVector):
        if op in SET_OPS:
            return _set_op(op, lhs, rhs, modifier)
        return _vector_vector(op, lhs, rhs, modifier, return_bool)
    raise PromQLError(f"binary operator {op!r} is not allowed between these types", "bad_data")


def _vector_scalar(
    op: str, vec: StepVector, scalar: np.ndarray, swap: bool, return_bool: bool
) -> StepVector:
    left, right = (scalar[None, :], vec.values) if swap else (vec.values, scalar[None, :])
    result = apply(op, left, right)
    present = vec.present.copy()
    if op in COMPARISON:
        keep = result.astype(bool)
        if return_bool:
            values = keep.astype(np.float64)
        else:
            values = vec.values
            present &= keep
    else:
        values = result.astype(np.float64)
    out = StepVector(vec.labels, np.array(values, dtype=np.float64), present)
    if op in DROPS_NAME or return_bool:
        return out.with_labels([drop_name(x) for x in vec.labels])
    return out


# ------------------------------------------------------------------------------ matching
def _signature(labels: Labels, on: bool, names: list[str]) -> Labels:
    if on:
        wanted = set(names)
        return tuple(p for p in labels if p[0] in wanted)
    dropped = {*names, NAME}
    return tuple(p for p in labels if p[0] not in dropped)


def _matching(modifier: Any) -> tuple[bool, list[str]]:
    matching = modifier.matching if modifier is not None else None
    if matching is None:
        return False, []
    return matching.type == pp.LabelModifierType.Include, list(matching.labels)


def _sig_codes(vec: StepVector, on: bool, names: list[str], table: dict[Labels, int]) -> np.ndarray:
    codes = np.empty(len(vec.labels), dtype=np.int64)
    for i, labels in enumerate(vec.labels):
        codes[i] = table.setdefault(_signature(labels, on, names), len(table))
    return codes


def _sig_present(codes: np.ndarray, present: np.ndarray, n_sigs: int) -> np.ndarray:
    counts = np.zeros((n_sigs, present.shape[1]), dtype=np.int64)
    np.add.at(counts, codes, present.astype(np.int64))
    return counts


def _set_op(op: str, lhs: StepVector, rhs: StepVector, modifier: Any) -> StepVector:
    on, names = _matching(modifier)
    table: dict[Labels, int] = {}
    lcodes = _sig_codes(lhs, on, names, table)
    rcodes = _sig_codes(rhs, on, names, table)
    n = len(table)
    if op == "and":
        rhs_has = _sig_present(rcodes, rhs.present, n) > 0
        return StepVector(lhs.labels, lhs.values, lhs.present & rhs_has[lcodes])
    if op == "unless":
        rhs_has = _sig_present(rcodes, rhs.present, n) > 0
        return StepVector(lhs.labels, lhs.values, lhs.present & ~rhs_has[lcodes])
    lhs_has = _sig_present(lcodes, lhs.present, n) > 0
    right = StepVector(rhs.labels, rhs.values, rhs.present & ~lhs_has[rcodes])
    merged = StepVector(
        lhs.labels + right.labels,
        np.concatenate([lhs.values, right.values]),
        np.concatenate([lhs.present, right.present]),
    )
    return merged.with_labels(merged.labels)


def _vector_vector(
    op: str, lhs: StepVector, rhs: StepVector, modifier: Any, return_bool: bool
) -> StepVector:
    card = modifier.card if modifier is not None else pp.VectorMatchCardinality.OneToOne
    on, names = _matching(modifier)
    include = list(modifier.group_labels or []) if modifier is not None else []
    one_to_many = card == pp.VectorMatchCardinality.OneToMany
    many, one = (rhs, lhs) if one_to_many else (lhs, rhs)
    table: dict[Labels, int] = {}
    many_codes = _sig_codes(many, on, names, table)
    one_codes = _sig_codes(one, on, names, table)
    n_sigs, n_steps = len(table), lhs.n_steps
    # Prometheus checks nothing at a step where either side is empty.
    live = np.asarray(many.present.any(axis=0) & one.present.any(axis=0))
    _check_unique_one_side(one, one_codes, n_sigs, on, names, one_to_many, live)
    # The one side's row for each signature at each step (-1: none).
    one_row = np.full((n_sigs, n_steps), -1, dtype=np.int64)
    for r, code in enumerate(one_codes.tolist()):
        one_row[code, one.present[r]] = r
    matched_row = one_row[many_codes]  # (many rows, steps)
    matched = many.present & (matched_row >= 0)
    safe = np.maximum(matched_row, 0)
    one_values = one.values[safe, np.arange(n_steps)[None, :]] if len(one.labels) else safe * 0.0
    left, right = (one_values, many.values) if one_to_many else (many.values, one_values)
    result = apply(op, left, right)
    if op in COMPARISON:
        keep = result.astype(bool)
        values = keep.astype(np.float64) if return_bool else left.astype(np.float64)
        if not return_bool:
            matched &= keep
    else:
        values = result.astype(np.float64)
    return _assemble(op, many, one, matched, matched_row, values, card, on, names, include,
                     return_bool, many_codes)  # fmt: skip


def _check_unique_one_side(
    one: StepVector, codes: np.ndarray, n_sigs: int, on: bool, names: list[str], swapped: bool,
    live: np.ndarray,
) -> None:  # fmt: skip
    counts = _sig_present(codes, one.present & live[None, :], n_sigs)
    if not (counts > 1).any():
        return
    sig, step = np.argwhere(counts > 1)[0]
    rows = [r for r in np.flatnonzero(codes == sig) if one.present[r, step]][:2]
    side = "left" if swapped else "right"
    group = format_labels(_signature(one.labels[rows[0]], on, names))
    raise PromQLError(
        f"found duplicate series for the match group {group} on the {side} hand-side of the "
        f"operation: [{format_labels(one.labels[rows[1]])}, {format_labels(one.labels[rows[0]])}]"
        ";many-to-many matching not allowed: matching labels must be unique on one side"
    )


def _result_labels(
    many: Labels, one: Labels, op: str, card: Any, on: bool, names: list[str],
    include: list[str], return_bool: bool,
) -> Labels:  # fmt: skip
    labels = dict(many)
    if op in DROPS_NAME or return_bool:
        labels.pop(NAME, None)
    if card == pp.VectorMatchCardinality.OneToOne:
        if on:
            labels = {k: v for k, v in labels.items() if k in names}
        else:
            for name in names:
                labels.pop(name, None)
    for name in include:
        value = get_label(one, name)
        if value:
            labels[name] = value
        else:
            labels.pop(name, None)
    return make_labels(labels.items())


def _assemble(
    op: str, many: StepVector, one: StepVector, matched: np.ndarray, matched_row: np.ndarray,
    values: np.ndarray, card: Any, on: bool, names: list[str], include: list[str],
    return_bool: bool, many_codes: np.ndarray,
) -> StepVector:  # fmt: skip
    n_steps = many.n_steps
    if not matched.any():
        return StepVector.empty(n_steps)
    n_one = max(len(one.labels), 1)
    pair = np.where(matched, np.arange(len(many.labels))[:, None] * n_one + matched_row, -1)
    pairs = np.unique(pair[pair >= 0])
    out_labels: list[Labels] = []
    out_values = np.zeros((pairs.size, n_steps))
    out_present = np.zeros((pairs.size, n_steps), dtype=bool)
    for k, code in enumerate(pairs.tolist()):
        m, o = divmod(code, n_one)
        cells = pair[m] == code
        out_present[k] = cells
        out_values[k, cells] = values[m, cells]
        out_labels.append(
            _result_labels(many.labels[m], one.labels[o], op, card, on, names, include, return_bool)
        )
    _check_matches(pairs // n_one, out_labels, out_present, many_codes, card)
    return StepVector(out_labels, out_values, out_present).with_labels(out_labels)


def _check_matches(
    many_rows: np.ndarray, labels: list[Labels], present: np.ndarray, many_codes: np.ndarray,
    card: Any,
) -> None:  # fmt: skip
    sigs = many_codes[many_rows]
    if card == pp.VectorMatchCardinality.OneToOne:
        counts = _sig_present(sigs, present, int(sigs.max()) + 1)
        if (counts > 1).any():
            raise PromQLError(
                "multiple matches for labels: many-to-one matching must be explicit "
                "(group_left/group_right)"
            )
        return
    keyed: dict[tuple[int, Labels], list[int]] = {}
    for k, (sig, lab) in enumerate(zip(sigs.tolist(), labels, strict=True)):
        keyed.setdefault((sig, lab), []).append(k)
    for rows in keyed.values():
        if len(rows) > 1 and (present[rows].sum(axis=0) > 1).any():
            raise PromQLError(
                "multiple matches for labels: grouping labels must ensure unique matches"
            )
