"""A rule's long window (days, reaching before the raw horizon) is answered from the 1h rows
with 1m rows at its ragged edges, at a rule's evaluation times (never whole hours): the
value is the raw samples' answer for the window moved to whole minutes, as from 1m rows
alone (the raw-sample engine over the same samples is the oracle), and at whole hours the
1h rows answer however few raw samples are left to count."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from metricvault.promql import Engine, MemorySource
from metricvault.protocols import SelectHints
from metricvault.rules.group import engine_query
from metricvault.selector import Matcher

HOUR = 3_600_000
MIN = 60_000
DAY = 24 * HOUR
T0 = (1_700_000_000_000 // DAY) * DAY
SPAN = 3 * DAY
NOW = T0 + SPAN
RULE_AT = NOW - 10 * MIN + 7_000  # a 30 s multiple plus a group's offset: not a whole minute


def _series(scrape_ms: int) -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    ts = T0 + np.arange(0, SPAN, scrape_ms)
    out = []
    for gpu in range(2):
        util = np.round(rng.uniform(0, 100, ts.size), 1)
        out.append(("gpu_util", {"gpu": str(gpu)}, ts, util))
        energy = np.cumsum(np.round(rng.uniform(100, 400, ts.size), 3))
        if gpu == 1:
            energy[ts.size // 3 :] -= energy[ts.size // 3] - 5.0  # a counter reset
        out.append(("energy_total", {"gpu": str(gpu)}, ts, energy))
    return out


@pytest.fixture(scope="module", params=[60_000, 1_200_000], ids=["60s", "20m"])
def vaults(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Engine, object]]:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path_factory.mktemp("long") / "v"), retention_raw="1d")
    memory = MemorySource()
    rows = []
    for metric, labels, ts, values in _series(request.param):
        memory.add({"__name__": metric, **labels}, ts.tolist(), values.tolist())
        rows += [(metric, labels, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.maintain(now_ms=NOW)
    horizon = vault.catalog_version().raw_horizon_ms
    assert horizon and horizon > T0 + DAY  # raw samples of the window's start are gone
    yield Engine(vault), Engine(memory), vault
    vault.close()


EXACT = [
    "avg_over_time(gpu_util[2d])",
    "sum_over_time(gpu_util[2d])",
    "count_over_time(gpu_util[2d])",
    "min_over_time(gpu_util[2d])",
    "max_over_time(gpu_util[2d])",
    "rate(energy_total[2d])",
    "increase(energy_total[36h])",
]


@pytest.mark.parametrize("expr", EXACT)
def test_a_long_window_at_a_rules_time_is_the_raw_answer_of_its_whole_minutes(vaults, expr):
    engine, oracle, _ = vaults
    got = engine.evaluate(expr, RULE_AT)
    assert {"1h", "1m"} <= got.served_by
    want = oracle.evaluate(expr, RULE_AT // MIN * MIN)  # the window moved to whole minutes
    assert [s[0] for s in got.series] == [s[0] for s in want.series]
    got_values = [float(s[2][0]) for s in got.series]
    want_values = [float(s[2][0]) for s in want.series]
    assert np.allclose(got_values, want_values, rtol=1e-9, atol=0), (got_values, want_values)
    assert any("rounded down" in w for w in got.warnings)


def test_a_long_quantile_at_a_rules_time_is_within_the_sketchs_accuracy(vaults):
    engine, oracle, _ = vaults
    query = engine_query(engine)  # as a rule group asks
    got = dict((tuple(sorted(m.items())), v) for m, v in query(
        "quantile_over_time(0.95, gpu_util[2d])", RULE_AT
    ))  # fmt: skip
    want = engine_query(oracle)("quantile_over_time(0.95, gpu_util[2d])", RULE_AT // MIN * MIN)
    assert len(got) == len(want) == 2
    for labels, value in want:
        assert got[tuple(sorted(labels.items()))] == pytest.approx(value, rel=0.02)


def test_a_long_window_reads_hour_rows_between_its_minute_edges(vaults):
    _, _, vault = vaults
    hints = SelectHints("avg_over_time", 2 * DAY, 0, RULE_AT, RULE_AT)
    selection = vault.select_buckets([Matcher("__name__", "=", "gpu_util")], hints)
    assert selection is not None and selection.width_ms == MIN
    for s in selection.series:
        ts = s.columns["ts"]
        widths = set(np.diff(ts).tolist())
        assert HOUR in widths  # the inner span: whole hours
        assert ts.size < 48 + 2 * 60 + 30  # 2 d of hours and under two hours of minutes


def test_at_whole_hours_the_hour_rows_answer(vaults):
    engine, oracle, _ = vaults
    at = NOW - 2 * HOUR
    for expr in ("avg_over_time(gpu_util[2d])", "rate(energy_total[2d])"):
        got = engine.evaluate(expr, at)
        assert got.served_by == {"1h"}, expr
        want = oracle.evaluate(expr, at)
        assert np.allclose(
            [s[2][0] for s in got.series], [s[2][0] for s in want.series], rtol=1e-9, atol=0
        )
