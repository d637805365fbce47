"""The engine's read protocol: VaultSource over a real vault returns what MemorySource holds,
and the engine answers the same through both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from metricvault.promql import Engine, MemorySource, SeriesSamples, VaultSource
from metricvault.promql.source import STALE_NAN, is_stale
from metricvault.selector import Matcher

T0 = 1_700_000_000_000


def _series() -> list[tuple[str, dict[str, str], list[int], list[float]]]:
    ts = [T0 + i * 15_000 for i in range(41)]
    return [
        ("req_total", {"job": "api", "instance": "a"}, ts, [float(i * 3) for i in range(41)]),
        ("req_total", {"job": "api", "instance": "b"}, ts, [float(i % 7) for i in range(41)]),
        ("temp", {"instance": "a"}, ts[::2], [20.0 + i for i in range(21)]),
    ]


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[tuple[MemorySource, VaultSource]]:
    from metricvault.store.vault import Vault

    memory = MemorySource()
    vault = Vault.open_local(str(tmp_path / "vault"))
    rows = []
    for metric, labels, ts, values in _series():
        memory.add({"__name__": metric, **labels}, ts, values)
        rows += [(metric, labels, t, v) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.flush()
    yield memory, VaultSource(vault)
    vault.close()


def test_vault_source_selects_what_memory_source_holds(
    sources: tuple[MemorySource, VaultSource],
) -> None:
    memory, vault = sources
    matchers = [Matcher("__name__", "=", "req_total"), Matcher("instance", "=~", "a|b")]
    start, end = T0 + 30_000, T0 + 300_000  # both ends are included
    got = sorted(vault.select(matchers, start, end), key=lambda s: sorted(s.labels.items()))
    want = sorted(memory.select(matchers, start, end), key=lambda s: sorted(s.labels.items()))
    assert [s.labels for s in got] == [s.labels for s in want]
    for g, w in zip(got, want, strict=True):
        assert g.ts.tolist() == w.ts.tolist()
        assert g.ts[0] == start and g.ts[-1] == end
        assert np.array_equal(g.values, w.values)


@pytest.mark.parametrize(
    "expr",
    [
        "sum by (instance) (rate(req_total[2m]))",
        "temp * on(instance) group_left req_total",
        "max_over_time(temp[3m:30s])",
        "resets(req_total[10m])",
    ],
)
def test_the_engine_answers_the_same_through_both_sources(
    sources: tuple[MemorySource, VaultSource], expr: str
) -> None:
    memory, vault = sources
    args = (T0 + 120_000, T0 + 600_000, 30_000)
    want = Engine(memory).evaluate(expr, *args).to_prometheus()
    got = Engine(vault).evaluate(expr, *args).to_prometheus()
    assert got == want
    assert want["result"], "an empty answer would prove nothing"


def test_stale_markers_are_recognised_by_their_bit_pattern_only() -> None:
    values = np.array([1.0, STALE_NAN, float("nan")])
    assert is_stale(values).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="2 timestamps but 3 values"):
        SeriesSamples({"__name__": "x"}, np.array([1, 2]), values)
