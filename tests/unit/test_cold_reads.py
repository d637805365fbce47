"""A fresh process's first reads: the same answers however little of a row group they decode.

The first query of a few series in a row group not read before decodes only their rows and
keeps the group as stored; a later query decodes it whole. Every step of that (first, second,
third query; a few series then all of them) must answer exactly what was written.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from metricvault import Vault
from metricvault.store.reader import SMALL_PART

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
H = 3_600_000
SERIES = 8 * SMALL_PART  # one series is far under a quarter of a group
SAMPLES = 240  # 20 minutes at 5 s


def _value(gpu: int, i: int) -> float:
    return [0.5 * i + gpu, float("nan"), -0.0, 1e300][i % 7] if i % 7 < 4 else float(i % 13)


def _temp(gpu: int, i: int) -> float:
    """Whole degrees, constant for a while: rollups store them as scaled integers, sums and
    maxima as distances from the minimum (the files' integer forms)."""
    return float(30 + (gpu * 7 + i // 24 * 3) % 17 + (i % 5 == 0))


def _rows() -> list[tuple[str, dict[str, str], int, float]]:
    return [
        (metric, {"gpu": str(g)}, T0 + i * 5000, value(g, i))
        for metric, value in (("gpu_util", _value), ("gpu_temp", _temp))
        for g in range(SERIES)
        for i in range(SAMPLES)
    ]


@pytest.fixture
def stored(tmp_path):
    """A maintained vault: raw and rollup files whose one row group holds every series."""
    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        v.write(_rows())
        v.maintain(now_ms=T0 + 3 * H)
    return path


def _expected_raw(gpu: int) -> np.ndarray:
    return np.array([_value(gpu, i) for i in range(SAMPLES)])


QUERIES = [  # (name, selector, step, aggs)
    ("raw one series", 'gpu_util{gpu="3"}', None, ("mean",)),
    ("1m one series", 'gpu_util{gpu="3"}', "1m", ("mean", "max", "count", "last")),
    ("1m two series", 'gpu_util{gpu=~"3|17"}', "1m", ("sum", "min")),
    ("whole range one series", 'gpu_util{gpu="5"}', "all", ("mean", "max")),
    ("1m one series' increase", 'gpu_util{gpu="3"}', "1m", ("increase",)),
    ("1m one series' min and last", 'gpu_util{gpu="7"}', "1m", ("min", "last")),
    ("10m one series' count", 'gpu_util{gpu="2"}', "10m", ("count",)),
]


@pytest.mark.parametrize(("name", "selector", "step", "aggs"), QUERIES, ids=[q[0] for q in QUERIES])
def test_first_second_and_later_reads_answer_the_same(stored, name, selector, step, aggs):
    with Vault.open_local(stored) as reference:  # decodes whole groups: asks for every series
        everything = reference.query("gpu_util", T0, T0 + H, step=step, aggs=aggs)
    wanted = everything[everything["gpu"].isin(_gpus(selector))].reset_index(drop=True)
    with Vault.open_local(stored) as fresh:
        answers = [fresh.query(selector, T0, T0 + H, step=step, aggs=aggs) for _ in range(3)]
        after = fresh.query("gpu_util", T0, T0 + H, step=step, aggs=aggs)
    for answer in answers:
        pd.testing.assert_frame_equal(answer.reset_index(drop=True), wanted)
    pd.testing.assert_frame_equal(after, everything)


def _gpus(selector: str) -> list[str]:
    return selector.split('"')[1].split("|")


def test_a_fresh_vaults_first_raw_read_is_bit_exact(stored):
    with Vault.open_local(stored) as fresh:
        first = fresh.query('gpu_util{gpu="3"}', T0, T0 + H)
    got = first["value"].to_numpy()
    want = _expected_raw(3)
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist()  # NaN and -0.0 bits too


def test_first_read_of_a_few_series_keeps_their_rows_and_the_group_stored(stored):
    with Vault.open_local(stored) as fresh:
        fresh.query('gpu_util{gpu="3"}', T0, T0 + H)
        kinds = {(key[2], key[3], bool(key[4])) for key in fresh.reader.cache._items}
        # raw: the group as stored and these series' decoded rows, nothing decoded whole yet
        assert kinds == {(False, False, False), (True, False, True)}
        fresh.query('gpu_util{gpu="3"}', T0, T0 + H)  # the same series: their rows again
        assert {(key[2], key[3], bool(key[4])) for key in fresh.reader.cache._items} == kinds
        fresh.query('gpu_util{gpu="1"}', T0, T0 + H)  # others: the group decoded whole
        kinds = {(key[2], key[3], bool(key[4])) for key in fresh.reader.cache._items}
        assert (True, False, False) in kinds and (False, False, False) not in kinds


def test_a_quantile_after_a_read_without_sketches_reads_them(stored):
    aggs = ("p95", "mean", "stddev")
    with Vault.open_local(stored) as reference:
        want = reference.query('gpu_util{gpu="3"}', T0, T0 + H, step="10m", aggs=aggs)
    with Vault.open_local(stored) as fresh:
        fresh.query('gpu_util{gpu="3"}', T0, T0 + H, step="10m", aggs=("mean",))  # no sketch
        fresh.query("gpu_util", T0, T0 + H, step="10m", aggs=("max",))  # decoded, no sketch
        got = fresh.query('gpu_util{gpu="3"}', T0, T0 + H, step="10m", aggs=aggs)
    assert want["p95"].notna().any()
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize(
    ("name", "selector", "step", "aggs"), QUERIES[1:], ids=[q[0] for q in QUERIES[1:]]
)
def test_aggregates_read_without_sketches_equal_those_read_with_them(
    stored, name, selector, step, aggs
):
    with Vault.open_local(stored) as fresh:
        lean = fresh.query(selector, T0, T0 + H, step=step, aggs=aggs)
    with Vault.open_local(stored) as fresh:  # a quantile: the rollup rows are read whole
        full = fresh.query(selector, T0, T0 + H, step=step, aggs=(*aggs, "p50"))
    pd.testing.assert_frame_equal(lean, full.drop(columns=["p50"]))


def test_a_first_read_of_a_few_series_reads_only_the_columns_asked(stored):
    """The first mean of one series reads its rows with only the rollup columns a mean uses
    (kept apart in the cache); other aggregates of the same series then read theirs, and
    every answer is the one a vault that decoded whole groups gives."""
    asked = [("mean",), ("max",), ("last", "count"), ("increase", "sum"), ("mean", "min")]
    for metric in ("gpu_util", "gpu_temp"):  # floats; integers (stored as distances)
        with Vault.open_local(stored) as reference:
            want = [reference.query(metric, T0, T0 + H, step="1m", aggs=a) for a in asked]
        with Vault.open_local(stored) as fresh:
            one_gpu = metric + '{gpu="4"}'
            got = [fresh.query(one_gpu, T0, T0 + H, step="1m", aggs=a) for a in asked]
            parts = [key[4] for key in fresh.reader.cache._items if b"|" in key[4]]
        assert any(part.endswith(b"|count,series_id,sum,ts") for part in parts)
        for answer, everything in zip(got, want, strict=True):
            one = everything[everything["gpu"] == "4"].reset_index(drop=True)
            pd.testing.assert_frame_equal(answer.reset_index(drop=True), one)


def test_integer_rollups_first_read_as_written(stored):
    """Whole degrees are stored in the integer forms (sums as distances from count x min):
    a fresh vault's first 1m mean and max of one GPU are the raw samples' own."""
    import glob

    import pyarrow.parquet as pq

    minute = glob.glob(f"{stored}/data/1m/*/*.parquet")
    assert minute and any(
        "sum_j" in t.column_names and t["sum_j"].null_count < len(t)
        for t in map(pq.read_table, minute)
    )  # the integer form is what this test reads
    with Vault.open_local(stored) as fresh:
        got = fresh.query('gpu_temp{gpu="4"}', T0, T0 + H, step="1m", aggs=["mean", "max"])
    samples = np.array([_temp(4, i) for i in range(SAMPLES)]).reshape(-1, 12)
    assert got["mean"].tolist() == (samples.sum(axis=1) / 12).tolist()
    assert got["max"].tolist() == samples.max(axis=1).tolist()


def _sparse_rows() -> list[tuple[str, dict[str, str], int, float]]:
    """One series over the whole hour, 200 others over its first two minutes only: the 1m
    group's footer spans 60 buckets, yet a sparse series holds 2 rows of its 460."""
    dense = [("load", {"n": "dense"}, T0 + i * 5000, float(i % 9)) for i in range(720)]
    sparse = [
        ("load", {"n": f"s{n}"}, T0 + i * 5000, float(n + i)) for n in range(200) for i in range(24)
    ]
    return dense + sparse


@pytest.mark.parametrize(
    ("selector", "reads"),
    [('load{n="s5"}', 1), ('load{n="dense"}', 1), ('load{n=~"s[0-9]"}', 2)],
    ids=["one sparse series", "the dense series", "ten sparse series"],
)
def test_a_first_rollup_read_reads_the_keys_only_where_the_footer_cannot_bound_the_part(
    tmp_path, monkeypatch, selector, reads
):
    """Where the group's footer bounds the series' rows under a quarter (one row per bucket
    between its first and last bucket), the first read of their part is one read of the
    columns asked; else the keys are read first to find their share. The same answer."""
    import pyarrow.parquet as pq

    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        v.write(_sparse_rows())
        v.maintain(now_ms=T0 + 3 * H)
    with Vault.open_local(path) as reference:
        everything = reference.query("load", T0, T0 + H, step="1m", aggs=("mean",))
    calls: list[list[str] | None] = []
    threads: list[bool] = []
    read_row_group = pq.ParquetFile.read_row_group

    def counted(self, i, columns=None, **kwargs):
        calls.append(columns)
        threads.append(kwargs.get("use_threads", True))
        return read_row_group(self, i, columns, **kwargs)

    with Vault.open_local(path) as fresh:
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
        got = fresh.query(selector, T0, T0 + H, step="1m", aggs=("mean",))
        monkeypatch.undo()
    assert len(calls) == reads
    assert calls[-1] is not None and "sum_f" in calls[-1] and "max_f" not in calls[-1]
    assert not any(threads)  # a group of 460 rows: decoded on this thread, not Arrow's pool
    wanted = everything[everything["n"].str.fullmatch(selector.split('"')[1])]
    assert len(got) and len(got) == len(wanted)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), wanted.reset_index(drop=True))


@pytest.mark.parametrize(("step", "merged"), [("1m", False), ("10m", True), ("1h", False)])
def test_a_first_rollup_read_takes_the_merge_columns_only_for_a_merge(
    stored, monkeypatch, step, merged
):
    """Rows that are their bucket's only part (a tier's own step) are answered without the
    columns a merge orders and sums them by (bucket ends, NaN counts); a coarser step reads
    them. Both answer what a vault that decoded whole groups answers, ``last`` included."""
    import pyarrow.parquet as pq

    aggs = ("mean", "last", "count")
    with Vault.open_local(stored) as reference:
        everything = reference.query("gpu_util", T0, T0 + H, step=step, aggs=aggs)
    calls: list[list[str]] = []
    read_row_group = pq.ParquetFile.read_row_group

    def counted(self, i, columns=None, **kwargs):
        calls.append(list(columns or []))
        return read_row_group(self, i, columns, **kwargs)

    with Vault.open_local(stored) as fresh:
        monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
        got = fresh.query('gpu_util{gpu="3"}', T0, T0 + H, step=step, aggs=aggs)
        monkeypatch.undo()
    rollup_reads = [c for c in calls if "sum_f" in c]
    assert rollup_reads and all(("nonfinite" in c) == merged for c in rollup_reads)
    assert all("last_ts" in c for c in rollup_reads)  # asked: the time of the last sample
    wanted = everything[everything["gpu"] == "3"].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), wanted)
