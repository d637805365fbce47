"""Rollup files of format 4 keep each sketch's codes without the first and last where those
are the codes of the row's ``min`` and ``max`` (docs/decisions/0011): every row reads back
exactly, in every format version, whatever its sketch holds."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricvault.model import sketch_mapping
from metricvault.store import files

LISTS = pa.list_(pa.int32())


def _bucket(samples: list[float]) -> dict[str, Any]:
    """One rollup row of ``samples`` (finite), with the sketch the rollup writer keeps."""
    codes, counts = np.unique(sketch_mapping().codes(np.asarray(samples)), return_counts=True)
    with np.errstate(over="ignore"):  # a sum of huge doubles may be inf: fine for a row
        total = float(np.sum(samples))
    return {
        "count": len(samples),
        "sum": total,
        "min": min(samples),
        "max": max(samples),
        "first": samples[0],
        "last": samples[-1],
        "sketch_keys": [int(c) for c in codes],
        "sketch_counts": [int(c) for c in counts],
    }


def _nan_only() -> dict[str, Any]:
    """A bucket whose samples were all NaN: a count of 0, no values, no sketch."""
    values = dict.fromkeys(("sum", "min", "max", "first", "last", "sketch_keys", "sketch_counts"))
    return {"count": 0, **values}


def _rows(buckets: list[dict[str, Any]]) -> pa.Table:
    n = len(buckets)
    table = {
        "series_id": pa.array([7] * n, pa.int64()),
        "ts": pa.array(np.arange(n) * 60_000, pa.int64()),
        "count": pa.array([b["count"] for b in buckets], pa.int64()),
    }
    for column in ("sum", "min", "max", "first", "last"):
        table[column] = pa.array([b[column] for b in buckets], pa.float64())
    for column in ("sketch_keys", "sketch_counts"):
        table[column] = pa.array([b[column] for b in buckets], LISTS)
    return pa.table(table)


def _read(rows: pa.Table, version: int) -> tuple[pa.Table, pa.Table]:
    data = files.write_parquet(rows, files.ROLLUP_FLOATS, version)
    stored = pq.read_table(io.BytesIO(data))
    back = files.read_parquet(io.BytesIO(data), files.ROLLUP_FLOATS)
    return stored, back


def _assert_same(rows: pa.Table, back: pa.Table) -> None:
    for column in rows.column_names:
        assert back[column].to_pylist() == rows[column].to_pylist(), column


def test_codes_between_min_and_max_are_all_a_sketch_keeps() -> None:
    buckets = [
        _bucket([41.0, 43.5, 40.25, 47.0, 44.0]),  # several codes
        _bucket([3.0, 3.0, 3.0]),  # one code (a constant bucket)
        _bucket([10.0, 20.0]),  # two codes: nothing between them
        _bucket([-2.5, 0.0, 1.75, -0.5]),  # negative codes and zero's code 0
        _bucket([0.0, 0.0]),  # only zero
        _bucket([1e-300, 5e300]),  # extreme magnitudes
    ]
    rows = _rows(buckets)
    stored, back = _read(rows, files.FORMAT_VERSION)
    assert files.FORMAT_VERSION >= 4
    assert stored["sketch_keys"].null_count == rows.num_rows  # every row kept only its inner
    inner = stored["sketch_keys_inner"].to_pylist()
    codes = rows["sketch_keys"][0].as_py()
    assert len(codes) > 3 and inner[0] == np.diff(codes[:-1]).tolist()  # gaps from min's code
    assert inner[1] == [] and inner[2] == []
    _assert_same(rows, back)


def test_rows_whose_sketch_does_not_end_at_min_and_max_keep_their_codes_whole() -> None:
    odd = _bucket([5.0, 6.0, 9.0])
    odd["sketch_keys"] = [int(c) + 1 for c in odd["sketch_keys"]]
    with_inf = _bucket([5.0, 6.0])
    with_inf["max"] = float("inf")  # a bucket with +Inf: its sketch holds the finite ones
    empty = {**_bucket([1.0]), "sketch_keys": [], "sketch_counts": []}
    missing = {**_bucket([2.0, 4.0]), "sketch_keys": None, "sketch_counts": None}
    nan_only = _nan_only()
    rows = _rows([_bucket([1.0, 2.0, 3.0]), odd, with_inf, empty, missing, nan_only])
    for version in range(1, files.FORMAT_VERSION + 1):
        stored, back = _read(rows, version)
        assert ("sketch_keys_inner" in stored.column_names) == (version >= 4)
        if version >= 4:
            assert stored["sketch_keys_inner"].is_valid().to_pylist() == [
                True, False, False, False, False, False,
            ]  # fmt: skip
        _assert_same(rows, back)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.integers(-(10**6), 10**6).map(lambda i: i / 1000),
                st.floats(allow_nan=False, allow_infinity=False, width=64),
            ),
            min_size=1,
            max_size=20,
        ),
        min_size=1,
        max_size=30,
    )
)
def test_any_buckets_read_back_exactly_in_every_format(samples: list[list[float]]) -> None:
    rows = _rows([_bucket(s) for s in samples])
    for version in (3, files.FORMAT_VERSION):
        _assert_same(rows, _read(rows, version)[1])


@pytest.mark.parametrize("lean", [False, True])
def test_reads_without_the_sketch_columns_still_decode(lean: bool) -> None:
    """The reader's lean reads leave every ``sketch_*`` column out (reader.SKETCH_PREFIX)."""
    rows = _rows([_bucket([1.0, 2.5, 9.0]), _bucket([4.0])])
    data = files.write_parquet(rows, files.ROLLUP_FLOATS)
    names = pq.ParquetFile(io.BytesIO(data)).schema_arrow.names
    keep = [n for n in names if not (lean and n.startswith("sketch_"))]
    stored = pq.ParquetFile(io.BytesIO(data)).read(columns=keep)
    back = files.decode(stored, files.ROLLUP_FLOATS)
    assert ("sketch_keys" in back.column_names) == (not lean)
    assert "sketch_keys_inner" not in back.column_names
    for column in ("count", "sum", "min", "max", "first", "last"):
        assert back[column].to_pylist() == rows[column].to_pylist(), column


