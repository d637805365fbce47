"""Rollup buckets come out ordered by (series, time) whatever order their parts arrive in: a
DuckDB GROUP BY hands raw partials over in hash order, and the PromQL range functions over the
rows search each series' buckets by time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from metricvault.promql import Engine
from metricvault.promql.eval import EngineOptions
from metricvault.store.query import _series_major
from metricvault.store.vault import Vault

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
T0 = (1_700_000_000_000 // DAY) * DAY
NOW = T0 + 3 * DAY


def test_interleaved_runs_are_sorted_row_by_row() -> None:
    table = pa.table(
        {
            "series_id": pa.array([7, 7, 7, 7, 7, 3, 3], pa.int64()),
            "ts": pa.array([0, 1, 2, 4, 3, 9, 8], pa.int64()),
            "value": pa.array([0.0, 1, 2, 4, 3, 9, 8]),
        }
    )
    out = _series_major(table)
    assert out["series_id"].to_pylist() == [3, 3, 7, 7, 7, 7, 7]
    assert out["ts"].to_pylist() == [8, 9, 0, 1, 2, 3, 4]
    assert out["value"].to_pylist() == [8.0, 9, 0, 1, 2, 3, 4]


def test_ordered_runs_are_merged_without_a_sort() -> None:
    table = pa.table({"series_id": pa.array([5, 5, 2, 2], pa.int64()), "ts": [10, 20, 10, 20]})
    out = _series_major(table)
    assert out["series_id"].to_pylist() == [2, 2, 5, 5]
    assert out["ts"].to_pylist() == [10, 20, 10, 20]


def _runs_table(runs: list[tuple[int, list[int]]]) -> pa.Table:
    sid = [series for series, times in runs for _ in times]
    ts = [t for _, times in runs for t in times]
    return pa.table(
        {
            "series_id": pa.array(sid, pa.int64()),
            "ts": pa.array(ts, pa.int64()),
            "value": pa.array([float(s * 1000 + t) for s, t in zip(sid, ts, strict=True)]),
        }
    )


def _rows(table: pa.Table) -> list[tuple[int, int, float]]:
    return list(zip(*(table[c].to_pylist() for c in ("series_id", "ts", "value")), strict=True))


def _expected(table: pa.Table) -> list[tuple[int, int, float]]:
    return sorted(_rows(table))


def test_long_runs_of_day_files_are_moved_as_slices_in_series_order() -> None:
    # two "day files", each holding series 9 then 4 in runs of 40 rows
    day1, day2 = list(range(0, 40)), list(range(40, 80))
    table = _runs_table([(9, day1), (4, day1), (9, day2), (4, day2)])
    out = _series_major(table)
    assert out["ts"].num_chunks == 4  # slices, not a copy of every row
    assert _rows(out) == _expected(table)


def test_runs_that_go_on_across_chunks_are_moved_whole() -> None:
    # the day files read as chunks that cut the runs: series 9's first day ends in chunk 2
    day1, day2 = list(range(0, 40)), list(range(40, 80))
    whole = _runs_table([(9, day1), (4, day1), (9, day2), (4, day2)])
    table = pa.concat_tables([whole.slice(0, 25), whole.slice(25, 70), whole.slice(95)])
    assert table["ts"].num_chunks == 3
    out = _series_major(table)
    assert _rows(out) == _expected(table)
    assert out.schema == table.schema


def test_short_runs_out_of_order_are_taken_row_by_row() -> None:
    table = _runs_table([(2, [5, 6]), (1, [5, 6]), (2, [1, 2]), (1, [1, 2])])
    out = _series_major(table)
    assert _rows(out) == _expected(table)


def test_runs_of_one_series_that_overlap_in_time_are_sorted_row_by_row() -> None:
    # each run is increasing, but the second's times fall inside the first's
    table = _runs_table([(3, list(range(0, 80, 2))), (3, list(range(1, 81, 2))), (1, [0, 1])])
    out = _series_major(table)
    assert _rows(out) == _expected(table)


def test_rows_already_in_order_come_back_as_they_are() -> None:
    table = _runs_table([(1, list(range(50))), (2, list(range(50)))])
    assert _series_major(table) is table


def _write(vault: Vault, start: int, end: int) -> None:
    ts = np.arange(start, end, MIN)
    vault.write([("gpu_util", {"gpu": "0"}, int(t), float((t - T0) // MIN)) for t in ts])


def test_a_long_window_from_the_rows_counts_every_newest_sample(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v"), retention_raw="1d") as vault:
        _write(vault, T0, NOW)
        vault.maintain(now_ms=NOW)
        _write(vault, NOW, NOW + 5 * MIN)  # raw samples after the rolled-up hours
        rows = Engine(vault, EngineOptions(window_cache=False, head_cache=False))
        for minute in range(5):
            at = NOW + minute * MIN + 37_000  # a rule's time: never a whole minute
            # moved to whole minutes (docs/promql.md): [t - 2d, t] for t = at rounded down,
            # both ends included as Prometheus 2 includes them
            last = at // MIN
            first = last - 2 * DAY // MIN
            want_sum = float(sum(range(first - T0 // MIN, last - T0 // MIN + 1)))
            [(_, _, count)] = rows.evaluate("count_over_time(gpu_util[2d])", at).series
            [(_, _, total)] = rows.evaluate("sum_over_time(gpu_util[2d])", at).series
            assert float(count[0]) == last - first + 1, at
            assert float(total[0]) == want_sum, at
