"""Range functions over rollup rows evaluated for several series in one pass
(promql/tiers.py ``_evaluate_batch``) answer exactly what one pass per series answers: the
same values bit for bit, the same presence, for few steps (a refresh) and many."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metricvault.promql import Engine, tiers
from tests.unit.test_promql_tiers import HOUR, MIN, SPAN, T0, _workload

EXPRS = [
    "rate(energy_total[5m])", "increase(energy_total[1h])", "rate(jitter_total[1m])",
    "increase(gappy_total[10m])", "delta(gpu_util[10m])", "avg_over_time(gpu_util[1m])",
    "sum_over_time(gpu_util[5m])", "min_over_time(gpu_util[2m])", "max_over_time(gpu_util[1h])",
    "count_over_time(jitter_total[1m])", "last_over_time(gpu_util[1m])",
    "present_over_time(gappy_total[1m])", "sum by (gpu) (rate(energy_total[1m]))",
    "last_over_time({__name__=~'gpu_util|jitter_total|gappy_total'}[5m])",
]  # fmt: skip
RANGES = [  # (start, end, step): many steps, a refresh's few, one, steps past the data
    (T0 + 2 * HOUR, T0 + SPAN, MIN),
    (T0 + SPAN - 5 * MIN, T0 + SPAN, MIN),
    (T0 + 3 * HOUR, T0 + 3 * HOUR, MIN),
    (T0 + HOUR, T0 + SPAN + HOUR, 10 * MIN),
    (T0 + 90 * MIN, T0 + 3 * HOUR, HOUR),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path_factory.mktemp("batched") / "vault"))
    rows = []
    for metric, labels, ts, values in _workload():
        rows += [(metric, labels, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.maintain(now_ms=T0 + SPAN + 2 * HOUR)
    yield Engine(vault)
    vault.close()


def _answer(engine: Engine, expr: str, query: tuple[int, int, int]) -> list[tuple[object, ...]]:
    result = engine.evaluate(expr, *query)
    return [(labels, ts.tolist(), vs.tobytes()) for labels, ts, vs in result.series]


@pytest.mark.parametrize("expr", EXPRS)
@pytest.mark.parametrize("cells", [tiers.BATCH_CELLS, 1 << 30, 400])  # few, all, some a pass
def test_batched_rollup_windows_equal_one_series_at_a_time(
    engine: Engine, expr: str, cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    for query in RANGES:
        monkeypatch.setattr(tiers, "BATCH_CELLS", cells)
        batched = _answer(engine, expr, query)
        monkeypatch.setattr(tiers, "BATCH_CELLS", 1)  # one series a pass: _evaluate
        one_by_one = _answer(engine, expr, query)
        assert batched == one_by_one, (expr, query)


def test_the_rollup_path_answers_these_queries(engine: Engine) -> None:
    result = engine.evaluate("rate(energy_total[5m])", *RANGES[0])
    assert result.served_by == {"1m"}
    assert len(result.series) == 3
