"""Parquet data files tuned for metrics, and their exact decoding.

Each float column ``X`` is stored as two physical columns: ``X_i`` (int64, the value times
``10**scale``, delta-encoded) when that is lossless, else ``X_f`` (float64, byte-stream-split).
``scale`` is chosen per series inside a file: the smallest power of ten that makes the series'
values exact integers. Decoding computes ``X_i / 10**scale`` in float64, which IEEE division
rounds to the same double the writer checked against, so the round trip is bit-exact.
Timestamps are delta-encoded; ``series_id`` and ``scale`` are run-length/dictionary encoded
because files are sorted by ``(series_id, ts)``; everything is zstd-compressed.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

MAX_SCALE = 9
_EXACT_LIMIT = 2.0**53
ROLLUP_FLOATS = ("sum", "min", "max", "first", "last", "increase", "m2")
RAW_FLOATS = ("value",)
ZSTD_LEVEL = 15  # a little smaller than 9 at small CPU cost: bench/encoding.py
# The flusher's files of a day still receiving data are merged by compaction (at ZSTD_LEVEL)
# once the day closes (they are far below ``compact_small_file_bytes``); written at a fast
# level, they cost the ingest path a fraction of level 15's CPU for a few percent more bytes
# until then. A flush into a closed day is written at ZSTD_LEVEL (``Vault._flush_level``).
FLUSH_ZSTD_LEVEL = 5  # as cheap as 1 here, 2 % smaller (1.057 vs 1.080 B/sample at 15: 1.022)
# Raw files: 256 Ki rows per row group; rollup rows are wider and read a few series at a time:
# 32 Ki rows (docs/decisions/0012: against 64 Ki, a fresh process's read of one series' day of
# 1m rows, 1,440 of a group's rows, takes ~2 ms less CPU, for 0.03-0.25 % more bytes).
ROW_GROUP_ROWS = {False: 256 * 1024, True: 32 * 1024}
# The layout version this writer records in each data file's key-value metadata
# (docs/decisions/0006). 1: files written before the key existed; 2: the sketch lists
# byte-stream-split; 3: also, in rollup files, ``first`` stored as ``first_d`` (its distance
# from the bucket's ``min``) where both are scaled integers, and ``sketch_counts`` without its
# last count (``sketch_counts_head``; the last is ``count`` less the others); 4: also each
# sketch's codes without its first and last (``sketch_keys_inner``) where those are the codes
# of the bucket's ``min`` and ``max``, as they are when the sketch holds its finite samples
# (docs/decisions/0011). Every version reads through :func:`decode`, which knows each by its
# physical columns. 5: also ``sum``, ``max`` and ``last`` as their distances from ``count x
# min`` and ``min`` (``sum_j``, ``max_j``, ``last_j``) where they and ``min`` are integers
# (docs/decisions/0011); the ``rollup_*`` SQL views decode them too.
FORMAT_KEY = b"metricvault.format"
FORMAT_VERSION = 5
# Raw files this writer writes (every version but 1) also record which series hold a NaN, ±Inf or
# staleness marker in the file (:func:`nonfinite_metadata`), so the rollup planner's finiteness
# test reads no page; files without the key are scanned (reader.Reader.all_finite): no version bump.
NONFINITE_KEY = b"metricvault.nonfinite"
# More series than this with odd values: the key is left out (the reader scans that file),
# which keeps every footer small (8 bytes an id, base64).
NONFINITE_MAX_IDS = 4096
# format 5's columns of rollup values stored as distances from ``min`` (times ``count`` for sum)
FROM_MIN = ("sum", "max", "last")
_LIST_ELEMENTS = ("sketch_keys", "sketch_keys_inner", "sketch_counts", "sketch_counts_head")


def _row_scales(values: np.ndarray) -> np.ndarray:
    """Smallest k <= MAX_SCALE with values exact at 10**k; MAX_SCALE + 1 where none is."""
    out = np.full(len(values), MAX_SCALE + 1, dtype=np.int8)
    todo = np.flatnonzero(np.isfinite(values))
    for k in range(MAX_SCALE + 1):
        if todo.size == 0:
            break
        v = values[todo]
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = np.round(v * 10.0**k)
            ok = (np.abs(scaled) < _EXACT_LIMIT) & (scaled / 10.0**k == v)
        out[todo[ok]] = k
        todo = todo[~ok]
    return out


def _series_scales(series_id: np.ndarray, row_scale: np.ndarray) -> np.ndarray:
    """Per row, the max of the exact rows' scales over its series (rows are sorted by series)."""
    exact = np.where(row_scale <= MAX_SCALE, row_scale, -1).astype(np.int8)
    starts = np.flatnonzero(np.r_[True, series_id[1:] != series_id[:-1]])
    per_series = np.maximum.reduceat(exact, starts) if len(exact) else exact
    lengths = np.diff(np.r_[starts, len(series_id)])
    return np.repeat(np.maximum(per_series, 0), lengths).astype(np.int8)


