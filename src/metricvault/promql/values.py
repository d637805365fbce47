"""Values the evaluator passes around, and the query results it returns.

An instant vector is evaluated at every step at once: a :class:`StepVector` holds one row per
series and one column per step (``values`` and a ``present`` mask, since NaN is a value).
Label sets are sorted tuples of ``(name, value)`` pairs so they hash and compare cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from metricvault.errors import PromQLError

Labels = tuple[tuple[str, str], ...]
NAME = "__name__"


def make_labels(pairs: Iterable[tuple[str, str]]) -> Labels:
    return tuple(sorted((k, v) for k, v in pairs if v != ""))


def drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != NAME)


def get_label(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


def format_labels(labels: Labels) -> str:
    """Prometheus's ``labels.String()``: ``{a="x", b="y"}``."""
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


@dataclass
class StepVector:
    """An instant vector at every step: ``values``/``present`` have shape (series, steps)."""

    labels: list[Labels]
    values: np.ndarray
    present: np.ndarray
    sort_order: str | None = None  # "asc"/"desc" for sort()/sort_desc() (instant queries)

    @classmethod
    def empty(cls, n_steps: int) -> StepVector:
        return cls([], np.zeros((0, n_steps)), np.zeros((0, n_steps), dtype=bool))

    @property
    def n_steps(self) -> int:
        return int(self.values.shape[1])

    def select_rows(self, rows: np.ndarray | list[int]) -> StepVector:
        idx = np.asarray(rows, dtype=np.int64)
        return StepVector(
            [self.labels[i] for i in idx.tolist()], self.values[idx], self.present[idx]
        )

    def with_labels(self, labels: list[Labels], per_step: bool = True) -> StepVector:
        """The same rows under new label sets, rows that now share a label set merged; two of
        them present at one step (or, with ``per_step=False``, at all) is Prometheus's error."""
        return merge_rows(StepVector(labels, self.values, self.present), per_step)

    def drop_empty(self) -> StepVector:
        keep = np.flatnonzero(self.present.any(axis=1))
        return self if keep.size == len(self.labels) else self.select_rows(keep)


def per_series(
    rows: list[tuple[Labels, np.ndarray, np.ndarray]], n_steps: int, keep_name: bool = False
) -> StepVector:
    """A range function's answer from ``(labels, values, present)`` per input series: series
    present at no step left out, the metric name dropped unless ``keep_name``
    (``last_over_time``), and two series that become one label set an error."""
    kept = [(labels, v, ok) for labels, v, ok in rows if ok.any()]
    if not kept:
        return StepVector.empty(n_steps)
    labels = [lab if keep_name else drop_name(lab) for lab, _, _ in kept]
    values = np.array([v for _, v, _ in kept], dtype=np.float64)
    vec = StepVector(labels, values, np.array([ok for _, _, ok in kept], dtype=bool))
    return vec.with_labels(labels, per_step=False)


@dataclass
class Scalar:
    """A scalar at every step (here, not in eval, so that binary and functions, which eval
    imports, can build one without importing eval)."""

    values: np.ndarray


DUPLICATE_LABELSET = "vector cannot contain metrics with the same labelset"


def merge_rows(vec: StepVector, per_step: bool = True) -> StepVector:
    groups: dict[Labels, list[int]] = {}
    for i, labels in enumerate(vec.labels):
        groups.setdefault(labels, []).append(i)
    if len(groups) == len(vec.labels):
        return vec
    out_labels, out_values, out_present = [], [], []
    for labels, rows in groups.items():
        present = vec.present[rows]
        if len(rows) > 1:
            live = present.any(axis=1)
            clash = (present.sum(axis=0) > 1).any() if per_step else live.sum() > 1
            if clash:
                raise PromQLError(DUPLICATE_LABELSET)
        out_labels.append(labels)
        pick = np.argmax(present, axis=0)  # the row present at each step (0 if none)
        out_values.append(np.take_along_axis(vec.values[rows], pick[None, :], axis=0)[0])
        out_present.append(present.any(axis=0))
    return StepVector(out_labels, np.array(out_values), np.array(out_present, dtype=bool))


@dataclass
class RangeSeries:
    labels: Labels
    ts: np.ndarray
    values: np.ndarray


@dataclass
class RangeVector:
    """A range vector at every step: the samples of each series plus, per step, the window
    ``[starts, ends]`` (``lo``/``hi`` index each series's samples, ``hi`` exclusive)."""

    series: list[RangeSeries]
    starts: np.ndarray
    ends: np.ndarray
    range_ms: int
    left_open: bool = False
    bounds: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Prometheus 2.x windows are closed, [start, end]; Prometheus 3's are (start, end].
        left: Literal["left", "right"] = "right" if self.left_open else "left"
        self.bounds = [
            (
                np.asarray(np.searchsorted(s.ts, self.starts, side=left)),
                np.asarray(np.searchsorted(s.ts, self.ends, side="right")),
            )
            for s in self.series
        ]


# ------------------------------------------------------------------------------ results
def format_value(value: float) -> str:
    """Prometheus's text of a sample value (Go's ``FormatFloat(v, 'f', -1, 64)``):
    positional digits, the shortest that read back to the same float; NaN, +Inf, -Inf.
    ``repr`` gives those digits where it writes no exponent (fast: the JSON writer calls this
    once per distinct value), numpy where it would."""
    text = repr(value)
    if "e" in text or "n" in text:  # exponent, nan, inf
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return str(np.format_float_positional(value, unique=True, trim="-"))
    return text[:-2] if text.endswith(".0") else text


@dataclass
class QueryResult:
    """What a query returns. ``result_type`` is ``matrix``, ``vector``, ``scalar`` or
    ``string``; ``series`` holds ``(labels, timestamps_ms, values)`` per series (for a
    vector one sample each; for scalar/string a single unlabelled entry, ``text`` for a
    string)."""

    result_type: str
    series: list[tuple[dict[str, str], np.ndarray, np.ndarray]]
    text: str | None = None
    warnings: list[str] = field(default_factory=list)  # where the answer is approximate
    served_by: set[str] = field(default_factory=set)  # rollup tiers that answered (tiers.py)

    def to_prometheus(self) -> dict[str, Any]:
        """The ``data`` object of Prometheus's /api/v1/query(_range) answer."""
        if self.result_type == "string":
            t = int(self.series[0][1][0]) / 1000 if self.series else 0.0
            return {"resultType": "string", "result": [t, self.text]}
        if self.result_type == "scalar":
            _, ts, vs = self.series[0]
            return {
                "resultType": "scalar",
                "result": [int(ts[0]) / 1000, format_value(float(vs[0]))],
            }
        if self.result_type == "vector":
            return {
                "resultType": "vector",
                "result": [
                    {"metric": labels, "value": [int(ts[0]) / 1000, format_value(float(vs[0]))]}
                    for labels, ts, vs in self.series
                ],
            }
        return {
            "resultType": "matrix",
            "result": [
                {
                    "metric": labels,
                    "values": [
                        [t / 1000, format_value(v)]
                        for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
                    ],
                }
                for labels, ts, vs in self.series
            ],
        }
