"""Rollup math: per-bucket ``count, sum, min, max, last`` and, for counters, ``increase``.

``increase`` of a bucket is the sum, over the bucket's samples, of the rise from the sample
before (which may sit in an earlier bucket, at most ``lookback`` earlier); a drop is a counter
reset and counts the new value in full. Summing bucket increases therefore equals the increase
computed over the raw samples of the whole span, at any resolution — which is what lets
queries switch tiers without changing answers.

The same "partial" shape (``series_id, ts, count, sum, min, max, last, last_ts, increase``)
comes from raw samples and from stored rollups, so a query can combine segments from different
tiers by summing counts/sums/increases, taking min/max, and the ``last`` of the latest ``last_ts``.

Non-finite samples (NaN, ±Inf and Prometheus staleness markers, all stored as values since
issue 13) are left out of rollups: ``count`` counts finite samples, ``sum/min/max/last`` are
over them, and a counter's ``increase`` runs from one finite sample to the next finite one
(a NaN between two samples neither resets nor adds). A bucket holding no finite sample has no
rollup row, exactly as if those samples had never been written. Raw reads keep them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # imported on first use: `metricvault stats` and `series` never need DuckDB
    import duckdb

PARTIAL_COLUMNS = ("series_id", "ts", "count", "sum", "min", "max", "last", "last_ts", "increase")
ROLLUP_COLUMNS = ("series_id", "ts", "count", "sum", "min", "max", "last", "increase")

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
    if samples.num_rows and not pc.all(pc.is_finite(value)).as_py():
        samples = samples.filter(pc.is_finite(value))
    is_counter = pc.is_in(samples.column("series_id"), value_set=counters)
    gauges = samples.filter(pc.invert(is_counter))
    counter_rows = samples.filter(is_counter)
    con = connection()
    bucket = _bucket_sql(origin, width)
    parts = []
    if gauges.num_rows:
        con.register("g", gauges)
        parts.append(
            fetch_arrow(
                con,
                (
                    f"""SELECT series_id, {bucket} AS ts, count(*)::BIGINT AS count,
                    fsum(value) AS sum, min(value) AS min, max(value) AS max,
                    arg_max(value, ts) AS last, max(ts)::BIGINT AS last_ts,
                    NULL::DOUBLE AS increase
                FROM g WHERE ts >= {since} AND ts < {until} GROUP BY 1, 2"""
                ),
            )
        )
        con.unregister("g")
    if counter_rows.num_rows:
        con.register("c", counter_rows)
        parts.append(
            fetch_arrow(
                con,
                (
                    f"""WITH s AS (
                    SELECT series_id, ts, value,
                        lag(value) OVER w AS pv, lag(ts) OVER w AS pts
                    FROM c WINDOW w AS (PARTITION BY series_id ORDER BY ts))
                SELECT series_id, {bucket} AS ts, count(*)::BIGINT AS count,
                    fsum(value) AS sum, min(value) AS min, max(value) AS max,
                    arg_max(value, ts) AS last, max(ts)::BIGINT AS last_ts,
                    fsum(CASE WHEN pv IS NULL OR ts - pts > {lookback} THEN 0
                              WHEN value >= pv THEN value - pv ELSE value END) AS increase
                FROM s WHERE ts >= {since} AND ts < {until} GROUP BY 1, 2"""
                ),
            )
        )
        con.unregister("c")
    return _concat(parts)


def rollup_partials(rows: pa.Table, *, width: int, origin: int, res: int = 0) -> pa.Table:
    """Partials per (series, bucket) from stored rollup rows of resolution ``res``."""
    if rows.num_rows == 0:
        return empty_partials()
    partials = _concat([rows.append_column("last_ts", rows["ts"])])
    if width == res and origin % res == 0:  # buckets are the stored rows themselves
        return partials
    ts = partials["ts"].to_numpy()
    buckets = origin + (ts - origin) // width * width
    return _merge(partials.set_column(1, "ts", pa.array(buckets, pa.int64())))


def combine(partials: list[pa.Table]) -> pa.Table:
    """Merge partials of disjoint time segments into one row per (series, bucket)."""
    parts = [p for p in partials if p.num_rows]
    if len(parts) <= 1:
        return parts[0] if parts else empty_partials()
    return _merge(_concat(parts))


def _merge(partials: pa.Table) -> pa.Table:
    """Group partials by (series_id, ts): add counts, sums and increases, take min/max, and the
    ``last`` with the latest ``last_ts``. Small inputs make this query-time work, so it runs in
    Arrow rather than paying DuckDB's fixed per-statement cost."""
    order = np.lexsort(
        (
            partials["last_ts"].to_numpy(),
            partials["ts"].to_numpy(),
            partials["series_id"].to_numpy(),
        )
    )
    table = partials.take(pa.array(order))
    grouped = table.group_by(["series_id", "ts"], use_threads=False).aggregate(
        [
            ("count", "sum"),
            ("sum", "sum"),
            ("min", "min"),
            ("max", "max"),
            ("last", "last", pc.ScalarAggregateOptions(skip_nulls=False)),
            ("last_ts", "max"),
            ("increase", "sum"),
        ]
    )
    names = {
        "count_sum": "count",
        "sum_sum": "sum",
        "min_min": "min",
        "max_max": "max",
        "last_last": "last",
        "last_ts_max": "last_ts",
        "increase_sum": "increase",
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
        ("last", pa.float64()),
        ("increase", pa.float64()),
    ]
)
# a partial is a rollup row plus the time of its ``last`` value, to merge segments by it
PARTIAL_SCHEMA = ROLLUP_SCHEMA.insert(7, pa.field("last_ts", pa.int64()))
assert tuple(PARTIAL_SCHEMA.names) == PARTIAL_COLUMNS


def empty_partials() -> pa.Table:
    return PARTIAL_SCHEMA.empty_table()


def _concat(parts: list[pa.Table]) -> pa.Table:
    if not parts:
        return empty_partials()
    return pa.concat_tables([p.select(list(PARTIAL_COLUMNS)).cast(PARTIAL_SCHEMA) for p in parts])
