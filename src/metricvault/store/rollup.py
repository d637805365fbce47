"""Rollup math: per-bucket ``count, sum, min, max, first, last`` (with the times of the first
and last sample), ``nonfinite`` and, for counters, ``increase``.

``increase`` of a bucket is the sum, over the bucket's samples, of the rise from the sample
before (which may sit in an earlier bucket, at most ``lookback`` earlier); a drop is a counter
reset and counts the new value in full. Summing bucket increases therefore equals the increase
computed over the raw samples of the whole span, at any resolution — which is what lets
queries switch tiers without changing answers.

The same "partial" shape (``series_id, ts, count, sum, min, max, first, first_ts, last,
last_ts, increase, nonfinite``) comes from raw samples and from stored rollups, so a query can
combine segments from different tiers by summing counts/sums/increases, taking min/max, the
``first`` of the earliest ``first_ts`` and the ``last`` of the latest ``last_ts``. The first and
last samples (value and time) are what PromQL's ``rate`` extrapolation and its closed windows
need to be answered exactly from rollups (promql/tiers.py; docs/decisions/0003).

Non-finite samples (NaN, ±Inf and Prometheus staleness markers, stored as values since PromQL
needs them) are left out of rollups: ``count`` counts finite samples, ``sum/min/max/last`` are
over them, and a counter's ``increase`` runs from one finite sample to the next finite one
(a NaN between two samples neither resets nor adds). A bucket holding no finite sample has no
rollup row for aggregate queries, exactly as if those samples had never been written. Raw reads
keep them. ``nonfinite`` counts a bucket's NaN and ±Inf samples (not staleness markers), so
PromQL, where a NaN sample is a value, knows when a window cannot be answered from rollups; a
bucket holding only such samples is stored as a row with ``count`` 0, which aggregate queries
leave out (:func:`finite_rows`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.model import STALE_NAN_BITS, sketch_mapping

if TYPE_CHECKING:  # imported on first use: `metricvault stats` and `series` never need DuckDB
    import duckdb

PARTIAL_COLUMNS = (
    "series_id", "ts", "count", "sum", "min", "max", "first", "first_ts", "last", "last_ts",
    "increase", "nonfinite", "m2", "sketch_keys", "sketch_counts",
)  # fmt: skip
SKETCH_COLUMNS = ("sketch_keys", "sketch_counts")
ROLLUP_COLUMNS = PARTIAL_COLUMNS  # a stored row is a partial: buckets merge across files

_local = threading.local()


def connection() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB connection per thread (connections are not thread-safe)."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb

        con = duckdb.connect(config={"threads": 2})
        _local.con = con
    return con


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` and return an Arrow table (DuckDB 2.0 renamed ``arrow()`` to
    ``to_arrow_table()``; the relation API avoids the extra copy the DB-API path makes)."""
    relation = con.sql(sql)
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
    return fetch()


def _bucket_sql(origin: int, width: int) -> str:
    return f"({origin} + ((ts - {origin}) // {width}) * {width})::BIGINT"