def encode(
    table: pa.Table, float_columns: Sequence[str], format_version: int = FORMAT_VERSION
) -> pa.Table:
    """Logical table (float64 columns) -> physical table (scaled ints + float fallbacks)."""
    sid = table.column("series_id").to_numpy()
    float_columns = [c for c in float_columns if c in table.column_names]
    arrays = {c: table.column(c).to_numpy(zero_copy_only=False) for c in float_columns}
    rollup = "count" in table.column_names
    if rollup:
        arrays = _elide_derivable(arrays, table.column("count").to_numpy())
    row_scale = np.zeros(len(sid), dtype=np.int8)
    for c in float_columns:
        vals = arrays[c]
        present = ~np.isnan(vals) if rollup else np.ones(len(vals), bool)
        rs = _row_scales(vals)
        row_scale = np.maximum(row_scale, np.where(present & (rs <= MAX_SCALE), rs, 0))
    scale = _series_scales(sid, row_scale) if len(sid) else row_scale
    cols: dict[str, pa.Array] = {}
    for name in table.column_names:
        if name not in float_columns:
            cols[name] = table.column(name).combine_chunks()
    cols["scale"] = pa.array(scale, pa.int8())
    for c in float_columns:
        cols[f"{c}_i"], cols[f"{c}_f"] = _split(arrays[c], scale, optional=rollup)
    if not rollup:
        cols["value_i"], cols["value_j"] = _split_by_shape(sid, cols["value_i"])
    elif format_version >= 3:
        _first_from_min(cols)
        _counts_but_last(cols)
        if format_version >= 4:
            _keys_within_bounds(cols, table)
        if format_version >= 5:
            _values_from_min(cols)
    return pa.table(cols)


def _min_reference(low: Any, count: Any, column: str) -> Any:
    """What ``column``'s integer is stored as a distance from: ``min``, or for ``sum``
    ``count x min`` where that is below 2**53 (else null: the sum stays whole)."""
    if column != "sum":
        return low
    bound = pc.multiply(pc.abs(pc.cast(low, pa.float64())), pc.cast(count, pa.float64()))
    product = pc.multiply(low, pc.cast(count, pa.int64()))
    return pc.if_else(pc.less(bound, _EXACT_LIMIT), product, pa.scalar(None, pa.int64()))


def _values_from_min(cols: dict[str, pa.Array]) -> None:
    """A bucket's ``max`` and ``last`` lie at or above its ``min``, and its ``sum`` at or
    above ``count x min``: as distances, they are smaller non-negative integers, which
    byte-stream-split and zstd store in fewer bytes (docs/decisions/0011). Exact: integers
    below 2**53."""
    if "min_i" not in cols:
        return
    for column in FROM_MIN:
        if f"{column}_i" not in cols:
            continue
        value = cols[f"{column}_i"]
        reference = _min_reference(cols["min_i"], cols["count"], column)
        both = pc.and_(pc.is_valid(value), pc.is_valid(reference))
        cols[f"{column}_i"] = pc.if_else(both, pa.scalar(None, pa.int64()), value)
        cols[f"{column}_j"] = pc.if_else(
            both, pc.subtract(value, reference), pa.scalar(None, pa.int64())
        )


