"""The rollup merge (store.rollup._merge, numpy over sorted rows) against Arrow's grouped
aggregates (what it replaced): the same rows, bit for bit, with nulls, NaN-only buckets,
unsorted and interleaved parts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metricvault.store import rollup


def _reference(partials: pa.Table) -> pa.Table:
    """The merge as Arrow's group_by computes it (skip nulls; first/last in row order)."""
    order_ts = pc.coalesce(partials["last_ts"], partials["ts"]).to_numpy()
    order = np.lexsort((order_ts, partials["ts"].to_numpy(), partials["series_id"].to_numpy()))
    table = partials.take(pa.array(order))
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=True)
    aggs = [
        ("count", "sum"), ("sum", "sum"), ("min", "min"), ("max", "max"),
        ("first", "first", keep_nulls), ("first_ts", "min"), ("last", "last", keep_nulls),
        ("last_ts", "max"), ("increase", "sum"), ("nonfinite", "sum"),
    ]  # fmt: skip
    grouped = table.group_by(["series_id", "ts"], use_threads=False).aggregate(aggs)
    grouped = grouped.rename_columns(
        [c.rsplit("_", 1)[0] if c not in ("series_id", "ts") else c for c in grouped.column_names]
    )
    return grouped.sort_by([("series_id", "ascending"), ("ts", "ascending")])


def _partials(rng: np.random.Generator, rows: int, nulls: bool) -> pa.Table:
    sid = rng.choice(np.array([-(2**62), -3, 7, 2**62 + 5], np.int64), rows)
    ts = rng.integers(0, 6, rows).astype(np.int64) * 60_000
    count = rng.integers(0 if nulls else 1, 20, rows).astype(np.int64)
    values = rng.normal(50.0, 30.0, (6, rows)) * 10.0 ** rng.integers(-3, 9, rows)
    last_ts = ts + rng.permutation(rows).astype(np.int64)  # disjoint segments of a bucket
    empty = count == 0  # NaN-only parts: no min/max/first/last
    masked = empty | (rng.random(rows) < 0.3) if nulls else empty
    counters = rng.random(rows) < 0.5
    return pa.table(
        {
            "series_id": sid,
            "ts": ts,
            "count": count,
            "sum": np.where(empty, 0.0, values[0]),
            "min": pa.array(values[1], mask=empty),
            "max": pa.array(values[2], mask=empty),
            "first": pa.array(values[3], mask=masked),
            "first_ts": pa.array(last_ts - 10, mask=masked),
            "last": pa.array(values[4], mask=masked),
            "last_ts": pa.array(last_ts, mask=masked),
            "increase": pa.array(np.abs(values[5]), mask=~counters | empty),
            "nonfinite": rng.integers(0, 3, rows).astype(np.int64),
            "m2": pa.array(np.abs(values[0]), mask=empty),
            "sketch_keys": pa.nulls(rows, pa.list_(pa.int32())),
            "sketch_counts": pa.nulls(rows, pa.list_(pa.int32())),
        }
    ).cast(rollup.PARTIAL_SCHEMA)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("rows", [500, 3000])  # ~20 and ~125 parts a bucket
def test_merge_matches_arrow_group_by(seed: int, nulls: bool, rows: int) -> None:
    partials = _partials(np.random.default_rng(seed), rows, nulls)
    merged = rollup._merge(partials)
    expected = _reference(partials)
    assert merged.schema.equals(rollup.PARTIAL_SCHEMA)
    assert merged.num_rows == expected.num_rows < partials.num_rows
    for name in expected.column_names:
        got, want = merged[name].combine_chunks(), expected[name].combine_chunks()
        assert got.is_null().equals(want.is_null()), name
        if pa.types.is_floating(got.type):  # bit for bit, NaN included
            got_bits = np.asarray(got.fill_null(0.0).to_numpy()).view(np.uint64)
            want_bits = np.asarray(want.fill_null(0.0).to_numpy()).view(np.uint64)
            assert np.array_equal(got_bits, want_bits), name
        else:
            assert got.equals(want), name


def test_merge_of_no_rows_and_one_row() -> None:
    assert rollup._merge(rollup.empty_partials()).num_rows == 0
    one = _partials(np.random.default_rng(1), 1, False)
    assert rollup._merge(one).equals(one)


def test_merge_of_all_null_group_columns() -> None:
    """A bucket whose parts have no first/last times (rows of older versions) keeps them
    null, and a gauge's increase stays null."""
    table = _partials(np.random.default_rng(2), 4, False)
    table = table.set_column(0, "series_id", pa.array(np.full(4, 9, np.int64)))
    table = table.set_column(1, "ts", pa.array(np.zeros(4, np.int64)))
    for name in ("first_ts", "last_ts", "increase"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pa.nulls(4, table.schema.field(name).type))
    merged = rollup._merge(table)
    assert merged.num_rows == 1
    assert merged["first_ts"].null_count == merged["last_ts"].null_count == 1
    assert merged["increase"].null_count == 1
    assert merged["count"][0].as_py() == sum(table["count"].to_pylist())
