"""A row group's rows of some series within ``[start, end)``, cut by binary search per series
(store/reader.py ``slice_rows``), are exactly the rows a filter over the group keeps."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metricvault.store import reader


def _group(rng: np.random.Generator, series: int) -> pa.Table:
    """Rows sorted by series, then time, as raw row groups are: runs of any length (none
    too), irregular times."""
    sids, times = [], []
    for sid in np.sort(rng.choice(2**40, series, replace=False)) - 2**39:
        n = int(rng.integers(0, 60))
        sids.append(np.full(n, sid, np.int64))
        times.append(np.sort(rng.choice(10_000, n, replace=False)).astype(np.int64) * 1000)
    sid, ts = np.concatenate(sids), np.concatenate(times)
    return pa.table({"series_id": sid, "ts": ts, "value": rng.normal(size=sid.size)})


def _filtered(table: pa.Table, ids: np.ndarray | None, start: int, end: int) -> pa.Table:
    keep = pc.and_(pc.greater_equal(table["ts"], start), pc.less(table["ts"], end))
    if ids is not None:
        keep = pc.and_(keep, pc.is_in(table["series_id"], pa.array(ids)))
    return table.filter(keep)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("series", [1, 3, 12, 40])  # per-run searches, and one for all runs
def test_time_cut_runs_equal_a_filter(seed: int, series: int) -> None:
    rng = np.random.default_rng(seed)
    table = _group(rng, series)
    all_ids = np.unique(table["series_id"].to_numpy())
    for _ in range(20):
        start = int(rng.integers(-1000, 10_500)) * 1000
        end = start + int(rng.integers(0, 4000)) * 1000
        wanted = rng.random(all_ids.size) < 0.6
        missing = np.asarray([2**62], np.int64)  # a series the group does not hold
        for ids in (None, np.unique(np.r_[all_ids[wanted], missing])):
            got = reader.slice_rows(table, ids, start, end)
            assert got.equals(_filtered(table, ids, start, end)), (start, end, ids)


def test_a_range_holding_the_whole_group_returns_it_uncopied() -> None:
    table = _group(np.random.default_rng(1), 5)
    assert reader.slice_rows(table, None, -(2**62), 2**62) is table


def test_an_empty_group_stays_empty() -> None:
    table = pa.table({"series_id": pa.array([], pa.int64()), "ts": pa.array([], pa.int64())})
    assert reader.slice_rows(table, None, 0, 10**9).num_rows == 0
