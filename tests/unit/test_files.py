"""Golden properties of the Parquet encoding: lossless, compact, the layout we promise."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricvault.store import files

floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _table(sid, values):
    return pa.table(
        {
            "series_id": pa.array(sid, pa.int64()),
            "ts": pa.array(np.arange(len(values)) * 5000 + 1_767_225_600_000, pa.int64()),
            "value": pa.array(values, pa.float64()),
        }
    )


def _roundtrip(table, cols=files.RAW_FLOATS):
    return files.read_parquet(io.BytesIO(files.write_parquet(table, cols)), cols)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(floats, st.integers(-(10**12), 10**12).map(float)), min_size=1))
def test_roundtrip_is_bit_exact(values):
    table = _table([7] * len(values), values)
    back = _roundtrip(table)["value"].to_numpy()
    assert np.array_equal(back.view(np.int64), np.array(values, np.float64).view(np.int64))


@pytest.mark.parametrize(
    ("values", "scale"),
    [([1.0, 2.0, 100.0], 0), ([0.5, 1.25], 2), ([245.123, 250.5], 3), ([0.1, 0.2], 1)],
)
def test_decimal_values_become_scaled_integers(values, scale):
    physical = files.encode(_table([1] * len(values), values), files.RAW_FLOATS)
    assert physical["scale"].to_pylist() == [scale] * len(values)
    assert physical["value_f"].null_count == len(values)
    assert physical["value_i"].to_pylist() == [round(v * 10**scale) for v in values]


def test_values_that_are_not_short_decimals_fall_back_to_floats():
    values = [0.1 + 0.2, 1 / 3, -0.0]
    physical = files.encode(_table([1, 1, 1], values), files.RAW_FLOATS)
    assert physical["value_f"].null_count == 0
    assert physical["value_i"].null_count == 3


def test_parquet_layout_uses_metric_friendly_encodings():
    values = np.round(np.random.default_rng(1).uniform(0, 100, 10_000), 1)
    data = files.write_parquet(_table(np.repeat([1, 2], 5000), values), files.RAW_FLOATS)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    col = {
        meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i)
        for i in range(meta.num_columns)
    }
    assert "DELTA_BINARY_PACKED" in col["ts"].encodings
    assert "DELTA_BINARY_PACKED" in col["value_i"].encodings
    assert "BYTE_STREAM_SPLIT" in col["value_f"].encodings
    assert col["ts"].compression == "ZSTD"
    # 10k samples of 1-decimal values: far below the 16 bytes of a naive (ts, value) pair
    assert len(data) / 10_000 < 3


def test_rollup_columns_roundtrip_with_missing_increase():
    table = pa.table(
        {
            "series_id": pa.array([1, 1], pa.int64()),
            "ts": pa.array([0, 60_000], pa.int64()),
            "count": pa.array([12, 12], pa.int64()),
            "sum": [12.5, 13.75],
            "min": [1.0, 1.25],
            "max": [2.0, 2.5],
            "last": [1.5, 2.0],
            "increase": pa.array([None, 3.0], pa.float64()),
        }
    )
    back = _roundtrip(table, files.ROLLUP_FLOATS)
    assert back["increase"].to_pylist() == [None, 3.0]
    assert back["sum"].to_pylist() == [12.5, 13.75]
    # Rows in this shape (written before issue 13) read in today's schema: first and the
    # sample times unknown (PromQL then reads raw samples), no NaN samples counted.
    from metricvault.store.rollup import PARTIAL_COLUMNS, conform

    rows = conform(back)
    assert tuple(rows.column_names) == PARTIAL_COLUMNS
    assert (
        rows["first"].null_count == rows["first_ts"].null_count == rows["last_ts"].null_count == 2
    )
    assert rows["nonfinite"].to_pylist() == [0, 0]


def test_sort_dedup_keeps_the_latest_write():
    table = pa.table(
        {
            "series_id": pa.array([2, 1, 1, 2], pa.int64()),
            "ts": pa.array([10, 10, 10, 10], pa.int64()),
            "value": [1.0, 2.0, 3.0, 4.0],
        }
    )
    out = files.sort_dedup(table)
    assert out.to_pydict() == {"series_id": [1, 2], "ts": [10, 10], "value": [3.0, 4.0]}


def test_jittery_series_go_to_byte_stream_split_and_smooth_ones_to_deltas():
    rng = np.random.default_rng(2)
    noisy = rng.integers(90, 101, 5000).astype(float)  # busy GPU utilisation, jittering
    smooth = np.cumsum(rng.integers(1000, 1010, 5000)).astype(float)  # an energy counter
    table = _table(np.repeat([1, 2], 5000), np.concatenate([noisy, smooth]))
    physical = files.encode(table, files.RAW_FLOATS)
    assert physical["value_j"].slice(0, 5000).null_count == 0
    assert physical["value_i"].slice(5000).null_count == 0
    back = _roundtrip(table)["value"].to_numpy()
    assert np.array_equal(back, np.concatenate([noisy, smooth]))


def test_rollup_first_and_bucket_times_roundtrip_and_nan_only_buckets_stay_empty():
    """Issue 13: rollup rows carry the first sample and both sample times; a bucket that held
    only NaN samples (count 0) keeps no min/max/first/last after the derivable-value elision."""
    table = pa.table(
        {
            "series_id": pa.array([1, 1, 1, 1], pa.int64()),
            "ts": pa.array([0, 60_000, 120_000, 180_000], pa.int64()),
            "count": pa.array([12, 1, 5, 0], pa.int64()),
            "sum": [12.5, 4.0, 10.0, 0.0],
            "min": [0.5, 4.0, 2.0, None],
            "max": [2.0, 4.0, 2.0, None],
            "first": [1.75, 4.0, 2.0, None],
            "first_ts": pa.array([0, 61_000, 120_000, None], pa.int64()),
            "last": [1.5, 4.0, 2.0, None],
            "last_ts": pa.array([55_000, 61_000, 175_000, None], pa.int64()),
            "increase": pa.array([None, None, None, None], pa.float64()),
            "nonfinite": pa.array([0, 0, 1, 3], pa.int64()),
        }
    )
    back = _roundtrip(table, files.ROLLUP_FLOATS)
    for column in ("first", "first_ts", "last", "last_ts", "min", "max", "nonfinite"):
        assert back[column].to_pylist() == table[column].to_pylist(), column


@pytest.mark.parametrize("wanted", [1, 5, 33, 80, 100])
def test_reader_slices_exactly_the_wanted_series(wanted: int) -> None:
    """Few runs are sliced, many are filtered in one pass: the same rows either way."""
    from metricvault.store.reader import _slice_series

    rng = np.random.default_rng(wanted)
    ids = np.sort(rng.choice(np.arange(-(2**62), 2**62, 2**55), 100, replace=False))
    sid = np.repeat(ids, rng.integers(1, 20, ids.size))
    table = pa.table({"series_id": sid, "ts": np.arange(sid.size)})
    pick = np.sort(rng.choice(ids, wanted, replace=False))
    got = _slice_series(table, pick)
    assert got["ts"].to_pylist() == table["ts"].to_numpy()[np.isin(sid, pick)].tolist()


LAYOUT = Path(__file__).resolve().parents[1] / "data" / "layout"


def _column_encodings(data: bytes) -> dict[str, tuple[str, ...]]:
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    group = meta.row_group(0)
    return {
        group.column(i).path_in_schema: group.column(i).encodings for i in range(meta.num_columns)
    }


def test_a_rollup_file_of_the_first_layout_reads_as_it_did_and_rewrites_to_the_same_rows():
    """rollup-1m-format1.parquet was written by the writer before format versions (sketch
    lists dictionary-encoded, no version key); ``.expected`` holds the rows it was written
    from. Today's reader decodes it to exactly those rows, and today's writer stores them
    again, smaller, bit-exact."""
    old = (LAYOUT / "rollup-1m-format1.parquet").read_bytes()
    expected = pq.read_table(LAYOUT / "rollup-1m-format1.expected.parquet")
    assert files.format_version(pq.ParquetFile(io.BytesIO(old)).metadata) == 1
    assert "BYTE_STREAM_SPLIT" not in _column_encodings(old)["sketch_keys.list.element"]
    back = files.read_parquet(io.BytesIO(old), files.ROLLUP_FLOATS).select(expected.column_names)
    assert back.equals(expected.cast(back.schema))
    new = files.write_parquet(expected, files.ROLLUP_FLOATS)
    assert files.format_version(pq.ParquetFile(io.BytesIO(new)).metadata) == files.FORMAT_VERSION
    again = files.read_parquet(io.BytesIO(new), files.ROLLUP_FLOATS).select(expected.column_names)
    assert again.equals(back)
    for column in ("m2", "sum", "first", "last"):  # bit-exact, NaN-free float columns
        got = again[column].to_numpy(zero_copy_only=False)
        want = back[column].to_numpy(zero_copy_only=False)
        assert np.array_equal(got.view(np.int64), want.view(np.int64), equal_nan=False), column
    assert len(new) < len(old)


@pytest.mark.parametrize(
    ("column", "encoding"),
    [
        ("ts", "DELTA_BINARY_PACKED"),
        ("first_ts", "DELTA_BINARY_PACKED"),
        ("sum_i", "BYTE_STREAM_SPLIT"),
        ("m2_f", "BYTE_STREAM_SPLIT"),
        ("sketch_keys.list.element", "BYTE_STREAM_SPLIT"),
        ("sketch_counts_head.list.element", "BYTE_STREAM_SPLIT"),
        ("first_d", "BYTE_STREAM_SPLIT"),
        ("count", "RLE_DICTIONARY"),
    ],
)
def test_rollup_files_of_this_layout_use_the_recorded_encodings(column, encoding):
    expected = pq.read_table(LAYOUT / "rollup-1m-format1.expected.parquet")
    assert encoding in _column_encodings(files.write_parquet(expected, files.ROLLUP_FLOATS))[column]


def _sketch_rows(counts: list[list[int] | None], count: list[int]) -> pa.Table:
    n = len(count)
    lists = pa.list_(pa.int32())
    return pa.table(
        {
            "series_id": pa.array([5] * n, pa.int64()),
            "ts": pa.array(np.arange(n) * 60_000, pa.int64()),
            "count": pa.array(count, pa.int64()),
            "sum": [10.5, 7.25, 3.0, 0.0][:n],
            "min": [1.5, 1 / 3, 3.0, None][:n],  # 1/3: min in the float column, first not
            "max": [4.0, 5.0, 3.0, None][:n],
            "first": [2.25, 4.0, 3.0, None][:n],
            "last": [1.5, 1.75, 3.0, None][:n],
            "sketch_keys": pa.array(
                [None if c is None else list(range(len(c))) for c in counts], lists
            ),
            "sketch_counts": pa.array(counts, lists),
        }
    )


@pytest.mark.parametrize(
    ("counts", "count", "head_stored"),
    [
        ([[1, 2, 2], [3, 1], [1], None], [5, 4, 1, 0], True),  # counts add up: last dropped
        ([[1, 2, 2], [], [1], None], [5, 4, 1, 0], True),  # an empty sketch stays empty
        ([[1, 2, 2], [3, 1], [1], None], [5, 4, 2, 0], False),  # one does not: all kept
    ],
)
def test_rollup_rows_of_every_format_version_read_back_bit_exact(counts, count, head_stored):
    rows = _sketch_rows(counts, count)
    for version in (1, 2, files.FORMAT_VERSION):
        data = files.write_parquet(rows, files.ROLLUP_FLOATS, version)
        stored = pq.read_table(io.BytesIO(data))
        assert ("sketch_counts_head" in stored.column_names) == (head_stored and version >= 3)
        assert ("first_d" in stored.column_names) == (version >= 3)
        back = files.read_parquet(io.BytesIO(data), files.ROLLUP_FLOATS)
        for column in ("first", "min", "max", "last", "sketch_keys", "sketch_counts"):
            assert back[column].to_pylist() == rows[column].to_pylist(), (version, column)
