"""An instant selector's raw read keeps, per series, only the newest sample at or before each
evaluation time (store/reader.newest_at, store/selecting.instant_times): answers must be
the ones every raw sample gives, bit for bit, whatever the lookback, with staleness markers,
NaN, ±Inf, gaps, duplicates across overlapping files (later writes win), offsets, ``@`` and
subqueries."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from metricvault.model import STALE_NAN_BITS
from metricvault.promql import Engine, EngineOptions
from metricvault.protocols import SelectHints
from metricvault.selector import Matcher
from metricvault.store.reader import newest_at
from metricvault.store.selecting import instant_times

HOUR = 3_600_000
MIN = 60_000
T0 = (1_700_000_000_000 // (24 * HOUR)) * 24 * HOUR
SPAN = 6 * HOUR
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]


def _brute(sid: np.ndarray, ts: np.ndarray, ids: Any, at: np.ndarray, lo: int, hi: int) -> set:
    keep = set()
    for s in np.unique(sid) if ids is None else ids:
        mine = np.flatnonzero((sid == s) & (ts >= lo) & (ts < hi))
        for t in at:
            before = mine[ts[mine] <= t]
            if before.size:
                keep.add(int(before[-1]))
    return keep


@pytest.mark.parametrize("seed", range(6))
def test_newest_at_keeps_exactly_the_newest_row_at_or_before_each_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sid = np.sort(rng.choice([-(2**62), -5, 3, 7, 2**62], 400))
    ts = np.concatenate(
        [np.sort(rng.choice(10_000, (sid == s).sum(), replace=False)) for s in np.unique(sid)]
    ).astype(np.int64)
    table = pa.table({"series_id": sid, "ts": ts, "value": np.arange(sid.size, dtype=float)})
    at = np.unique(rng.integers(-100, 10_100, int(rng.integers(1, 60)))).astype(np.int64)
    lo, hi = int(rng.integers(-50, 3_000)), int(rng.integers(7_000, 10_050))
    for ids in (None, np.asarray([-5, 7, 11], np.int64)):
        got = newest_at(table, ids, at, lo, hi)
        want = _brute(sid, ts, ids, at, lo, hi)
        assert sorted(got["value"].to_numpy().astype(int).tolist()) == sorted(want)
        # kept part by part (row groups, files), the newest of the whole are among them
        cut = int(rng.integers(1, sid.size))
        parts = [newest_at(table.slice(0, cut), ids, at, lo, hi)]
        parts.append(newest_at(table.slice(cut), ids, at, lo, hi))
        kept = set(pa.concat_tables(parts)["value"].to_numpy().astype(int).tolist())
        assert want <= kept


def test_instant_times_only_for_instant_selectors() -> None:
    grid = SelectHints(None, 0, MIN, T0, T0 + 10 * MIN)
    times = instant_times(grid, T0 - 5 * MIN, T0 + 10 * MIN)
    assert times is not None and times.tolist() == [T0 + i * MIN for i in range(11)]
    one = instant_times(SelectHints(None, 0, 0, T0, T0), T0 - MIN, T0)
    assert one is not None and one.tolist() == [T0]
    assert instant_times(SelectHints(None, 5 * MIN, MIN, T0, T0 + MIN), T0, T0 + MIN) is None
    assert instant_times(SelectHints("rate", 0, MIN, T0, T0 + MIN), T0, T0 + MIN) is None
    assert instant_times(None, T0, T0 + MIN) is None


class AllSamples:
    """The vault as a source that reads every raw sample of a selection (no hints, no
    rollups): the answers to compare with."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def select(self, matchers: Sequence[Matcher], lo: int, hi: int, hints: Any = None) -> list[Any]:
        return list(self.inner.select(matchers, lo, hi))

    def select_buckets(self, matchers: Sequence[Matcher], hints: SelectHints) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _workload(rng: np.random.Generator) -> list[tuple[str, dict[str, str], int, float]]:
    rows = []
    for gpu in range(4):
        interval = (15_000, 15_000, 10_000, 60_000)[gpu]
        ts = T0 + np.arange(0, SPAN, interval) + rng.integers(0, 3_000, SPAN // interval)
        keep = rng.random(ts.size) > 0.05
        for _ in range(4):  # gaps longer and shorter than the lookbacks
            a = int(rng.integers(0, ts.size))
            keep[a : a + int(rng.integers(2, 80))] = False
        ts = np.unique(ts[keep])
        values = np.round(rng.uniform(0, 100, ts.size), 1)
        special = rng.random(ts.size)
        values[special < 0.01] = STALE
        values[(special >= 0.01) & (special < 0.015)] = np.nan
        values[(special >= 0.015) & (special < 0.02)] = np.inf
        values[(special >= 0.02) & (special < 0.025)] = -np.inf
        labels = {"gpu": str(gpu)}
        rows += [("util", labels, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    return rows


@pytest.fixture(scope="module", params=["maintained", "overlapping"])
def vault(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from metricvault.store.vault import Vault

    rng = np.random.default_rng(7)
    v = Vault.open_local(str(tmp_path_factory.mktemp("inst") / "vault"))
    rows = _workload(rng)
    if request.param == "maintained":
        v.write(rows)
        v.maintain(now_ms=T0 + SPAN + 2 * HOUR)
    else:  # several flushes over the same hours, some samples written again with new values
        order = rng.permutation(len(rows))
        for part in np.array_split(order, 3):
            v.write([rows[i] for i in sorted(part)])
            v.flush()
        again = rng.choice(len(rows), 300, replace=False)
        v.write([(*rows[i][:3], float(rng.uniform(200, 300))) for i in sorted(again)])
        v.flush()
        assert len(v.snapshot().tier_files("raw")) > 1
    yield v
    v.close()


EXPRS = [
    "util",
    'util{gpu="1"}',
    "timestamp(util)",
    "util offset 7m",
    "util > 50",
    "sum by (gpu) (util)",
    "max_over_time(util[30m:1m])",
    f"util @ {(T0 + 3 * HOUR) // 1000}",
]


@pytest.mark.parametrize("expr", EXPRS)
@pytest.mark.parametrize(
    ("step", "start", "lookback"),
    [
        (20 * MIN, T0 + 20 * MIN, 5 * MIN),
        (MIN, T0 + 31 * MIN, 5 * MIN),
        (15_000, T0 + 7_000, 5 * MIN),
        (7 * MIN + 3_000, T0 + HOUR + 1, 30_000),
        (10 * MIN, T0 + 2 * HOUR, 40 * MIN),
    ],
)
def test_instant_selectors_read_raw_answer_as_every_sample_does(
    vault: Any, expr: str, step: int, start: int, lookback: int
) -> None:
    options = EngineOptions(selector_rows=False, lookback_delta_ms=lookback)
    end = T0 + SPAN + 10 * MIN
    got = Engine(vault, options).evaluate(expr, start, end, step)
    want = Engine(AllSamples(vault), options).evaluate(expr, start, end, step)
    assert [s[0] for s in got.series] == [s[0] for s in want.series]
    for (labels, gt, gv), (_, wt, wv) in zip(got.series, want.series, strict=True):
        assert gt.tolist() == wt.tolist(), labels
        assert gv.view(np.int64).tolist() == wv.view(np.int64).tolist(), labels  # NaN bits


def test_an_instant_query_reads_as_every_sample_does(vault: Any) -> None:
    options = EngineOptions(selector_rows=False)
    for t in (T0 + HOUR + 17, T0 + SPAN - MIN, T0 + SPAN + 4 * MIN):
        got = Engine(vault, options).evaluate("util", t)
        want = Engine(AllSamples(vault), options).evaluate("util", t)
        assert [(a, t.tolist(), v.view(np.int64).tolist()) for a, t, v in got.series] == [
            (a, t.tolist(), v.view(np.int64).tolist()) for a, t, v in want.series
        ]


def test_instant_reads_keep_fewer_samples(tmp_path: Path) -> None:
    from metricvault.store.vault import Vault

    with Vault.open_local(str(tmp_path / "vault")) as v:
        v.write([("m", {}, T0 + i * 15_000, float(i)) for i in range(4 * 60 * 6)])
        hints = SelectHints(None, 0, 20 * MIN, T0 + 20 * MIN, T0 + 6 * HOUR)
        matchers = [Matcher("__name__", "=", "m")]
        picked = v.select(matchers, T0 + 15 * MIN, T0 + 6 * HOUR, hints)
        every = v.select(matchers, T0 + 15 * MIN, T0 + 6 * HOUR)
    last = T0 + (4 * 60 * 6 - 1) * 15_000
    steps = T0 + 20 * MIN * np.arange(1, 19)
    assert picked[0].ts.tolist() == np.minimum(steps // 15_000 * 15_000, last).tolist()
    assert picked[0].ts.size < every[0].ts.size
