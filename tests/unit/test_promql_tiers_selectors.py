"""Plain selectors within raw retention from the rollup rows (docs/decisions/0004): on
whole-minute steps of a minute or more, the rows' first and last samples hold the newest
sample at or before every evaluation time, so the answer is the raw path's, bit for bit;
anywhere else (steps off the minute, NaN samples, staleness markers) raw samples answer."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from metricvault.model import STALE_NAN_BITS
from metricvault.promql import Engine, EngineOptions
from metricvault.promql.values import QueryResult

HOUR = 3_600_000
MIN = 60_000
T0 = (1_700_000_000_000 // (24 * HOUR)) * 24 * HOUR
SPAN = 8 * HOUR
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]


def _series(rng: np.random.Generator, interval_ms: int, jitter_ms: int) -> np.ndarray:
    """Scrape times with jitter (some exactly on minute boundaries) and random gaps longer
    and shorter than the 5-minute lookback."""
    ts = T0 + np.arange(0, SPAN, interval_ms)
    if jitter_ms:
        ts = ts + rng.integers(0, jitter_ms, ts.size) * (rng.random(ts.size) < 0.7)
    keep = np.ones(ts.size, dtype=bool)
    for _ in range(6):
        a = int(rng.integers(0, ts.size))
        keep[a : a + int(rng.integers(2, 150))] = False
    return np.unique(ts[keep])


def _workload(seed: int) -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for gpu in range(3):
        ts = _series(rng, 5_000, 900 if gpu else 0)
        out.append(("util", {"gpu": str(gpu)}, ts, np.round(rng.uniform(0, 100, ts.size), 1)))
        ts = _series(rng, 4_000, 1_500)
        out.append(("power", {"gpu": str(gpu)}, ts, np.round(rng.uniform(50, 700, ts.size), 2)))
    ts = _series(rng, 30_000, 0)[: SPAN // 60_000]  # stops halfway: a series that ended
    out.append(("util", {"gpu": "ended"}, ts, np.round(rng.uniform(0, 100, ts.size), 1)))
    return out


def _open(path: Path, workload: list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]) -> Any:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(path))
    rows = []
    for metric, labels, ts, values in workload:
        rows += [(metric, labels, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.maintain(now_ms=T0 + SPAN + 2 * HOUR)  # every hour rolled up, raw kept
    assert vault.catalog_version().rollup_watermark_ms() is None
    return vault


@pytest.fixture(scope="module", params=[1, 2])
def vault(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    v = _open(tmp_path_factory.mktemp("sel") / "vault", _workload(request.param))
    yield v
    v.close()


def _identical(got: QueryResult, want: QueryResult) -> None:
    """The same series, times and values (==, NaN only where both are)."""
    assert [s[0] for s in got.series] == [s[0] for s in want.series]
    for (labels, gt, gv), (_, wt, wv) in zip(got.series, want.series, strict=True):
        assert gt.tolist() == wt.tolist(), labels
        assert np.array_equal(gv, wv, equal_nan=True), labels


def _both(vault: Any, expr: str, start: int, end: int, step: int) -> tuple[QueryResult, ...]:
    rows = Engine(vault).evaluate(expr, start, end, step)
    raw = Engine(vault, EngineOptions(selector_rows=False)).evaluate(expr, start, end, step)
    return rows, raw


EXACT = [
    ("util", MIN, "1m"),
    ("util", 5 * MIN, "1m"),
    ("power", 7 * MIN, "1m"),
    ("timestamp(util)", 2 * MIN, "1m"),
    ('util{gpu="ended"}', 3 * MIN, "1m"),
    ("util offset 10m", 5 * MIN, "1m"),
    ("power offset 1h", HOUR, "1h"),
    ("util", HOUR, "1h"),
    ("max by (gpu) (power) > 300", 10 * MIN, "1m"),
    ("count(util > 50)", 2 * MIN, "1m"),
]


@pytest.mark.parametrize(("expr", "step", "tier"), EXACT)
def test_plain_selectors_on_whole_minute_steps_are_the_raw_answer(
    vault: Any, expr: str, step: int, tier: str
) -> None:
    start, end = T0 + 2 * HOUR, T0 + SPAN
    rows, raw = _both(vault, expr, start, end, step)
    _identical(rows, raw)
    assert rows.served_by == {tier}, rows.served_by
    assert raw.served_by == set()
    assert rows.warnings == []


UNALIGNED = [
    ("util", 30_000, T0 + 2 * HOUR),  # a step under a minute
    ("util", 90_000, T0 + 2 * HOUR),  # a step that is not whole minutes
    ("util", 5 * MIN, T0 + 2 * HOUR + 7_000),  # times off the minute
    ("util offset 20s", 5 * MIN, T0 + 2 * HOUR),  # an offset moving them off it
    (f"util @ {(T0 + 3 * HOUR) // 1000}", 5 * MIN, T0 + 2 * HOUR),  # one pinned time
]


@pytest.mark.parametrize(("expr", "step", "start"), UNALIGNED)
def test_plain_selectors_off_whole_minutes_read_raw_samples(
    vault: Any, expr: str, step: int, start: int
) -> None:
    rows, raw = _both(vault, expr, start, T0 + SPAN, step)
    _identical(rows, raw)
    assert rows.served_by == set()


def test_an_hour_step_off_the_hour_reads_minute_rows(vault: Any) -> None:
    start = T0 + 2 * HOUR + 17 * MIN
    rows, raw = _both(vault, "util", start, T0 + SPAN, HOUR)
    _identical(rows, raw)
    assert rows.served_by == {"1m"}


def test_selector_reads_count_only_the_samples_they_take(vault: Any) -> None:
    """The rows' read is what the query's sample limit counts: a 5 s scrape read from 1m
    rows needs about a twelfth of the raw samples; the raw read of an instant selector
    only the newest sample at or before each step (store/selecting.instant_times), so a
    limit under the raw samples of the range passes both, with the same answer."""
    start, end = T0 + 2 * HOUR, T0 + SPAN
    limit = EngineOptions(max_samples=1_000)
    got = Engine(vault, limit).evaluate('util{gpu="0"}', start, end, 10 * MIN)
    assert got.served_by == {"1m"}
    no_rows = EngineOptions(max_samples=1_000, selector_rows=False)
    raw = Engine(vault, no_rows).evaluate('util{gpu="0"}', start, end, 10 * MIN)
    _identical(got, raw)


def test_rows_summarising_few_samples_are_not_read_for_selectors(tmp_path: Path) -> None:
    """At a 15 s scrape a 1m row holds 4 samples: reading raw samples is the quicker read."""
    rng = np.random.default_rng(5)
    ts = _series(rng, 15_000, 0)
    vault = _open(tmp_path / "vault", [("util", {}, ts, np.round(rng.uniform(0, 9, ts.size)))])
    try:
        rows, raw = _both(vault, "util", T0 + 2 * HOUR, T0 + SPAN, 5 * MIN)
        _identical(rows, raw)
        assert rows.served_by == set()
    finally:
        vault.close()


@pytest.mark.parametrize("bad", ["stale", "nan", "inf"])
def test_a_nan_or_staleness_marker_makes_selectors_read_raw(tmp_path: Path, bad: str) -> None:
    """Rows keep no staleness marker (it ends a series) and no NaN sample (a value): where
    the raw samples may hold one, the answer comes from them, as Prometheus's does."""
    workload = _workload(3)
    metric, labels, ts, values = workload[0]
    values = values.copy()
    marker = {"stale": STALE, "nan": float("nan"), "inf": float("inf")}[bad]
    at = int(np.searchsorted(ts, T0 + 4 * HOUR))
    values[at] = marker  # the series then restarts after a few minutes of nothing
    keep = (ts <= ts[at]) | (ts > ts[at] + 4 * MIN)
    workload[0] = (metric, labels, ts[keep], values[keep])
    vault = _open(tmp_path / "vault", workload)
    try:
        for expr in ("util", 'util{gpu="0"}', "timestamp(util)"):
            rows, raw = _both(vault, expr, T0 + 3 * HOUR, T0 + 5 * HOUR, MIN)
            _identical(rows, raw)
            assert rows.served_by == set()
    finally:
        vault.close()