def raw_partials(
    samples: pa.Table,
    counters: pa.Array,
    *,
    width: int,
    origin: int,
    since: int,
    until: int,
    lookback: int,
    sketch: bool = False,
) -> pa.Table:
    """Partials per (series, bucket) from deduplicated raw samples.

    ``samples`` may start up to ``lookback`` before ``since`` so that counters find the sample
    before their first bucket; only samples in ``[since, until)`` are aggregated. Non-finite
    samples are skipped (see the module docstring). ``sketch``: also each bucket's quantile
    sketch (stored rows have one; query-time partials only where a quantile is asked for).
    """
    value = samples.column("value")
    parts = []
    nonfinite = False
    if samples.num_rows and not pc.all(pc.is_finite(value)).as_py():
        parts.append(_nonfinite_partials(samples, width, origin, since, until))
        nonfinite = True
        samples = samples.filter(pc.is_finite(value))
    is_counter = pc.is_in(samples.column("series_id"), value_set=counters)
    gauges = samples.filter(pc.invert(is_counter))
    counter_rows = samples.filter(is_counter)
    con = connection()
    bucket = _bucket_sql(origin, width)
    common = f"""SELECT series_id, {bucket} AS ts, count(*)::BIGINT AS count,
                    fsum(value) AS sum, min(value) AS min, max(value) AS max,
                    arg_min(value, ts) AS first, min(ts)::BIGINT AS first_ts,
                    arg_max(value, ts) AS last, max(ts)::BIGINT AS last_ts,
                    var_pop(value) * count(*) AS m2"""
    if gauges.num_rows:
        con.register("g", gauges)
        parts.append(
            fetch_arrow(
                con,
                f"""{common}, NULL::DOUBLE AS increase, 0::BIGINT AS nonfinite
                FROM g WHERE ts >= {since} AND ts < {until} GROUP BY 1, 2""",
            )
        )
        con.unregister("g")
    if counter_rows.num_rows:
        con.register("c", counter_rows)
        parts.append(
            fetch_arrow(
                con,
                f"""WITH s AS (
                    SELECT series_id, ts, value,
                        lag(value) OVER w AS pv, lag(ts) OVER w AS pts
                    FROM c WINDOW w AS (PARTITION BY series_id ORDER BY ts))
                {common},
                    fsum(CASE WHEN pv IS NULL OR ts - pts > {lookback} THEN 0
                              WHEN value >= pv THEN value - pv ELSE value END) AS increase,
                    0::BIGINT AS nonfinite
                FROM s WHERE ts >= {since} AND ts < {until} GROUP BY 1, 2""",
            )
        )
        con.unregister("c")
    # Gauges and counters are different series: only NaN rows can share a bucket with others.
    out = combine(parts) if nonfinite else _concat(parts)
    if sketch and samples.num_rows:
        out = _with_sketches(out, _raw_sketches(con, samples, bucket, since, until))
    return out


