"""The flusher's faster steps give what the plain ones gave: sort_dedup's order by series
ranks is the two-key lexsort's, the split by shape sizes deltas as _delta_bytes does, a
flush's days and hours are np.unique's, and a file at the flush's zstd level reads the same."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metricvault.store import files as fmt
from metricvault.store.vault import Vault, _distinct


def _lexsort_dedup(table: pa.Table) -> pa.Table:
    sid = table.column("series_id").to_numpy()
    ts = table.column("ts").to_numpy()
    idx = np.lexsort((ts, sid))
    s, t = sid[idx], ts[idx]
    last = np.r_[(s[1:] != s[:-1]) | (t[1:] != t[:-1]), True]
    return table.take(pa.array(idx[last]))


def test_sort_dedup_matches_the_lexsort() -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, k = int(rng.integers(2, 3000)), int(rng.integers(1, 200))
        ids = rng.integers(-(2**63), 2**63 - 1, k, dtype=np.int64)
        sid = ids[rng.integers(0, k, n)]
        in_order = rng.random() < 0.5  # a flush's batches: each series in time order
        ts = np.sort(rng.integers(0, 50, n)) if in_order else rng.integers(0, 50, n)
        table = pa.table({"series_id": sid, "ts": ts, "value": np.arange(n, dtype=float)})
        if rng.random() < 0.3:
            table = pa.concat_tables([table.slice(0, n // 2), table.slice(n // 2)])
        got = fmt.sort_dedup(table)
        assert got.combine_chunks().equals(_lexsort_dedup(table).combine_chunks())


def test_by_series_declines_a_series_out_of_time_order() -> None:
    sid = pa.chunked_array([pa.array([5, 3, 5, 3], pa.int64())])
    assert fmt._by_series(sid, np.array([1, 2, 3, 4])) is not None
    assert fmt._by_series(sid, np.array([3, 2, 1, 4])) is None


def test_delta_bytes_each_is_delta_bytes_per_run() -> None:
    rng = np.random.default_rng(1)
    for _ in range(100):
        lengths = rng.integers(1, 400, int(rng.integers(1, 20)))
        runs = [
            rng.integers(-(10**12), 10**12, n)
            if rng.random() < 0.5
            else np.cumsum(rng.integers(0, 5, n))
            for n in lengths
        ]
        x = np.concatenate(runs).astype(np.int64)
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        each = fmt._delta_bytes_each(x, starts, lengths)
        for k, run in enumerate(runs):
            assert each[k] == (fmt._delta_bytes(run.astype(np.int64)) if len(run) > 1 else 0.0)


def _split_by_shape_per_series(sid: np.ndarray, ints: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The split as it was written first: a loop sizing each series both ways."""
    values = ints.to_numpy(zero_copy_only=False)
    valid = ~np.isnan(values) if ints.null_count else np.ones(len(values), bool)
    whole = np.where(valid, values, 0).astype(np.int64)
    to_bss = np.zeros(len(whole), bool)
    starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(sid)], strict=True):
        x = whole[a:b][valid[a:b]]
        if len(x) >= 64 and fmt._bss_bytes(x) < fmt._delta_bytes(x):
            to_bss[a:b] = True
    keep = valid & ~to_bss
    return pa.array(whole, mask=~keep), pa.array(whole, mask=~(valid & to_bss))


def test_split_by_shape_routes_series_as_the_loop_did() -> None:
    rng = np.random.default_rng(3)
    chose_delta = chose_bss = False
    for _ in range(150):
        lengths = rng.integers(1, 400, int(rng.integers(1, 30)))
        sid = np.repeat(np.arange(len(lengths)), lengths)
        parts = [
            rng.integers(-(10 ** rng.integers(1, 15)), 10 ** rng.integers(1, 15), n)
            if rng.random() < 0.5
            else np.cumsum(rng.integers(0, 5, n))
            for n in lengths
        ]
        mask = rng.random(len(sid)) < rng.choice([0, 0.1, 0.9])
        ints = pa.array(np.concatenate(parts).astype(np.int64), mask=mask)
        delta, bss = fmt._split_by_shape(sid, ints)
        want_delta, want_bss = _split_by_shape_per_series(sid, ints)
        assert delta.equals(want_delta) and bss.equals(want_bss)
        chose_delta |= delta.null_count < len(delta)
        chose_bss |= bss.null_count < len(bss)
    assert chose_delta and chose_bss  # the inputs made both encodings win somewhere


def test_distinct_is_unique() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = rng.integers(
            -(10 ** rng.integers(1, 12)), 10 ** rng.integers(1, 12), rng.integers(0, 500)
        )
        got, want = _distinct(v), np.unique(v)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_file_at_the_flush_level_reads_the_same() -> None:
    rng = np.random.default_rng(4)
    n = 5000
    table = pa.table(
        {
            "series_id": np.repeat(np.arange(10, dtype=np.int64), n // 10),
            "ts": np.tile(np.arange(n // 10, dtype=np.int64) * 5000, 10),
            "value": rng.normal(50, 10, n).round(2),
        }
    )
    fast = fmt.write_parquet(table, fmt.RAW_FLOATS, zstd_level=fmt.FLUSH_ZSTD_LEVEL)
    slow = fmt.write_parquet(table, fmt.RAW_FLOATS)
    for data in (fast, slow):
        assert fmt.read_parquet(io.BytesIO(data), fmt.RAW_FLOATS).equals(table)
    assert (
        pq.ParquetFile(io.BytesIO(fast)).schema_arrow
        == pq.ParquetFile(io.BytesIO(slow)).schema_arrow
    )


def test_a_flush_into_a_closed_day_is_written_at_the_compaction_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfilled day may never get a second file to merge with, so it is not left at the
    flusher's fast level; today's flush is (compaction rewrites it once the day closes)."""
    levels: list[int] = []
    write = fmt.write_parquet

    def recording(table: pa.Table, cols: tuple[str, ...], zstd_level: int = 0) -> bytes:
        levels.append(zstd_level)
        return write(table, cols, zstd_level=zstd_level)

    monkeypatch.setattr(fmt, "write_parquet", recording)
    now = int(time.time() * 1000)
    with Vault.open_local(str(tmp_path / "v")) as vault:
        for ts in (now - 30 * 86_400_000, now):
            vault.write(pd.DataFrame({"metric": ["m"], "ts": [ts], "value": [1.0]}))
            vault.flush()
    assert levels == [fmt.ZSTD_LEVEL, fmt.FLUSH_ZSTD_LEVEL]
