"""A matrix series' points as Prometheus's JSON writes them, ``[<seconds>,"<value>"],...``:
each distinct timestamp array formatted once per answer (whole seconds as a character
matrix), each distinct value once where an answer's values repeat, else a kind at a time;
the per-point work is list fills in C (the query_range answer's writer,
server/prometheus_json.py, and the result cache's kept texts, result_cache.py, write the same
bytes through :func:`format_series`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.promql.values import format_value


class Heads(dict[int, str]):
    """``,[<seconds>,"`` per timestamp, formatted on first use (the steps repeat across
    series); the leading comma separates a point from the one before (the first point's is cut)."""

    def __missing__(self, t: int) -> str:
        text = self[t] = ",[" + repr(t / 1000) + ',"'
        return text


class Grids(dict[bytes, list[str]]):
    """The heads of each distinct timestamp array (most series of an answer share the steps)."""

    def __init__(self, heads: Heads) -> None:
        super().__init__()
        self.heads = heads
        self._lengths: dict[int, np.ndarray] = {}  # by id of the list :meth:`of` returned

    def lengths(self, ts: np.ndarray, heads: list[str]) -> np.ndarray:
        """The length of each of ``heads`` (what :meth:`of` returned for ``ts``), computed
        once per distinct timestamp array."""
        found = self._lengths.get(id(heads))
        if found is None:
            found = self._lengths[id(heads)] = np.fromiter(map(len, heads), np.int64, ts.size)
        return found

    def of(self, ts: np.ndarray) -> list[str]:
        key = ts.dtype.char.encode() + ts.tobytes()
        found = self.get(key)
        if found is None:
            found = _whole_second_heads(ts)
            if found is None and self.heads:  # most of these known already (same steps)
                found = list(map(self.heads.__getitem__, ts.tolist()))
            elif found is None:
                found = heads_of(ts)
                self.heads.update(zip(ts.tolist(), found, strict=True))
            self[key] = found
        return found


def heads_of(ts: np.ndarray) -> list[str]:
    """:class:`Heads`' text of each of these (int64 ms) timestamps, formatted in one pass:
    ``repr`` of the seconds (numpy's ``ts / 1000`` is Python's ``t / 1000``: both divide the
    exact float of ``t``, under 2**53, correctly rounded)."""
    fast = _whole_second_heads(ts)
    if fast is not None:
        return fast
    return [",[" + text + ',"' for text in map(repr, (ts / 1000).tolist())]


_POWERS = 10 ** np.arange(18, -1, -1, dtype=np.int64)
_WHOLE_MIN = 16  # fewer timestamps: one by one is as quick


def _whole_second_heads(ts: np.ndarray) -> list[str] | None:
    """:func:`heads_of` where every timestamp is a whole second after the epoch and all have
    the same number of digits (Grafana's steps, its ranges aligned to them): ``repr`` of such
    seconds is their digits and ``.0``, so each head is written as a row of a character
    matrix, digits by integer arithmetic, and numpy makes the strings. None otherwise."""
    if ts.size < _WHOLE_MIN:
        return None
    seconds, millis = np.divmod(ts, 1000)
    first, last = int(seconds.min()), int(seconds.max())
    if first <= 0 or millis.any():
        return None
    digits = len(str(last))
    if len(str(first)) != digits:
        return None
    rows = np.empty((ts.size, digits + 6), np.uint32)
    rows[:, :2] = (ord(","), ord("["))
    rows[:, 2 : 2 + digits] = seconds[:, None] // _POWERS[-digits:] % 10 + ord("0")
    rows[:, 2 + digits :] = (ord("."), ord("0"), ord(","), ord('"'))
    heads: list[str] = rows.view(f"U{digits + 6}").ravel().tolist()
    return heads


def tails_of(vs: np.ndarray) -> list[str]:
    """``<value>"]`` for each of these values (no negative zero among them), formatted by
    kind in a few passes instead of one :func:`format_value` call each: whole numbers under
    1e16 as integers (what ``repr`` writes, without its ``.0``), other finite values from
    1e-4 to 1e16 as ``repr`` writes them (no exponent there, and no ``.0`` ending: a
    fraction's shortest digits are no whole number; below 1e10 by Arrow's cast, which writes
    the same text: :func:`arrow_writes_repr`), the rest (NaN, ±Inf, exponents) one by one."""
    size = np.abs(vs)
    with np.errstate(invalid="ignore"):
        whole = (size < 1e16) & (vs == np.trunc(vs))
        plain = (size >= 1e-4) & (size < 1e16) & ~whole
    out = np.empty(vs.size, dtype=object)
    out[whole] = [text + '"]' for text in map(str, vs[whole].astype(np.int64).tolist())]
    short = plain & (size < ARROW_BELOW) if arrow_writes_repr() else np.zeros(vs.size, bool)
    if short.any():  # Arrow's shortest digits: repr's there (5,764 rates: 1.5 ms, repr 4.3)
        texts = pc.binary_join_element_wise(pc.cast(pa.array(vs[short]), pa.string()), '"]', "")
        out[short] = texts.to_numpy(zero_copy_only=False)  # (to_pylist: 4x slower)
    plain &= ~short
    out[plain] = [text + '"]' for text in map(repr, vs[plain].tolist())]
    rest = ~(whole | plain | short)
    if rest.any():
        out[rest] = [format_value(v) + '"]' for v in vs[rest].tolist()]
    return list(out.tolist())


# Arrow's cast of a float64 to a string writes the shortest digits that read back to it,
# positionally from 1e-4 up to (not including) 1e10, exponents from there: there its text is
# repr's, byte for byte (282,250 random values compared; checked once a process against
# probes of every decade, and by tests/unit/test_promql_points_json.py), at ~110 ns a value
# against repr's ~550 (and its list's) on the bench machine
ARROW_BELOW = 1e10
_ARROW_CHECKED: list[bool] = []


def arrow_writes_repr() -> bool:
    """Whether this pyarrow's float-to-string cast writes repr's text below
    :data:`ARROW_BELOW` (probed on first use: values of every decade, both signs, and
    ones whose shortest digits are long); else repr writes them all."""
    if not _ARROW_CHECKED:
        rng = np.random.default_rng(0)
        decades = 10.0 ** np.arange(-4, 10, dtype=np.float64)
        probes = np.concatenate([
            decades * 1.5, decades * (1 + 2**-52), decades * 0.3 * 10, 1 / 3 * decades,
            rng.random(2_000) * 10.0 ** rng.integers(-4, 10, 2_000),
        ])  # fmt: skip
        probes = np.concatenate([probes, -probes])
        probes = probes[(np.abs(probes) >= 1e-4) & (np.abs(probes) < ARROW_BELOW)]
        probes = probes[probes != np.trunc(probes)]
        cast = pc.cast(pa.array(probes), pa.string()).to_pylist()
        _ARROW_CHECKED.append(cast == list(map(repr, probes.tolist())))
    return _ARROW_CHECKED[0]


_PROBE = 256  # values sampled across an answer to see whether they repeat


def value_tails(vs: np.ndarray) -> list[str]:
    """``<value>"]`` for each of these values (no negative zero among them). Where they
    repeat (utilisations, averages of a few integers, counts) each distinct value is
    formatted once and the texts taken by index (Arrow's hash-based dictionary encoding: a
    sort, as ``np.unique`` does, cost more than the formatting it saved); values that rarely
    repeat (rates, quantiles) go to :func:`tails_of` without it."""
    if vs.size > _PROBE:
        sample = vs[:: vs.size // _PROBE]
        if np.unique(sample).size <= sample.size * 9 // 10:
            encoded = pc.dictionary_encode(pa.array(vs, pa.float64()))
            distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
            if distinct.size * 2 <= vs.size:
                texts = np.array(tails_of(distinct), dtype=object)
                tails: list[str] = texts[encoded.indices.to_numpy()].tolist()
                return tails
    return tails_of(vs)


def format_series(
    items: Sequence[tuple[np.ndarray, np.ndarray]], with_starts: bool = False
) -> list[tuple[str, np.ndarray | None]]:
    """Each series' ``[<s>,"<v>"],...`` (timestamps in ms, values) and, ``with_starts``, the
    offset of each point in that text (n + 1 of them: the last is the text's length + 1).
    The series of an answer are formatted together: their timestamp arrays through one
    :class:`Grids`, their values in one :func:`value_tails`."""
    heads = Heads()
    grids = Grids(heads)
    out: list[tuple[str, np.ndarray | None]] = []
    regular: list[int] = []
    held = [np.asarray(vs, dtype=np.float64) for ts, vs in items if len(ts)]
    # one test of every value: a negative zero is rare, and each series' own test cost a
    # few numpy calls (most of the work for a refresh's few points of many series)
    any_negative_zero = bool(held) and has_negative_zero(np.concatenate(held))
    for ts, vs in items:
        if not len(ts):
            out.append(("", np.zeros(1, np.int64) if with_starts else None))
        elif any_negative_zero and has_negative_zero(vs):  # one value with 0.0 in value_tails
            out.append(_one_by_one(ts, vs, heads, with_starts))
        else:
            regular.append(len(out))
            out.append(("", None))  # written below
    if not regular:
        return out
    values = np.concatenate([np.asarray(items[i][1], dtype=np.float64) for i in regular])
    tails = value_tails(values)
    tail_lengths = np.fromiter(map(len, tails), np.int64, len(tails)) if with_starts else None
    at = 0
    for i in regular:
        ts = items[i][0]
        n = len(ts)
        parts: list[str] = [""] * (2 * n)
        parts[0::2] = series_heads = grids.of(ts)
        parts[1::2] = tails[at : at + n]
        starts = None
        if tail_lengths is not None:  # each point's length with its comma, summed up
            lengths = grids.lengths(ts, series_heads) + tail_lengths[at : at + n]
            starts = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=starts[1:])
        at += n
        out[i] = ("".join(parts)[1:], starts)
    return out


def _one_by_one(
    ts: np.ndarray, vs: np.ndarray, heads: Heads, with_starts: bool
) -> tuple[str, np.ndarray | None]:
    """A series' points one at a time (the path of a series holding a negative zero)."""
    pieces = [
        heads[t] + format_value(v) + '"]' for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    ]
    return "".join(pieces)[1:], _starts(pieces, 1) if with_starts else None


def _starts(parts: list[str], per_point: int) -> np.ndarray:
    """Where each point starts in the joined text (its first comma cut), from its pieces."""
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    lengths = lengths.reshape(-1, per_point).sum(axis=1)
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])  # each point's length with the comma before it
    return starts


def has_negative_zero(vs: np.ndarray) -> bool:
    zero = vs == 0
    return bool(zero.any() and np.signbit(vs[zero]).any())