def _absolute_from_min(table: pa.Table) -> pa.Table:
    for column in FROM_MIN:
        if f"{column}_j" not in table.column_names:
            continue
        reference = _min_reference(table.column("min_i"), table.column("count"), column)
        value = pc.coalesce(
            table.column(f"{column}_i"), pc.add(table.column(f"{column}_j"), reference)
        )
        index = table.column_names.index(f"{column}_i")
        table = table.set_column(index, f"{column}_i", value).drop_columns([f"{column}_j"])
    return table


def _first_from_min(cols: dict[str, pa.Array]) -> None:
    """A bucket's first sample lies between its min and max: as a distance from ``min`` it
    is a small non-negative integer, which byte-stream-split and zstd store in fewer bytes
    than the value itself (docs/decisions/0006). Exact: both are integers below 2**53."""
    if "first_i" not in cols:
        return
    first, low = cols["first_i"], cols["min_i"]
    both = pc.and_(pc.is_valid(first), pc.is_valid(low))
    cols["first_i"] = pc.if_else(both, pa.scalar(None, pa.int64()), first)
    cols["first_d"] = pc.if_else(both, pc.subtract(first, low), pa.scalar(None, pa.int64()))


def _absolute_first(table: pa.Table) -> pa.Table:
    if "first_d" not in table.column_names:
        return table
    from_min = pc.add(table.column("first_d"), table.column("min_i"))
    first = pc.coalesce(table.column("first_i"), from_min)
    index = table.column_names.index("first_i")
    return table.set_column(index, "first_i", first).drop_columns(["first_d"])


def _counts_but_last(cols: dict[str, pa.Array]) -> None:
    """Each sketch's counts add up to the bucket's ``count``, so its last count follows from
    the others; stored without it only when that holds for every row of the file."""
    if "sketch_counts" not in cols:
        return
    counts, keys = cols["sketch_counts"], cols["sketch_keys"]
    lengths = pc.fill_null(pc.list_value_length(counts), 0).to_numpy()
    key_lengths = pc.fill_null(pc.list_value_length(keys), 0).to_numpy()
    if not np.array_equal(lengths, key_lengths) or counts.null_count != keys.null_count:
        return
    values = pc.list_flatten(counts).to_numpy().astype(np.int64)
    ends = np.cumsum(lengths)
    sums = np.r_[0, np.cumsum(values)][ends] - np.r_[0, np.cumsum(values)][ends - lengths]
    held = lengths > 0
    if not np.array_equal(sums[held], cols["count"].to_numpy()[held]):
        return
    keep = np.ones(len(values), bool)
    keep[ends[held] - 1] = False
    head_offsets = np.r_[0, np.cumsum(lengths - held)].astype(np.int32)
    cols["sketch_counts_head"] = pa.ListArray.from_arrays(
        pa.array(head_offsets), pa.array(values[keep], pa.int32()), mask=pc.is_null(counts)
    )
    del cols["sketch_counts"]


def _full_counts(table: pa.Table) -> pa.Table:
    if "sketch_counts_head" not in table.column_names:
        return table
    head = table.column("sketch_counts_head").combine_chunks()
    keys = table.column("sketch_keys").combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(keys), 0).to_numpy()
    head_lengths = pc.fill_null(pc.list_value_length(head), 0).to_numpy()
    values = pc.list_flatten(head).to_numpy().astype(np.int64)
    ends = np.cumsum(head_lengths)
    sums = np.r_[0, np.cumsum(values)][ends] - np.r_[0, np.cumsum(values)][ends - head_lengths]
    short = lengths > head_lengths
    last = table.column("count").to_numpy()[short] - sums[short]
    full = np.insert(values, ends[short], last).astype(np.int32)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    counts = pa.ListArray.from_arrays(offsets, pa.array(full), mask=pc.is_null(head))
    index = table.column_names.index("sketch_counts_head")
    return table.set_column(index, "sketch_counts", counts)


