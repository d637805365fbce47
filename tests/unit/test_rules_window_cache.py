"""A rule's long window kept between evaluations (promql/window_cache.py) answers what the
uncached rollup path answers for the same window, evaluation after evaluation: as the window
slides, after newer samples, after late samples, after maintenance, across an hour (sliding its
whole hours, not reading them again), and for a series that appears in the window's newest
minutes or leaves it at its start, with NaN samples among the others."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from metricvault.promql import Engine
from metricvault.promql.eval import EngineOptions

HOUR = 3_600_000
MIN = 60_000
DAY = 24 * HOUR
T0 = (1_700_000_000_000 // DAY) * DAY
SPAN = 3 * DAY
NOW = T0 + SPAN
STEP = 30_000  # a rule group's interval
OFFSET = 7_000  # its offset: evaluation times are never whole minutes
EXPRS = (
    "avg_over_time(gpu_util[2d])",
    "sum_over_time(gpu_util[2d])",
    "count_over_time(gpu_util[2d])",
    "min_over_time(gpu_util[2d])",
    "max_over_time(gpu_util[2d])",
    "quantile_over_time(0.9, gpu_util[2d])",
    "quantile_over_time(0, gpu_util[47h30m])",
)


def _rows(start: int, end: int, gpus: int = 3, seed: int = 5) -> list[Any]:
    rng = np.random.default_rng(seed)
    ts = np.arange(start, end, MIN)
    rows = []
    for gpu in range(gpus):
        util = np.round(rng.uniform(0, 100, ts.size), 1)
        rows += [
            ("gpu_util", {"gpu": str(gpu)}, int(t), float(v)) for t, v in zip(ts, util, strict=True)
        ]
    return rows


@pytest.fixture
def vault(tmp_path: Any) -> Iterator[Any]:
    from metricvault.store.vault import Vault

    v = Vault.open_local(str(tmp_path / "v"), retention_raw="1d")
    v.write(_rows(T0, NOW))
    v.maintain(now_ms=NOW)
    assert v.catalog_version().raw_horizon_ms > T0 + DAY  # the window starts before it
    yield v
    v.close()


def _answers(engine: Engine, expr: str, at: int) -> dict[tuple[tuple[str, str], ...], float]:
    result = engine.evaluate(expr, at)
    assert result.result_type == "vector"
    return {tuple(sorted(labels.items())): float(vs[0]) for labels, _, vs in result.series}


def _same(cached: Engine, plain: Engine, at: int, exprs: tuple[str, ...] = EXPRS) -> None:
    for expr in exprs:
        got, want = _answers(cached, expr, at), _answers(plain, expr, at)
        assert got.keys() == want.keys(), expr
        assert want, expr
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=0), (expr, key)


def _engines(vault: Any) -> tuple[Engine, Engine]:
    return Engine(vault), Engine(vault, EngineOptions(window_cache=False))


def test_a_kept_window_answers_as_the_rows_do_while_it_slides(vault):
    cached, plain = _engines(vault)
    start = NOW - 20 * MIN + OFFSET
    for i in range(6):
        _same(cached, plain, start + i * STEP)
    assert cached.windows is not None
    assert cached.windows.updates >= 5 * 3  # later evaluations came from the kept entries
    assert cached.windows.builds <= 3 * 2  # one entry per window length and kind, at most twice


def test_the_kept_window_is_served_from_hour_rows_with_the_rows_warnings(vault):
    cached, plain = _engines(vault)
    at = NOW - 20 * MIN + OFFSET
    for expr in EXPRS:
        for _ in range(2):  # the second one from the kept entry
            got = cached.evaluate(expr, at)
        want = plain.evaluate(expr, at)
        assert "1h" in got.served_by and "1m" in got.served_by
        assert got.warnings == want.warnings


def test_newer_samples_extend_the_kept_window_without_reading_it_again(vault):
    cached, plain = _engines(vault)
    builds = 0
    for i in range(6):  # the next minute's samples, then an evaluation after them
        vault.write(_rows(NOW + i * MIN, NOW + (i + 1) * MIN, seed=10 + i))
        _same(cached, plain, NOW + i * MIN + STEP + OFFSET)
        if i == 1:  # the window's start just left a whole hour: its hours stay from here on
            builds = cached.windows.builds if cached.windows else 0
    assert cached.windows is not None and cached.windows.builds == builds
    assert cached.windows.invalidated == 0


def test_late_samples_inside_the_window_are_in_the_next_answer(vault):
    cached, plain = _engines(vault)
    at = NOW - 20 * MIN + OFFSET
    _same(cached, plain, at)
    # within raw retention, in the whole hours the entry holds: extreme values, so a stale
    # answer shows in the max, the sum and the quantiles
    late = NOW - 12 * HOUR + 30_000
    vault.write([("gpu_util", {"gpu": str(g)}, late, 1e6) for g in range(3)])
    _same(cached, plain, at + STEP)
    assert cached.windows is not None and cached.windows.invalidated >= 1
    assert _answers(cached, "max_over_time(gpu_util[2d])", at + STEP) == {
        (("gpu", str(g)),): 1e6 for g in range(3)
    }


def test_maintenance_drops_the_kept_window(vault):
    cached, plain = _engines(vault)
    at = NOW - 20 * MIN + OFFSET
    _same(cached, plain, at)
    vault.write([("gpu_util", {"gpu": "1"}, NOW - 20 * HOUR, -5.0)])  # late, a rolled-up hour
    vault.write(_rows(NOW, NOW + 10 * MIN, seed=3))
    vault.maintain(now_ms=NOW + 10 * MIN)
    invalidated = cached.windows.invalidated if cached.windows else 0
    _same(cached, plain, at + STEP)
    _same(cached, plain, NOW + 5 * MIN + OFFSET)
    assert cached.windows is not None and cached.windows.invalidated > invalidated


def test_a_window_that_crosses_an_hour_answers_as_the_rows_do(vault):
    cached, plain = _engines(vault)
    vault.write(_rows(NOW, NOW + HOUR, seed=4))
    before_hour = NOW + HOUR - 2 * MIN + OFFSET
    for i in range(10):  # from two minutes before a whole hour to three after
        _same(cached, plain, before_hour + i * STEP)


def test_a_series_new_in_the_newest_minutes_joins_the_kept_window(vault):
    cached, plain = _engines(vault)
    at = NOW - 2 * MIN + OFFSET
    _same(cached, plain, at)
    vault.write(_rows(NOW, NOW + 2 * MIN, gpus=4, seed=8))  # gpu 3 is new
    _same(cached, plain, NOW + 2 * MIN + OFFSET)
    assert (("gpu", "3"),) in _answers(cached, "avg_over_time(gpu_util[2d])", NOW + 2 * MIN)


def test_range_queries_and_short_windows_take_the_ordinary_path(vault):
    cached, _ = _engines(vault)
    cached.evaluate("avg_over_time(gpu_util[2d])", NOW - HOUR, NOW, 5 * MIN)
    cached.evaluate("avg_over_time(gpu_util[1h])", NOW - 10 * MIN + OFFSET)
    assert cached.windows is not None and len(cached.windows) == 0


def _with_nans(rows: list[Any], every: int = 7) -> list[Any]:
    """``rows`` with every ``every``-th sample of gpu 0 a NaN."""
    out, n = [], 0
    for name, labels, t, v in rows:
        if labels["gpu"] == "0":
            n += 1
            v = float("nan") if n % every == 0 else v
        out.append((name, labels, t, v))
    return out


@pytest.fixture
def sliding(tmp_path: Any) -> Iterator[Any]:
    """Three GPUs with NaN samples among gpu 0's; gpu 9 only in two hours near the start of
    the windows evaluated from NOW on (rolled up), so it leaves them as they slide; four hours
    of raw samples after NOW, gpu 3 among them from NOW + 90m (new in the window's end)."""
    from metricvault.store.vault import Vault

    v = Vault.open_local(str(tmp_path / "v"), retention_raw="1d")
    v.write(_with_nans(_rows(T0, NOW)))
    gone = NOW - 2 * DAY + 30 * MIN
    v.write([(n, {"gpu": "9"}, t, x) for n, _, t, x in _rows(gone, gone + 2 * HOUR, 1, 9)])
    v.maintain(now_ms=NOW)
    v.write(_with_nans(_rows(NOW, NOW + 90 * MIN, seed=6)))
    v.write(_with_nans(_rows(NOW + 90 * MIN, NOW + 4 * HOUR, gpus=4, seed=7)))
    yield v
    v.close()


def _around(boundary: int) -> list[int]:
    """Rule evaluation times (every 30 s, never whole minutes) from before ``boundary`` to
    after it."""
    return [boundary - 2 * STEP + OFFSET + i * STEP for i in range(4)]


def test_a_window_slides_across_hours_at_its_end_and_start_without_being_read_again(sliding):
    cached, plain = _engines(sliding)
    times = [NOW + OFFSET]
    for h in (1, 2, 3):  # its end (and the 2d windows' start) crosses a whole hour, then
        times += _around(NOW + h * HOUR)  # the 47h30m window's start crosses one
        times += _around(NOW + h * HOUR + 30 * MIN)
    for at in times:
        _same(cached, plain, at)
    assert cached.windows is not None
    assert cached.windows.builds == 3  # one per window length and kind, read once
    assert cached.windows.slides >= 3 * 6  # every crossing slid the kept entries
    assert cached.windows.invalidated == 0
    expr = "count_over_time(gpu_util[2d])"
    assert (("gpu", "9"),) in _answers(cached, expr, times[0])
    assert (("gpu", "9"),) not in _answers(cached, expr, times[-1])  # left at the start
    assert (("gpu", "3"),) in _answers(cached, expr, times[-1])  # came at the end
    for expr in EXPRS:  # a slid entry says what the rows' path says
        got, want = cached.evaluate(expr, times[-1]), plain.evaluate(expr, times[-1])
        assert got.warnings == want.warnings, expr
        assert {"1h", "1m"} <= got.served_by, expr


def test_samples_written_as_the_window_crosses_an_hour_slide_it(vault):
    cached, plain = _engines(vault)
    vault.write(_rows(NOW, NOW + 55 * MIN, seed=20))
    _same(cached, plain, NOW + 54 * MIN + STEP + OFFSET)
    builds = cached.windows.builds if cached.windows else 0
    for m in range(55, 66):  # the next minute's samples, then an evaluation after them
        vault.write(_rows(NOW + m * MIN, NOW + (m + 1) * MIN, seed=m))
        _same(cached, plain, NOW + m * MIN + STEP + OFFSET)
    assert cached.windows is not None
    assert (cached.windows.builds, cached.windows.invalidated) == (builds, 0)
    assert cached.windows.slides >= 3


def test_an_hourly_rule_slides_its_window_an_hour_at_a_time(sliding):
    cached, plain = _engines(sliding)
    for h in range(4):
        _same(cached, plain, NOW + h * HOUR + 20 * MIN + OFFSET)
    assert cached.windows is not None and cached.windows.builds == 3
    assert cached.windows.slides == 3 * 3


def test_a_window_moved_by_hours_slides_and_by_more_than_half_its_length_is_read_again(sliding):
    cached, plain = _engines(sliding)
    exprs = ("max_over_time(gpu_util[36h])", "quantile_over_time(0.5, gpu_util[36h])")
    _same(cached, plain, NOW - 20 * HOUR + 10 * MIN + OFFSET, exprs)
    _same(cached, plain, NOW - 17 * HOUR + 10 * MIN + OFFSET, exprs)  # three hours on: slid
    assert cached.windows is not None
    assert (cached.windows.builds, cached.windows.slides) == (2, 2)
    _same(cached, plain, NOW + 3 * HOUR + 10 * MIN + OFFSET, exprs)  # twenty: read anew
    assert (cached.windows.builds, cached.windows.slides) == (4, 2)