# ---------------------------------------------------------------- quantile sketches
def row_quantiles(keys: pa.Array | pa.ChunkedArray, counts: pa.Array | pa.ChunkedArray, q: float,
                  expected: np.ndarray | None = None) -> pa.Array:  # fmt: skip
    """:func:`sketch_quantile` of every row's sketch at once (codes sorted within each row,
    as stored and merged); null where a row has no sketch, or (``expected``, the rows'
    ``count``) one covering fewer samples than the row holds."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    counts = counts.combine_chunks() if isinstance(counts, pa.ChunkedArray) else counts
    rows = len(keys)
    codes = np.asarray(pc.list_flatten(keys).to_numpy(), dtype=np.int64)
    weights = np.asarray(pc.list_flatten(counts).to_numpy(), dtype=np.float64)
    parent = np.asarray(pc.list_parent_indices(keys).to_numpy(), dtype=np.int64)
    per_row = np.bincount(parent, weights=weights, minlength=rows)
    missing = np.asarray(keys.is_null().to_numpy(zero_copy_only=False)) | (per_row == 0)
    if expected is not None:
        missing |= per_row != expected
    out = np.full(rows, np.nan)
    if codes.size:
        cum = np.cumsum(weights)
        first = np.searchsorted(parent, np.arange(rows))  # each row's first entry
        last = np.searchsorted(parent, np.arange(rows), side="right") - 1
        before = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0.0)
        qq = min(max(q, 0.0), 1.0)
        at = np.searchsorted(cum, before + qq * (per_row - 1), side="right")
        at = np.clip(at, first, np.maximum(last, first))
        ok = ~missing
        out[ok] = sketch_mapping().values(codes[np.minimum(at[ok], codes.size - 1)])
        if q < 0 or q > 1:
            out[ok] = np.inf if q > 1 else -np.inf
    return pa.array(out, mask=missing)


def _raw_sketches(
    con: duckdb.DuckDBPyConnection, samples: pa.Table, bucket: str, since: int, until: int
) -> pa.Table:
    """``series_id, ts, sketch_keys, sketch_counts`` per bucket of finite samples."""
    con.register("k", samples.select(["series_id", "ts", "value"]))
    code = sketch_mapping().sql("value")
    table = fetch_arrow(
        con,
        f"""WITH c AS (
            SELECT series_id, {bucket} AS ts, {code} AS code, count(*)::INTEGER AS n
            FROM k WHERE ts >= {since} AND ts < {until} GROUP BY 1, 2, 3)
        SELECT series_id, ts, list(code ORDER BY code) AS sketch_keys,
            list(n ORDER BY code) AS sketch_counts
        FROM c GROUP BY 1, 2""",
    )
    con.unregister("k")
    return table


def _with_sketches(partials: pa.Table, sketches: pa.Table) -> pa.Table:
    """``partials`` with the sketch of each bucket ``sketches`` holds (others: null)."""
    if sketches.num_rows == 0 or partials.num_rows == 0:
        return partials
    key = _row_keys(partials["series_id"], partials["ts"])
    skey = _row_keys(sketches["series_id"], sketches["ts"])
    order = np.argsort(skey, kind="stable")
    pos = np.searchsorted(skey[order], key)
    pos = np.minimum(pos, order.size - 1)
    found = skey[order][pos] == key
    take = pa.array(np.where(found, order[pos], 0), mask=~found)
    for name in SKETCH_COLUMNS:
        column = sketches[name].combine_chunks().cast(pa.list_(pa.int32())).take(take)
        partials = partials.set_column(partials.schema.get_field_index(name), name, column)
    return partials


def _row_keys(series_id: pa.ChunkedArray | pa.Array, ts: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One sortable key per (series, bucket): structured, so 64-bit ids never overflow."""
    sid = np.asarray(series_id.to_numpy(), dtype=np.int64)
    t = np.asarray(ts.to_numpy(), dtype=np.int64)
    out = np.empty(sid.size, dtype=[("s", np.int64), ("t", np.int64)])
    out["s"], out["t"] = sid, t
    return out


def _nonfinite_partials(
    samples: pa.Table, width: int, origin: int, since: int, until: int
) -> pa.Table:
    """Rows counting each bucket's NaN and ±Inf samples (staleness markers are not samples)."""
    value = samples.column("value").combine_chunks()
    ts = samples.column("ts").to_numpy()
    values = np.asarray(value.to_numpy(zero_copy_only=False), dtype=np.float64)
    marker = values.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    keep = ~np.isfinite(values) & ~marker & (ts >= since) & (ts < until)
    if not keep.any():
        return empty_partials()
    sid = samples.column("series_id").to_numpy()[keep]
    bucket = origin + (ts[keep] - origin) // width * width
    pairs = np.unique(np.stack([sid, bucket]), axis=1, return_counts=True)
    (sids, buckets), counts = pairs
    n = sids.size
    nulls = pa.nulls(n, pa.float64())
    return pa.table(
        {
            "series_id": pa.array(sids, pa.int64()),
            "ts": pa.array(buckets, pa.int64()),
            "count": pa.array(np.zeros(n, np.int64)),
            "sum": pa.array(np.zeros(n)),
            "min": nulls,
            "max": nulls,
            "first": nulls,
            "first_ts": pa.nulls(n, pa.int64()),
            "last": nulls,
            "last_ts": pa.nulls(n, pa.int64()),
            "increase": nulls,
            "nonfinite": pa.array(counts.astype(np.int64)),
            "m2": nulls,
            "sketch_keys": pa.nulls(n, pa.list_(pa.int32())),
            "sketch_counts": pa.nulls(n, pa.list_(pa.int32())),
        },
        schema=PARTIAL_SCHEMA,
    )