def _bound_codes(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sketch codes of each row's ``min`` and ``max`` (finite values only)."""
    from metricvault.model import sketch_mapping

    mapping = sketch_mapping()
    return mapping.codes(low), mapping.codes(high)


def _keys_within_bounds(cols: dict[str, pa.Array], table: pa.Table) -> None:
    """A sketch's codes are sorted, so its first is the code of the bucket's smallest finite
    sample and its last that of the largest: where they are the codes of the row's ``min``
    and ``max`` (the writer checks each row), the row keeps only the codes between them, in
    ``sketch_keys_inner`` as gaps (each from the code before it, the first from ``min``'s);
    other rows keep theirs whole in ``sketch_keys``. Exact: decoding
    computes the same codes from the same (bit-exact) ``min`` and ``max``."""
    if "sketch_keys" not in cols or "min" not in table.column_names:
        return
    keys = cols["sketch_keys"]
    lengths = pc.fill_null(pc.list_value_length(keys), 0).to_numpy()
    codes = pc.list_flatten(keys).to_numpy()
    low = table.column("min").to_numpy(zero_copy_only=False)
    high = table.column("max").to_numpy(zero_copy_only=False)
    finite = np.isfinite(low) & np.isfinite(high) & (lengths > 0)
    low_code, high_code = _bound_codes(np.where(finite, low, 1.0), np.where(finite, high, 1.0))
    ends = np.cumsum(lengths)
    first = codes[np.minimum(ends - lengths, max(codes.size - 1, 0))] if codes.size else lengths
    last = codes[np.maximum(ends - 1, 0)] if codes.size else lengths
    two = low_code != high_code
    inner = finite & (first == low_code) & (last == high_code) & (two | (lengths == 1))
    if not inner.any():
        return
    owner = np.repeat(np.arange(len(lengths)), lengths)
    at = np.arange(codes.size) - np.repeat(ends - lengths, lengths)  # index within its row
    between = inner[owner] & (at > 0) & (at < lengths[owner] - 1)
    inner_lengths = np.where(inner, lengths - 1 - two, 0)
    whole = ~inner[owner]
    cols["sketch_keys"] = pa.ListArray.from_arrays(
        pa.array(np.r_[0, np.cumsum(np.where(inner, 0, lengths))].astype(np.int32)),
        pa.array(codes[whole], pa.int32()),
        mask=pa.array(inner | ~keys.is_valid().to_numpy(zero_copy_only=False)),
    )
    # each kept code as its distance from the one before it in the row (the first: from the
    # code of ``min``): small positive integers, which zstd stores in fewer bytes
    previous = np.r_[0, codes[:-1]].astype(np.int64)
    row_start = at == 1
    previous[row_start] = low_code[owner[row_start]]
    gaps = (codes.astype(np.int64) - previous)[between]
    cols["sketch_keys_inner"] = pa.ListArray.from_arrays(
        pa.array(np.r_[0, np.cumsum(inner_lengths)].astype(np.int32)),
        pa.array(gaps, pa.int32()),
        mask=pa.array(~inner),
    )


def _bounded_keys(columns: dict[str, pa.Array]) -> None:
    """Whole sketch codes again where a row keeps only those between its ``min`` and ``max``
    (:func:`_keys_within_bounds`); needs the decoded ``min`` and ``max``."""
    inner = columns.pop("sketch_keys_inner", None)
    if inner is None:
        return
    inner, whole = _one_array(inner), _one_array(columns["sketch_keys"])
    held = inner.is_valid().to_numpy(zero_copy_only=False)
    inner_lengths = pc.fill_null(pc.list_value_length(inner), 0).to_numpy()
    whole_lengths = pc.fill_null(pc.list_value_length(whole), 0).to_numpy()
    low = pc.fill_null(columns["min"], 1.0).to_numpy(zero_copy_only=False)
    high = pc.fill_null(columns["max"], 1.0).to_numpy(zero_copy_only=False)
    low_code, high_code = _bound_codes(np.where(held, low, 1.0), np.where(held, high, 1.0))
    two = held & (low_code != high_code)
    lengths = np.where(held, inner_lengths + 1 + two, whole_lengths)
    offsets = np.r_[0, np.cumsum(lengths)]
    out = np.empty(int(offsets[-1]), np.int32)
    rows = np.flatnonzero(~held)
    out[_spans(offsets[rows], whole_lengths[rows])] = pc.list_flatten(whole).to_numpy()
    rows = np.flatnonzero(held)
    out[offsets[rows]] = low_code[rows]
    gaps = pc.list_flatten(inner).to_numpy().astype(np.int64)
    if gaps.size:  # codes from their gaps: the code of min plus a running sum within the row
        run = np.cumsum(gaps)
        inner_offsets = np.r_[0, np.cumsum(inner_lengths[rows])]
        before = np.r_[0, run][inner_offsets[:-1]]
        base = low_code[rows].astype(np.int64) - before
        codes = run + np.repeat(base, inner_lengths[rows])
        out[_spans(offsets[rows] + 1, inner_lengths[rows])] = codes
    rows = np.flatnonzero(two)
    out[offsets[rows + 1] - 1] = high_code[rows]
    valid = held | whole.is_valid().to_numpy(zero_copy_only=False)
    columns["sketch_keys"] = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(out), mask=pa.array(~valid)
    )


