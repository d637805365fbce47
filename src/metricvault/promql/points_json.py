"""A matrix series' points as Prometheus's JSON writes them, ``[<seconds>,"<value>"],...``:
each distinct timestamp array formatted once per answer, values a kind at a time, the
per-point work list fills in C (the query_range answer's writer, server/prometheus_json.py,
and the result cache's kept texts, result_cache.py, write the same bytes through these)."""

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
    """``<value>"]`` per value, formatted on first use (values repeat within and across
    series). 0.0 and -0.0 are one key, so series holding a negative zero take the slow path
    (:func:`points_one_by_one`)."""

    def __missing__(self, v: float) -> str:
        text = self[v] = format_value(v) + '"]'
        return text

    def of(self, vs: np.ndarray) -> list[str]:
        """The texts of ``vs``: of values that rarely repeat (a rate's, a quantile's) formatted
        together (:func:`tails_of`), else each distinct value once."""
        floats = vs.tolist()
        if len(set(floats[:_PROBE])) > _PROBE * 3 // 4:
            return tails_of(np.asarray(vs, dtype=np.float64))
        return list(map(self.__getitem__, floats))


_PROBE = 64  # the first values of a series that say whether its values repeat


class Grids(dict[bytes, list[str]]):
    """The heads of each distinct timestamp array (most series of an answer share the steps)."""

    def __init__(self, heads: Heads) -> None:
        super().__init__()
        self.heads = heads

    def of(self, ts: np.ndarray) -> list[str]:
        key = ts.dtype.char.encode() + ts.tobytes()
        found = self.get(key)
        if found is None:
            if self.heads:  # most of these known already (series over the same steps)
                found = list(map(self.heads.__getitem__, ts.tolist()))
            else:
                found = heads_of(ts)
                self.heads.update(zip(ts.tolist(), found, strict=True))
            self[key] = found
        return found


def heads_of(ts: np.ndarray) -> list[str]:
    """:class:`Heads`' text of each of these (int64 ms) timestamps, formatted in one pass:
    ``repr`` of the seconds (numpy's ``ts / 1000`` is Python's ``t / 1000``: both divide the
    exact float of ``t``, under 2**53, correctly rounded)."""
    return [",[" + text + ',"' for text in map(repr, (ts / 1000).tolist())]


def tails_of(vs: np.ndarray) -> list[str]:
    """``<value>"]`` for each of these values (no negative zero among them), formatted by
    kind in a few passes instead of one :func:`format_value` call each: whole numbers under
    1e16 as integers (what ``repr`` writes, without its ``.0``), other finite values from
    1e-4 to 1e16 as ``repr`` writes them (no exponent there, and no ``.0`` ending: a
    fraction's shortest digits are no whole number), the rest (NaN, ±Inf, exponents) one by
    one."""
    size = np.abs(vs)
    with np.errstate(invalid="ignore"):
        whole = (size < 1e16) & (vs == np.trunc(vs))
        plain = (size >= 1e-4) & (size < 1e16) & ~whole
    out = np.empty(vs.size, dtype=object)
    out[whole] = [text + '"]' for text in map(str, vs[whole].astype(np.int64).tolist())]
    out[plain] = [text + '"]' for text in map(repr, vs[plain].tolist())]
    rest = ~(whole | plain)
    if rest.any():
        out[rest] = [format_value(v) + '"]' for v in vs[rest].tolist()]
    return list(out.tolist())


def points_json(ts: np.ndarray, vs: np.ndarray, grids: Grids, values: Values) -> list[str]:
    """The pieces of a series' ``[<s>,"<v>"],...`` (joined, then the first comma cut):
    timestamp heads and value tails interleaved, so the per-point work is two list fills in C."""
    n = len(ts)
    parts: list[str] = [""] * (2 * n)
    parts[0::2] = grids.of(ts)
    parts[1::2] = values.of(vs)
    return parts


def has_negative_zero(vs: np.ndarray) -> bool:
    zero = vs == 0
    return bool(zero.any() and np.signbit(vs[zero]).any())


def points_one_by_one(ts: np.ndarray, vs: np.ndarray, heads: Heads) -> str:
    return "".join(
        heads[t] + format_value(v) + '"]' for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    )[1:]