def finite_rows(partials: pa.Table) -> pa.Table:
    """The partials that hold a finite sample (aggregate queries show no others)."""
    if partials.num_rows == 0 or pc.min(partials["count"]).as_py() > 0:
        return partials
    return partials.filter(pc.greater(partials["count"], 0))


def rollup_partials(rows: pa.Table, *, width: int, origin: int, res: int = 0) -> pa.Table:
    """Partials per (series, bucket) from stored rollup rows of resolution ``res``."""
    if rows.num_rows == 0:
        return empty_partials()
    partials = conform(rows)
    if width == res and origin % res == 0:  # buckets are the stored rows themselves
        return partials
    ts = partials["ts"].to_numpy()
    buckets = origin + (ts - origin) // width * width
    return _merge(partials.set_column(1, "ts", pa.array(buckets, pa.int64())))


def conform(rows: pa.Table) -> pa.Table:
    """Rollup rows in today's schema. Rows older versions wrote have no ``first``,
    ``first_ts``, ``last_ts`` or ``nonfinite``: their first/last times are not known (null,
    which PromQL reads as "answer from raw"; aggregate queries merge them by the bucket start),
    and they counted no NaN samples (0). Rows written before rollups kept ``m2`` and a
    quantile sketch have them null: variance and quantiles are not known there."""
    if tuple(rows.column_names) == PARTIAL_COLUMNS and rows.schema.equals(PARTIAL_SCHEMA):
        return rows
    n = rows.num_rows
    columns = {}
    for field in PARTIAL_SCHEMA:
        if field.name in rows.column_names:
            columns[field.name] = rows[field.name]
        elif field.name == "nonfinite":
            columns[field.name] = pa.array(np.zeros(n, np.int64))
        else:
            columns[field.name] = pa.nulls(n, field.type)
    return pa.table(columns).cast(PARTIAL_SCHEMA)


def combine(partials: list[pa.Table]) -> pa.Table:
    """Merge partials of disjoint time segments into one row per (series, bucket)."""
    parts = [p for p in partials if p.num_rows]
    if len(parts) <= 1:
        return conform(parts[0]) if parts else empty_partials()
    return _merge(_concat(parts))


def _merge(partials: pa.Table) -> pa.Table:
    """Group partials by (series_id, ts): add counts, sums, increases and NaN counts, take
    min/max, the ``first`` with the earliest ``first_ts`` and the ``last`` with the latest
    ``last_ts``. Partials of one bucket come from disjoint time segments, so ordering them by
    time orders both ends. Small inputs make this query-time work, so it runs in numpy over
    the sorted rows (one ``reduceat`` per column) rather than paying DuckDB's fixed
    per-statement cost or, on a process's first merge, the import of Arrow's group-by
    engine (``pyarrow.acero``)."""
    if partials.num_rows == 0:
        return empty_partials()
    order_ts = pc.coalesce(partials["last_ts"], partials["ts"]).to_numpy()
    order = np.lexsort((order_ts, partials["ts"].to_numpy(), partials["series_id"].to_numpy()))
    table = partials.take(pa.array(order))
    sid, ts = table["series_id"].to_numpy(), table["ts"].to_numpy()
    starts = np.flatnonzero(np.r_[True, (sid[1:] != sid[:-1]) | (ts[1:] != ts[:-1])])
    columns: dict[str, pa.Array] = {
        "series_id": pa.array(sid[starts], pa.int64()),
        "ts": pa.array(ts[starts], pa.int64()),
    }
    for name, how in _MERGES:
        columns[name] = _reduce(table[name], starts, how)
    columns["m2"] = pa.array(_merged_m2(table, starts), pa.float64())
    columns["sketch_keys"], columns["sketch_counts"] = _merged_sketches(table, starts)
    return pa.table([columns[name] for name in PARTIAL_COLUMNS], names=list(PARTIAL_COLUMNS)).cast(
        PARTIAL_SCHEMA
    )


