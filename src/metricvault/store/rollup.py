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

from metricvault.model import STALE_NAN_BITS

if TYPE_CHECKING:  # imported on first use: `metricvault stats` and `series` never need DuckDB
    import duckdb

PARTIAL_COLUMNS = (
    "series_id", "ts", "count", "sum", "min", "max", "first", "first_ts", "last", "last_ts",
    "increase", "nonfinite",
)  # fmt: skip
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
) -> pa.Table:
    """Partials per (series, bucket) from deduplicated raw samples.

    ``samples`` may start up to ``lookback`` before ``since`` so that counters find the sample
    before their first bucket; only samples in ``[since, until)`` are aggregated. Non-finite
    samples are skipped (see the module docstring).
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
                    arg_max(value, ts) AS last, max(ts)::BIGINT AS last_ts"""
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
    return combine(parts) if nonfinite else _concat(parts)


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
    and they counted no NaN samples (0)."""
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
    time orders both ends. Small inputs make this query-time work, so it runs in Arrow rather
    than paying DuckDB's fixed per-statement cost."""
    order_ts = pc.coalesce(partials["last_ts"], partials["ts"]).to_numpy()
    order = np.lexsort((order_ts, partials["ts"].to_numpy(), partials["series_id"].to_numpy()))
    table = partials.take(pa.array(order))
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=True)
    grouped = table.group_by(["series_id", "ts"], use_threads=False).aggregate(
        [
            ("count", "sum"),
            ("sum", "sum"),
            ("min", "min"),
            ("max", "max"),
            ("first", "first", keep_nulls),
            ("first_ts", "min"),
            ("last", "last", keep_nulls),
            ("last_ts", "max"),
            ("increase", "sum"),
            ("nonfinite", "sum"),
        ]
    )
    names = {
        "count_sum": "count",
        "sum_sum": "sum",
        "min_min": "min",
        "max_max": "max",
        "first_first": "first",
        "first_ts_min": "first_ts",
        "last_last": "last",
        "last_ts_max": "last_ts",
        "increase_sum": "increase",
        "nonfinite_sum": "nonfinite",
    }
    grouped = grouped.rename_columns([names.get(c, c) for c in grouped.column_names])
    return grouped.select(list(PARTIAL_COLUMNS)).cast(PARTIAL_SCHEMA)


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