def _value_rows() -> pa.Table:
    """Rollup rows whose sum/max/last take each form: integers at a decimal scale (stored as
    distances from min in format 5), floats, one-sample and constant buckets, a NaN-only
    bucket, and a sum too large to be a distance from count x min."""
    rows = _rows(
        [
            _bucket([41.5, 43.25, 40.0, 47.75]),
            _bucket([1 / 3, 2 / 3, 0.1]),  # floats: no scaled form
            _bucket([7.0]),  # one sample: min, max, last follow from sum
            _bucket([2.5, 2.5]),  # constant: max and last follow from min
            _bucket([-4.0, 3.0, -1.0]),  # negative min
            {**_bucket([1.0]), **_nan_only()},
        ]
    )
    return rows.append_column("increase", pa.array([0.0, 0.25, None, 1.0, 2.0, None]))


def test_sum_max_last_as_distances_from_min_read_back_exactly() -> None:
    rows = _value_rows()
    stored, back = _read(rows, files.FORMAT_VERSION)
    assert files.FORMAT_VERSION >= 5
    assert {"sum_j", "max_j", "last_j"} <= set(stored.column_names)
    assert stored["sum_j"].to_pylist()[0] == (41.5 + 43.25 + 40.0 + 47.75 - 4 * 40.0) * 100
    _assert_same(rows, back)
    big = _rows([_bucket([-(2.0**52), 2.0**52 - 4, 2.0**52 - 6])])  # 3 x min past 2**53
    stored, back = _read(big, files.FORMAT_VERSION)
    assert stored["sum_i"].to_pylist() == [2**52 - 10]  # the sum stays whole
    assert stored["max_j"].to_pylist() == [2**53 - 4]
    _assert_same(big, back)
    for version in range(1, files.FORMAT_VERSION):
        assert "sum_j" not in _read(rows, version)[0].column_names
        _assert_same(rows, _read(rows, version)[1])