# How each column of a bucket's parts merges (m2 and the sketches: their own functions).
_MERGES = (
    ("count", "sum"),
    ("sum", "sum"),
    ("min", "min"),
    ("max", "max"),
    ("first", "first"),
    ("first_ts", "min"),
    ("last", "last"),
    ("last_ts", "max"),
    ("increase", "sum"),
    ("nonfinite", "sum"),
)


def _reduce(column: pa.ChunkedArray, starts: np.ndarray, how: str) -> pa.Array:
    """One value per group of rows (groups begin at ``starts``) over the non-null values of
    ``column``: their sum, min or max, or the first or last of them in row order; null where
    a group holds none (as Arrow's grouped aggregates skip nulls)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    integer = pa.types.is_integer(kind)
    if how == "min":
        fill: float | int = np.iinfo(np.int64).max if integer else np.inf
    elif how == "max":
        fill = np.iinfo(np.int64).min if integer else -np.inf
    else:
        fill = 0
    if array.null_count:
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False))
        values = np.asarray(array.fill_null(pa.scalar(fill, kind)).to_numpy())
    else:
        valid = None
        values = np.asarray(array.to_numpy())
    if how == "sum":
        out = np.add.reduceat(values, starts) if integer else _sequential_sum(values, starts)
    elif how == "min":
        out = (np.minimum if integer else np.fmin).reduceat(values, starts)
    elif how == "max":
        out = (np.maximum if integer else np.fmax).reduceat(values, starts)
    elif valid is None:
        ends = np.r_[starts[1:], values.size]
        out = values[starts] if how == "first" else values[ends - 1]
    else:
        held_at = np.flatnonzero(valid)
        if how == "first":
            pick = np.asarray(np.searchsorted(held_at, starts))
        else:
            pick = np.asarray(np.searchsorted(held_at, np.r_[starts[1:], values.size]) - 1)
        out = (
            values[held_at[np.clip(pick, 0, max(held_at.size - 1, 0))]]
            if held_at.size
            else np.zeros(starts.size, values.dtype)
        )
    if valid is None:
        return pa.array(out, kind)
    held = np.add.reduceat(valid.astype(np.int64), starts) > 0
    return pa.array(out, kind, mask=~held)


_SEQUENTIAL_STEPS = 32


def _sequential_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each group's float sum added one row after the other in row order, as Arrow's
    grouped sum adds (``np.add.reduceat`` sums long runs pairwise, a last bit apart): the
    first rows of all groups a row at a time, then each longer group on its own."""
    lengths = np.diff(np.r_[starts, values.size])
    out = np.zeros(starts.size, values.dtype)
    for k in range(min(int(lengths.max()), _SEQUENTIAL_STEPS)):
        live = np.flatnonzero(lengths > k)
        out[live] += values[starts[live] + k]
    for g in np.flatnonzero(lengths > _SEQUENTIAL_STEPS).tolist():
        rest = values[starts[g] + _SEQUENTIAL_STEPS : starts[g] + lengths[g]]
        out[g] = np.add.accumulate(np.r_[out[g], rest])[-1]
    return out


def _merged_m2(table: pa.Table, starts: np.ndarray) -> np.ndarray:
    """Each group's sum of squared deviations from its mean, from its parts' (Chan, Golub
    and LeVeque's pairwise update, all parts at once): ``sum(m2_i) + sum(n_i * (mean_i -
    mean)**2)``. Deviations of the parts' means from the group's, never sums of squares, so
    no cancellation where the values are large and their spread small. NaN where a part
    holding samples has no ``m2`` (rows written before it was kept)."""
    n = np.asarray(table["count"].to_numpy(zero_copy_only=False), dtype=np.float64)
    total = np.asarray(table["sum"].fill_null(0.0).to_numpy(), dtype=np.float64)
    m2 = np.asarray(table["m2"].to_numpy(zero_copy_only=False), dtype=np.float64)
    held = n > 0
    m2 = np.where(held, m2, 0.0)  # empty parts (NaN-only buckets) add nothing
    with np.errstate(all="ignore"):
        group_n = np.add.reduceat(n, starts)
        group_mean = np.add.reduceat(total, starts) / group_n
        mean = np.where(held, total / np.where(held, n, 1.0), 0.0)
        dev = mean - np.repeat(group_mean, np.diff(np.r_[starts, n.size]))
        spread = np.where(held, n * dev * dev, 0.0)
        out = np.add.reduceat(m2, starts) + np.add.reduceat(spread, starts)
    return np.asarray(np.where(group_n > 0, out, np.nan))