def _one_array(column: Any) -> Any:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[k] .. starts[k] + lengths[k] - 1`` of every k, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    base = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return np.asarray(base + np.arange(total), np.int64)


def _split_by_shape(sid: np.ndarray, ints: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Route each series' scaled integers to the encoding that stores them smaller.

    Smooth series and counters have small deltas (``value_i``, DELTA_BINARY_PACKED); noisy
    series around a level are smaller as plain bytes split by significance (``value_j``,
    BYTE_STREAM_SPLIT). Measured by bench/encoding.py; see docs/decisions/0002."""
    values = ints.to_numpy(zero_copy_only=False)
    valid = ~np.isnan(values) if ints.null_count else np.ones(len(values), bool)
    whole = np.where(valid, values, 0).astype(np.int64)
    to_bss = np.zeros(len(whole), bool)
    if len(sid):
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        ends = np.r_[starts[1:], len(sid)]
        # each series' valid values, in one array: series k holds held[at[k]:at[k + 1]]
        at = np.r_[0, np.cumsum(valid)][np.r_[starts, len(sid)]]
        held = whole[valid] if ints.null_count else whole
        counts = np.diff(at)
        delta = _delta_bytes_each(held, at[:-1], counts)
        for k in np.flatnonzero(counts >= 64):
            if _bss_bytes(held[at[k] : at[k + 1]]) < delta[k]:
                to_bss[starts[k] : ends[k]] = True
    keep = valid & ~to_bss
    return pa.array(whole, mask=~keep), pa.array(whole, mask=~(valid & to_bss))


def _delta_bytes(x: np.ndarray) -> float:
    """Size estimate of DELTA_BINARY_PACKED: 32-value miniblocks bit-packed at the width of
    their (max - min) delta."""
    d = np.diff(x)
    blocks = d[: len(d) // 32 * 32].reshape(-1, 32)
    spread = (blocks.max(axis=1) - blocks.min(axis=1)).astype(np.float64)
    return float(np.ceil(np.log2(spread + 1)).sum() * 4 + len(blocks))


def _delta_bytes_each(x: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """:func:`_delta_bytes` of every run ``x[starts[k] : starts[k] + counts[k]]`` at once (the
    same figures: the flusher asks it of each series of a flush)."""
    blocks = np.maximum(counts - 1, 0) // 32  # whole miniblocks of each run's deltas
    out: np.ndarray = blocks.astype(np.float64)
    if not blocks.any():
        return out
    d = np.diff(x)  # d[i] = x[i + 1] - x[i]; a run's deltas start at its own start
    first = np.repeat(starts - np.r_[0, np.cumsum(blocks)[:-1] * 32], blocks * 32)
    rows = (np.arange(int(blocks.sum()) * 32) + first).reshape(-1, 32)
    spans = d[rows]
    spread = (spans.max(axis=1) - spans.min(axis=1)).astype(np.float64)
    bits = np.ceil(np.log2(spread + 1))
    owner = np.repeat(np.arange(len(counts)), blocks)
    out += np.bincount(owner, weights=bits, minlength=len(counts)) * 4
    return out


def _bss_bytes(x: np.ndarray) -> int:
    """Size estimate of BYTE_STREAM_SPLIT + zstd: compress the byte planes."""
    planes = np.ascontiguousarray(x.astype("<i8").view(np.uint8).reshape(-1, 8).T)
    return len(pa.compress(planes.tobytes(), "zstd", asbytes=True))


def _elide_derivable(arrays: dict[str, np.ndarray], count: np.ndarray) -> dict[str, np.ndarray]:
    """Null out rollup values that follow from others (restored by :func:`_restore_derivable`):
    a one-sample bucket's min, max, first and last equal its sum; a constant bucket's max,
    first and last equal its min. Sparse or idle series then cost little more in rollups than
    in raw."""
    out = {c: v.copy() for c, v in arrays.items()}
    single = count == 1
    constant = ~single & (arrays["min"] == arrays["max"])
    out["min"][single] = np.nan
    for column in ("max", "first", "last"):
        if column in out:
            out[column][single | constant] = np.nan
    if "m2" in out:  # no spread in a one-sample or constant bucket
        out["m2"][single | constant] = np.nan
    return out


def _restore_derivable(columns: dict[str, pa.Array]) -> None:
    # A bucket holding only NaN samples (count 0) has no min, max, first or last.
    held = pc.greater(columns["count"], 0)
    columns["min"] = pc.if_else(held, pc.coalesce(columns["min"], columns["sum"]), None)
    for column in ("max", "first", "last"):
        if column in columns:  # files older versions wrote have no first
            columns[column] = pc.if_else(held, pc.coalesce(columns[column], columns["min"]), None)
    if "m2" in columns:  # files older versions wrote have none: it stays unknown (null)
        columns["m2"] = pc.if_else(held, pc.coalesce(columns["m2"], 0.0), None)


def _split(vals: np.ndarray, scale: np.ndarray, optional: bool) -> tuple[pa.Array, pa.Array]:
    factor = 10.0 ** scale.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.round(vals * factor)
        exact = (np.abs(scaled) < _EXACT_LIMIT) & (scaled / factor == vals)
    exact &= ~(np.signbit(vals) & (vals == 0))  # keep -0.0 bit-exact in the float column
    missing = np.isnan(vals) if optional else np.zeros(len(vals), bool)
    ints = pa.array(np.where(exact, scaled, 0).astype(np.int64), mask=~exact | missing)
    floats = pa.array(vals, mask=exact | missing)
    return ints, floats


def decode_column(table: pa.Table, name: str) -> pa.Array:
    factor = pc.power(pa.scalar(10.0), pc.cast(table.column("scale"), pa.float64()))
    ints = table.column(f"{name}_i")
    if f"{name}_j" in table.column_names:
        ints = pc.coalesce(ints, table.column(f"{name}_j"))
    from_ints = pc.divide(pc.cast(ints, pa.float64()), factor)
    return pc.coalesce(table.column(f"{name}_f"), from_ints)


def decode(table: pa.Table, float_columns: Sequence[str]) -> pa.Table:
    table = _absolute_first(_absolute_from_min(table) if "count" in table.column_names else table)
    out = {
        c: table.column(c)
        for c in table.column_names
        if c != "scale" and not c.endswith(("_i", "_j", "_f"))
    }
    for c in float_columns:
        if f"{c}_f" in table.column_names:  # rollup files older versions wrote have no first
            out[c] = decode_column(table, c)
    if "count" in out:
        _restore_derivable(out)
        _bounded_keys(out)
    return _full_counts(pa.table(out)).combine_chunks()


def _column_encodings(physical: pa.Schema, rollup: bool) -> dict[str, str]:
    """Raw values change little from sample to sample, so their deltas are small; a rollup's
    min/max/sum/last jump more between minutes, and byte-stream-split then zstd stores them
    smaller than deltas (bench/encoding.py; docs/decisions/0002). The sketch lists' int32
    codes and counts are smaller byte-stream-split than dictionary-encoded, whose dictionary
    is rebuilt for every row group (docs/decisions/0006)."""
    enc = {}
    for f in physical:
        if f.name in ("ts", "first_ts", "last_ts") or (f.name.endswith("_i") and not rollup):
            enc[f.name] = "DELTA_BINARY_PACKED"
        elif f.name.endswith(("_f", "_i", "_j", "_d")):
            enc[f.name] = "BYTE_STREAM_SPLIT"
        elif f.name in _LIST_ELEMENTS:
            enc[f"{f.name}.list.element"] = "BYTE_STREAM_SPLIT"
    return enc


def nonfinite_metadata(table: pa.Table) -> dict[bytes, bytes]:
    """The key-value metadata of a raw file of ``table``'s rows: :data:`NONFINITE_KEY` with the
    sorted ids of the series that hold a NaN, ±Inf or staleness marker, as little-endian
    int64 in base64 (empty when none does). Nothing for rollup rows, or where more than
    :data:`NONFINITE_MAX_IDS` series hold one."""
    if "count" in table.column_names or "value" not in table.column_names:
        return {}
    odd = ~np.isfinite(table.column("value").to_numpy(zero_copy_only=False))
    if not odd.any():
        return {NONFINITE_KEY: b""}
    ids = np.unique(table.column("series_id").to_numpy()[odd])
    if len(ids) > NONFINITE_MAX_IDS:
        return {}
    return {NONFINITE_KEY: base64.b64encode(ids.astype("<i8").tobytes())}


def nonfinite_series(metadata: pq.FileMetaData) -> np.ndarray | None:
    """The sorted ids of the series holding a NaN, ±Inf or staleness marker in a raw file, as
    its writer recorded them (:func:`nonfinite_metadata`); None where the file has no such
    record (written before it, or with too many) or an unreadable one: the caller scans."""
    stored = (metadata.metadata or {}).get(NONFINITE_KEY)
    if stored is None:
        return None
    try:
        raw = base64.b64decode(stored, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) % 8:
        return None
    return np.frombuffer(raw, "<i8").astype(np.int64)


def format_version(metadata: pq.FileMetaData) -> int:
    """The layout version a data file was written with (1 for files from before versions)."""
    stored = (metadata.metadata or {}).get(FORMAT_KEY)
    return int(stored) if stored is not None else 1


def write_parquet(
    table: pa.Table,
    float_columns: Sequence[str],
    format_version: int = FORMAT_VERSION,
    zstd_level: int = ZSTD_LEVEL,
) -> bytes:
    """Encode and serialise a table sorted by ``(series_id, ts)``; returns the file bytes.
    ``format_version`` 1 writes the layout from before versions (benchmarks' "before");
    ``zstd_level`` only changes how hard the pages are compressed (any level reads the same)."""
    physical = encode(table, float_columns, format_version)
    rollup = "count" in table.column_names
    encodings = _column_encodings(physical.schema, rollup)
    if format_version == 1:
        encodings = {c: e for c, e in encodings.items() if "." not in c}
    else:
        stored = {FORMAT_KEY: str(format_version).encode(), **nonfinite_metadata(table)}
        physical = physical.replace_schema_metadata(stored)
    encoded = {name.split(".", 1)[0] for name in encodings}
    sink = io.BytesIO()
    pq.write_table(
        physical,
        sink,
        compression="zstd",
        compression_level=zstd_level,
        use_dictionary=[c for c in physical.column_names if c not in encoded],
        column_encoding=encodings,
        row_group_size=ROW_GROUP_ROWS[rollup],
        # value_f's null count tells a row group holds no NaN/Inf/staleness marker
        # (reader._all_null) without reading it
        write_statistics=["series_id", "ts", *({"value_f"} & set(physical.column_names))],
        write_page_index=False,
        write_page_checksum=True,
    )
    return sink.getvalue()


# Every read of a vault file verifies the CRC-32 of each page (written above): a flipped bit
# in a data page otherwise decodes, or decompresses, to a different but plausible value.
# DuckDB's own Parquet reader does not check page CRCs (measured with duckdb 1.x/2.0), so SQL
# reads the files through an Arrow dataset with these options instead (:func:`dataset`).
VERIFY: dict[str, Any] = {"page_checksum_verification": True}


def read_parquet(source: object, float_columns: Sequence[str], filters: object = None) -> pa.Table:
    table = pq.read_table(source, filters=filters, **VERIFY)
    return decode(table, float_columns)


def read_table(path: str, filesystem: pafs.FileSystem) -> pa.Table:
    """A whole vault file (series table, or a data file's physical columns), verified.
    ParquetFile, not pq.read_table: that imports pyarrow.dataset and with it pandas."""
    with filesystem.open_input_file(path) as handle:
        return pq.ParquetFile(handle, **VERIFY).read()


def read_table_columns(path: str, filesystem: pafs.FileSystem, columns: list[str]) -> pa.Table:
    """Some physical columns of a vault file, verified (other columns' pages are not read)."""
    with filesystem.open_input_file(path) as handle:
        return pq.ParquetFile(handle, **VERIFY).read(columns=columns)


def dataset(paths: list[str], filesystem: pafs.FileSystem) -> Any:
    """Vault files as an Arrow dataset (for DuckDB) whose scans verify page checksums."""
    import pyarrow.dataset as ds  # imported here: it pulls in pandas (see read_table)

    options = ds.ParquetFragmentScanOptions(**VERIFY)
    form = ds.ParquetFileFormat(default_fragment_scan_options=options)
    found = ds.dataset(paths, filesystem=filesystem, format=form)
    names = found.schema.names
    if "count" not in names:
        return found
    # The schema comes from one file; the views read format 5's columns of every rollup file
    # (null in files of earlier formats, which have none).
    extra = [pa.field(f"{c}_j", pa.int64()) for c in FROM_MIN if f"{c}_j" not in names]
    if not extra:
        return found
    schema = pa.schema([*found.schema, *extra])
    return ds.dataset(paths, filesystem=filesystem, format=form, schema=schema)


def sort_dedup(table: pa.Table) -> pa.Table:
    """Sort by ``(series_id, ts)`` and keep one row per key: the last one in input order.

    Callers concatenate in write order (buffer sequence, file id), so the last row is the
    latest write and wins, as in Prometheus and VictoriaMetrics.
    """
    if table.num_rows == 0:
        return table
    sid = table.column("series_id").to_numpy()
    ts = table.column("ts").to_numpy()
    if _strictly_sorted(sid, ts):
        return table
    idx = _by_series(table.column("series_id"), ts)
    if idx is None:
        idx = np.lexsort((ts, sid))  # stable: equal keys keep input order
    sid_s, ts_s = sid[idx], ts[idx]
    last_of_key = np.r_[(sid_s[1:] != sid_s[:-1]) | (ts_s[1:] != ts_s[:-1]), True]
    return table.take(pa.array(idx[last_of_key]))


def _by_series(series_id: pa.ChunkedArray, ts: np.ndarray) -> np.ndarray | None:
    """``np.lexsort((ts, series_id))`` where each series' rows already come in time order, as
    a flush's do (each request's batch holds ~1 sample per series, batches in write order):
    the series' ranks (a hash of the few distinct ids, then a sort of those) and a stable
    radix sort of those 16-bit ranks give the same order in a fraction of the time of the
    two 64-bit keys. None when it does not apply (more series, or a series out of order)."""
    codes = pc.dictionary_encode(series_id).combine_chunks()
    distinct = codes.dictionary.to_numpy()
    if len(distinct) > np.iinfo(np.uint16).max:
        return None
    rank = np.empty(len(distinct), np.uint16)
    rank[np.argsort(distinct)] = np.arange(len(distinct), dtype=np.uint16)
    ranks = rank[codes.indices.to_numpy()]
    idx = np.argsort(ranks, kind="stable")
    r, t = ranks[idx], ts[idx]
    return idx if bool(np.all((r[1:] != r[:-1]) | (t[1:] >= t[:-1]))) else None


def _strictly_sorted(sid: np.ndarray, ts: np.ndarray) -> bool:
    same = sid[1:] == sid[:-1]
    return bool(np.all(sid[1:] >= sid[:-1]) and np.all(~same | (ts[1:] > ts[:-1])))


def write_plain_parquet(table: pa.Table) -> bytes:
    """Small tables (the series table) with default encodings and zstd."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
    return sink.getvalue()
