"""Range functions run over all series at once (functions.BATCHED) answer exactly as one call
per series does, and the JSON of cached points (result_cache._format_points) is the bytes the
answer writer gives for the same points."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from metricvault.promql import STALE_NAN, Engine, EngineOptions, MemorySource
from metricvault.promql import functions as fn
from metricvault.promql import result_cache as rc
from metricvault.promql.values import QueryResult
from metricvault.server.prometheus_json import answer_body

S = 1000


def _source(seed: int) -> MemorySource:
    """Counters with resets, gauges with NaN/Inf/stale markers, empty stretches, series of
    one sample, irregular scrapes: what the per-series code's edge cases hinge on."""
    rng = np.random.default_rng(seed)
    source = MemorySource()
    for i in range(int(rng.integers(2, 12))):
        n = int(rng.integers(0, 120))
        ts = np.sort(rng.choice(3600, n, replace=False)).astype(np.int64) * S
        ts += rng.integers(0, 999, n)
        ts = np.unique(ts)
        counter = np.cumsum(rng.integers(0, 50, ts.size)).astype(np.float64)
        cut = rng.random(ts.size) < 0.05
        counter[cut] = rng.integers(0, 5, int(cut.sum()))  # resets
        source.add({"__name__": "c_total", "i": str(i)}, ts.tolist(), counter.tolist())
        gauge = rng.normal(size=ts.size) * 10.0 ** rng.integers(-3, 6)
        odd = rng.random(ts.size)
        gauge[odd < 0.03] = np.nan
        gauge[(odd >= 0.03) & (odd < 0.05)] = np.inf
        gauge[(odd >= 0.05) & (odd < 0.07)] = STALE_NAN
        gauge[(odd >= 0.07) & (odd < 0.09)] = -0.0
        source.add({"__name__": "g", "i": str(i)}, ts.tolist(), gauge.tolist())
    return source


EXPRS = [
    "rate(c_total[1m])", "increase(c_total[5m])", "delta(g[2m])", "rate(c_total[15s])",
    "sum by (i) (rate(c_total[1m]))", "avg_over_time(g[1m])", "min_over_time(g[30s])",
    "max_over_time(g[5m])", "sum_over_time(g[1m])", "count_over_time(g[1m])",
    "last_over_time(g[1m])", "present_over_time(g[20s])", "rate(c_total[1m:15s])",
    "avg_over_time(c_total[10m] offset 2m)",
]  # fmt: skip


def _answers(engine: Engine, expr: str, step: int) -> list[tuple[object, ...]]:
    result = engine.evaluate(expr, 0, 3600 * S, step)
    return [(labels, ts.tolist(), vs.tobytes()) for labels, ts, vs in result.series]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("left_open", [False, True])
@pytest.mark.parametrize("cells", [fn.BATCH_CELLS, 200])  # one batch, or a few series each
def test_batched_range_functions_equal_per_series(
    seed: int, left_open: bool, cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fn, "BATCH_CELLS", cells)
    engine = Engine(_source(seed), EngineOptions(left_open_windows=left_open))
    for expr in EXPRS:
        for step in (15 * S, 60 * S, 7 * S):
            batched = _answers(engine, expr, step)
            with monkeypatch.context() as m:
                m.setattr(fn, "BATCHED", set())
                one_by_one = _answers(engine, expr, step)
            assert batched == one_by_one, (expr, step)  # values bit for bit (NaN payloads too)


def test_batched_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = fn._batched

    def spy(ev: Any, n: str, *a: Any) -> Any:
        calls.append(n)
        return real(ev, n, *a)

    monkeypatch.setattr(fn, "_batched", spy)
    Engine(_source(0)).evaluate("rate(c_total[1m])", 0, 3600 * S, 15 * S)
    assert calls == ["rate"]


@pytest.mark.parametrize("seed", range(20))
def test_cached_points_json_equals_the_answer_writer(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-7, 1.5, 3.0, 1e21, -2.5, 0.1, STALE_NAN]
    series: list[Any] = []
    for _ in range(4):
        n = int(rng.integers(0, 40))
        ts = np.sort(rng.choice(10**6, n, replace=False)).astype(np.int64) * 15 * S
        ts += int(rng.integers(0, 999))
        vs = np.where(
            rng.random(n) < 0.5,
            rng.choice(np.array(pool), n),
            rng.normal(size=n) * 10.0 ** rng.integers(-8, 22, n),
        )
        text = rc._format_points(ts, vs)
        series.append(({"i": str(len(series))}, ts, vs))
        whole = json.loads("[" + text.text + "]")
        assert len(whole) == n
        for a in range(n + 1):  # every slice of the text is the JSON of those points
            for b in (a, min(n, a + 1), n):
                part = text.slice(a, b).text
                assert json.loads("[" + part + "]") == whole[a:b]
    # the texts joined as a cached answer's body is are the answer writer's bytes
    texts = [rc._format_points(ts, vs).text for _, ts, vs in series]
    cached = rc.CachedAnswer("matrix", series, texts=texts)
    assert cached.body([]) == answer_body(QueryResult("matrix", series), [])


@pytest.mark.parametrize("seed", range(20))
def test_series_formatted_together_equal_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool = np.array([0.0, 1.5, np.nan, np.inf, 1e21, 0.1, -2.0] + ([-0.0] if seed % 4 == 0 else []))
    items = []
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(0, 30))
        ts = np.sort(rng.choice(10**6, n, replace=False)).astype(np.int64) * 15 * S
        vs = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.normal(size=n))
        items.append((ts, vs))
    together = rc._format_series(items)
    for (ts, vs), text in zip(items, together, strict=True):
        alone = rc._format_points(ts, vs)
        assert text.text == alone.text
        assert text.starts.tolist() == alone.starts.tolist()