@pytest.mark.parametrize("new_first", [False, True])
def test_the_sql_view_decodes_rollup_files_of_every_format_together(
    tmp_path: Path, new_first: bool
) -> None:
    """The ``rollup_*`` views read files of format 5 and earlier in one dataset, whichever
    file the dataset's schema is taken from."""
    import duckdb
    import pyarrow.fs as pafs

    from metricvault.store.introspect import _VIEW_SQL
    from metricvault.store.rollup import fetch_arrow

    rows = _value_rows()
    paths = []
    for version in (3, files.FORMAT_VERSION) if not new_first else (files.FORMAT_VERSION, 3):
        path = tmp_path / f"f{version}.parquet"
        shifted = rows.set_column(1, "ts", pa.array(rows["ts"].to_numpy() + version * 10**9))
        path.write_bytes(files.write_parquet(shifted, files.ROLLUP_FLOATS, version))
        paths.append(str(path))
    con = duckdb.connect()
    con.register("src", files.dataset(paths, pafs.LocalFileSystem()))
    got = fetch_arrow(con, _VIEW_SQL["rollup"].format(src="src") + " ORDER BY ts")
    held = [i for i, c in enumerate(rows["count"].to_pylist()) if c > 0]
    for column in ("sum", "min", "max", "last", "increase"):
        want = [rows[column][i].as_py() for i in held]
        assert got[column].to_pylist() == want * 2, column


@pytest.mark.parametrize("column", ["sum", "min", "max", "first", "last", "increase", "m2"])
def test_a_few_series_first_read_of_one_rollup_column_decodes_as_the_whole_row(
    tmp_path: Path, column: str
) -> None:
    """A fresh reader's first read of a few series of a rollup row group takes only the
    physical columns the asked one is decoded from (``Reader._projected_part``): that must
    include what format 5 stores it as a distance from."""
    from metricvault.store.reader import FileCache, Reader
    from metricvault.store.vault import Vault

    rng = np.random.default_rng(5)
    start = 1_767_225_600_000
    ts = start + np.arange(0, 2 * 3_600_000, 5_000)
    with Vault.open_local(str(tmp_path / "v")) as vault:
        for k in range(40):  # 40 series: one is far under a quarter of the row group
            values = np.round(50 + np.cumsum(rng.normal(0, 1, ts.size)), 2)
            vault.write(
                pa.table(
                    {
                        "metric": pa.array(["gpu_power_watts"] * ts.size),
                        "gpu": pa.array([str(k)] * ts.size),
                        "ts": pa.array(ts, pa.int64()),
                        "value": pa.array(values, pa.float64()),
                    }
                )
            )
        vault.maintain(now_ms=int(ts[-1]) + 3_600_000)
        files_1m = vault.snapshot().tier_files("1m")
        assert files_1m
        assert files.format_version(pq.ParquetFile(files_1m[0].path).metadata) >= 5
        whole = vault.reader.read(files_1m, None, 0, 2**62, "1m", use_cache=False)
        sid = int(whole["series_id"][7].as_py())
        fresh = Reader(vault.location, FileCache(1 << 28))
        part = fresh.read(files_1m, [sid], 0, 2**62, "1m", sketches=False,
                          columns=frozenset({"series_id", "ts", "count", column}))  # fmt: skip
    want = whole.filter(pa.compute.equal(whole["series_id"], sid))
    assert part.num_rows == want.num_rows > 0
    assert part[column].to_pylist() == want[column].to_pylist()


def test_the_sql_view_never_multiplies_count_by_min_where_the_sum_is_stored_whole(
    tmp_path: Path,
) -> None:
    """``count x min_i`` would overflow BIGINT here (2048 x 2**52): the view computes it only
    where the writer stored ``sum_j``, so the statement answers instead of failing."""
    import duckdb
    import pyarrow.fs as pafs

    from metricvault.store.introspect import _VIEW_SQL
    from metricvault.store.rollup import fetch_arrow

    big = 2.0**52
    rows = pa.table(
        {
            "series_id": pa.array([1, 1], pa.int64()),
            "ts": pa.array([0, 60_000], pa.int64()),
            "count": pa.array([2048, 3], pa.int64()),
            "sum": [2048 * big + 2048 * 3.0, 6.0],
            "min": [big, 1.0],
            "max": [big + 6, 3.0],
            "last": [big + 2, 2.0],
            "increase": [0.0, 0.0],
        }
    )
    path = tmp_path / "big.parquet"
    path.write_bytes(files.write_parquet(rows, files.ROLLUP_FLOATS))
    stored = pq.read_table(path)
    assert stored["sum_j"].to_pylist() == [None, 3] and stored["sum_f"].is_valid()[0].as_py()
    con = duckdb.connect()
    con.register("src", files.dataset([str(path)], pafs.LocalFileSystem()))
    got = fetch_arrow(con, _VIEW_SQL["rollup"].format(src="src") + " ORDER BY ts")
    for column in ("sum", "min", "max", "last"):
        assert got[column].to_pylist() == rows[column].to_pylist(), column
