"""A matrix series' points as Prometheus's JSON writes them, ``[<seconds>,"<value>"],...``:
each distinct timestamp and value formatted once per answer, the per-point work list fills
in C (the query_range answer's writer, server/prometheus_json.py, and the result cache's
kept texts, result_cache.py, write the same bytes through these)."""

from __future__ import annotations

import numpy as np

from metricvault.promql.values import format_value


class Heads(dict[int, str]):
    """``,[<seconds>,"`` per timestamp, formatted on first use (the steps repeat across
    series); the leading comma separates a point from the one before (the first point's is cut)."""

    def __missing__(self, t: int) -> str:
        text = self[t] = ",[" + repr(t / 1000) + ',"'
        return text


class Values(dict[float, str]):
    """``<value>"]`` per value, formatted on first use. 0.0 and -0.0 are one key, so series
    holding a negative zero take the slow path (:func:`points_one_by_one`)."""

    def __missing__(self, v: float) -> str:
        text = self[v] = format_value(v) + '"]'
        return text


class Grids(dict[bytes, list[str]]):
    """The heads of each distinct timestamp array (most series of an answer share the steps)."""

    def __init__(self, heads: Heads) -> None:
        super().__init__()
        self.heads = heads

    def of(self, ts: np.ndarray) -> list[str]:
        key = ts.dtype.char.encode() + ts.tobytes()
        found = self.get(key)
        if found is None:
            found = self[key] = list(map(self.heads.__getitem__, ts.tolist()))
        return found


def points_json(ts: np.ndarray, vs: np.ndarray, grids: Grids, values: Values) -> list[str]:
    """The pieces of a series' ``[<s>,"<v>"],...`` (joined, then the first comma cut):
    timestamp heads and value tails interleaved, so the per-point work is two list fills in C."""
    n = len(ts)
    parts: list[str] = [""] * (2 * n)
    parts[0::2] = grids.of(ts)
    parts[1::2] = map(values.__getitem__, vs.tolist())
    return parts


def has_negative_zero(vs: np.ndarray) -> bool:
    zero = vs == 0
    return bool(zero.any() and np.signbit(vs[zero]).any())


def points_one_by_one(ts: np.ndarray, vs: np.ndarray, heads: Heads) -> str:
    return "".join(
        heads[t] + format_value(v) + '"]' for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    )[1:]