def _merged_sketches(table: pa.Table, starts: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """Each group's sketch: its parts' counts added code by code (null where no part has
    one; where some parts lack theirs, the merged sketch covers only the others — such a
    group mixes rows written before sketches were kept with newer ones, and reads of it
    check ``count`` against the sketch's total)."""
    keys = table["sketch_keys"].combine_chunks()
    counts = table["sketch_counts"].combine_chunks()
    groups = starts.size
    if keys.null_count == len(keys):
        nulls = pa.nulls(groups, pa.list_(pa.int32()))
        return nulls, nulls
    row_group = np.repeat(np.arange(groups), np.diff(np.r_[starts, len(keys)]))
    parent = np.asarray(pc.list_parent_indices(keys).to_numpy(), dtype=np.int64)
    flat_keys = np.asarray(pc.list_flatten(keys).to_numpy(), dtype=np.int64)
    flat_counts = np.asarray(pc.list_flatten(counts).to_numpy(), dtype=np.int64)
    g = row_group[parent]
    order = np.lexsort((flat_keys, g))
    g, k, c = g[order], flat_keys[order], flat_counts[order]
    if g.size:
        first = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (k[1:] != k[:-1])])
        g, k, c = g[first], k[first], np.add.reduceat(c, first)
    offsets = np.searchsorted(g, np.arange(groups + 1))
    has = np.zeros(groups, dtype=bool)
    has[row_group[~np.asarray(keys.is_null().to_numpy(zero_copy_only=False))]] = True
    mask = pa.array(~has)
    off = pa.array(offsets.astype(np.int32))
    return (
        pa.ListArray.from_arrays(off, pa.array(k.astype(np.int32)), mask=mask),
        pa.ListArray.from_arrays(off, pa.array(c.astype(np.int32)), mask=mask),
    )


def to_rollup_rows(partials: pa.Table) -> pa.Table:
    """Partials -> stored rollup rows, sorted by (series_id, ts)."""
    table = partials.select(list(ROLLUP_COLUMNS)).sort_by(
        [("series_id", "ascending"), ("ts", "ascending")]
    )
    return table.cast(ROLLUP_SCHEMA)


ROLLUP_SCHEMA = pa.schema(
    [
        ("series_id", pa.int64()),
        ("ts", pa.int64()),
        ("count", pa.int64()),
        ("sum", pa.float64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("first", pa.float64()),
        ("first_ts", pa.int64()),
        ("last", pa.float64()),
        ("last_ts", pa.int64()),
        ("increase", pa.float64()),
        ("nonfinite", pa.int64()),
        ("m2", pa.float64()),
        ("sketch_keys", pa.list_(pa.int32())),
        ("sketch_counts", pa.list_(pa.int32())),
    ]
)
PARTIAL_SCHEMA = ROLLUP_SCHEMA
assert tuple(PARTIAL_SCHEMA.names) == PARTIAL_COLUMNS


def empty_partials() -> pa.Table:
    return PARTIAL_SCHEMA.empty_table()


def _concat(parts: list[pa.Table]) -> pa.Table:
    if not parts:
        return empty_partials()
    return pa.concat_tables(
        [conform(p.select([c for c in PARTIAL_COLUMNS if c in p.column_names])) for p in parts]
    )
