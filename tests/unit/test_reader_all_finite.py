"""The raw finiteness test the rollup planner asks before answering from rows."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault.store import files as fmt
from metricvault.store.reader import _all_null


def _raw(values: list[float]) -> pq.FileMetaData:
    n = len(values)
    table = pa.table(
        {
            "series_id": pa.array(np.zeros(n, np.int64)),
            "ts": pa.array(np.arange(n, dtype=np.int64) * 15_000),
            "value": pa.array(values, pa.float64()),
        }
    )
    data = fmt.write_parquet(table, fmt.RAW_FLOATS)
    return pq.ParquetFile(io.BytesIO(data)).metadata


def test_a_row_group_of_exact_values_is_known_finite_from_its_footer() -> None:
    assert _all_null(_raw([1.0, 2.0, 3.5, 40.0]), 0, "value_f")


@pytest.mark.parametrize("odd", [float("nan"), float("inf"), -float("inf"), 0.1 + 0.2])
def test_a_row_group_holding_a_float_fallback_is_read(odd: float) -> None:
    meta = _raw([1.0, odd, 3.0])
    assert "value_f" in meta.schema.names
    assert not _all_null(meta, 0, "value_f")


def test_a_column_without_statistics_is_not_taken_for_null() -> None:
    table = pa.table({"value_f": pa.array([None, None], pa.float64())})
    sink = io.BytesIO()
    pq.write_table(table, sink, write_statistics=False)
    assert not _all_null(pq.ParquetFile(io.BytesIO(sink.getvalue())).metadata, 0, "value_f")
