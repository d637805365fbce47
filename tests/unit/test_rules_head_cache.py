"""The recent raw samples an engine keeps for its rules (promql/head_cache.py): the rules of a
group share one read per metric, and every answer equals an uncached engine's, after newer
samples, after late samples and after maintenance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from metricvault.promql import Engine
from metricvault.promql.eval import EngineOptions

MIN = 60_000
HOUR = 60 * MIN
T0 = (1_700_000_000_000 // HOUR) * HOUR
NOW = T0 + 2 * HOUR
AT = NOW - 10 * MIN + 7_000  # a rule group's time
EXPRS = (
    "gpu_util",
    "gpu_util > 50",
    "avg_over_time(gpu_util[5m])",
    "max by (host) (max_over_time(gpu_util[1h]))",
    "min_over_time(gpu_util[10m]) < 20",
    "rate(energy_total[15m])",
    "predict_linear(gpu_util[30m], 3600)",
)


def _rows(start: int, end: int, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    ts = np.arange(start, end, 30_000)
    rows = []
    for gpu in range(3):
        labels = {"gpu": str(gpu), "host": f"h{gpu % 2}"}
        util = np.round(rng.uniform(0, 100, ts.size), 1)
        energy = np.cumsum(rng.uniform(100, 200, ts.size))
        rows += [("gpu_util", labels, int(t), float(v)) for t, v in zip(ts, util, strict=True)]
        rows += [
            ("energy_total", labels, int(t), float(v)) for t, v in zip(ts, energy, strict=True)
        ]
    return rows


@pytest.fixture
def vault(tmp_path: Any) -> Iterator[Any]:
    from metricvault.store.vault import Vault

    v = Vault.open_local(str(tmp_path / "v"), retention_raw="forever")
    v.write(_rows(T0, NOW, seed=1))
    v.maintain(now_ms=NOW)
    yield v
    v.close()


def _answers(engine: Engine, expr: str, at: int) -> dict[tuple[tuple[str, str], ...], float]:
    result = engine.evaluate(expr, at)
    return {tuple(sorted(labels.items())): float(vs[0]) for labels, _, vs in result.series}


def _same(cached: Engine, plain: Engine, at: int) -> None:
    for expr in EXPRS:
        assert _answers(cached, expr, at) == _answers(plain, expr, at), expr


def _engines(vault: Any) -> tuple[Engine, Engine]:
    plain = Engine(vault, EngineOptions(head_cache=False, window_cache=False))
    return Engine(vault), plain


def test_the_rules_of_a_group_share_one_read_per_metric(vault):
    cached, plain = _engines(vault)
    _same(cached, plain, AT)
    assert cached.heads is not None
    assert cached.heads.reads == 2  # gpu_util and energy_total, once each
    assert cached.heads.hits >= len(EXPRS) - 2


def test_newer_samples_and_a_rules_own_writes_are_read(vault):
    cached, plain = _engines(vault)
    _same(cached, plain, AT)
    vault.write(_rows(NOW, NOW + MIN, seed=2))  # the next scrapes
    vault.write([("recorded:util", {"gpu": "0"}, AT, 1.0)])  # a rule's write at its time
    _same(cached, plain, NOW + 30_000)
    _same(cached, plain, NOW + 30_000 + 7_000)
    assert cached.heads is not None and cached.heads.reads == 2  # the newest samples appended
    assert cached.heads.extended >= 2


def test_late_samples_are_in_the_next_answer(vault):
    cached, plain = _engines(vault)
    _same(cached, plain, AT)
    late = AT - 2 * MIN - 15_000  # between two scrapes, inside every window above
    vault.write([("gpu_util", {"gpu": "1", "host": "h1"}, late, 1e6)])
    _same(cached, plain, AT)
    assert (
        _answers(cached, "max_over_time(gpu_util[5m])", AT)[(("gpu", "1"), ("host", "h1"))] == 1e6
    )


def test_maintenance_drops_the_kept_samples(vault):
    cached, plain = _engines(vault)
    _same(cached, plain, AT)
    vault.write([("gpu_util", {"gpu": "2", "host": "h0"}, AT - 30 * MIN + 1, -3.0)])
    vault.maintain(now_ms=NOW)
    _same(cached, plain, AT)
    assert (
        _answers(cached, "min_over_time(gpu_util[1h])", AT)[(("gpu", "2"), ("host", "h0"))] == -3.0
    )


def test_a_sample_at_the_kept_spans_end_arriving_after_the_read_is_read(vault):
    cached, plain = _engines(vault)
    _same(cached, plain, AT)
    vault.write([("gpu_util", {"gpu": "2", "host": "h0"}, AT, 1e6)])  # at the read's end
    _same(cached, plain, AT)
    got = _answers(cached, "gpu_util", AT)
    assert got[(("__name__", "gpu_util"), ("gpu", "2"), ("host", "h0"))] == 1e6
