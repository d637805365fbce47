"""The engine's read seam: a real vault returns what MemorySource holds, and the engine
answers the same through both; the tenant's view narrows to its series first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from metricvault.promql import Engine, MemorySource, SeriesSamples
from metricvault.promql.source import STALE_NAN, TenantSource, is_stale
from metricvault.protocols import SelectHints
from metricvault.selector import Matcher
from metricvault.store.vault import Vault

T0 = 1_700_000_000_000


def _series() -> list[tuple[str, dict[str, str], list[int], list[float]]]:
    ts = [T0 + i * 15_000 for i in range(41)]
    return [
        ("req_total", {"job": "api", "instance": "a"}, ts, [float(i * 3) for i in range(41)]),
        ("req_total", {"job": "api", "instance": "b"}, ts, [float(i % 7) for i in range(41)]),
        ("temp", {"instance": "a"}, ts[::2], [20.0 + i for i in range(21)]),
    ]


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[tuple[MemorySource, Vault]]:
    memory = MemorySource()
    vault = Vault.open_local(str(tmp_path / "vault"))
    rows = []
    for metric, labels, ts, values in _series():
        memory.add({"__name__": metric, **labels}, ts, values)
        rows += [(metric, labels, t, v) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.flush()
    yield memory, vault
    vault.close()


def test_vault_source_selects_what_memory_source_holds(
    sources: tuple[MemorySource, Vault],
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
    sources: tuple[MemorySource, Vault], expr: str
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


SEEN: list[str | None] = []  # the values the recording matcher was asked about


class RecordingMatcher(Matcher):
    """A real matcher that remembers every value it was run against."""

    def matches(self, value: str | None) -> bool:
        SEEN.append(value)
        return super().matches(value)


@pytest.fixture
def two_tenants(tmp_path: Path) -> Iterator[Any]:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path / "vault"))
    vault.write(
        [
            ("secret_metric", {"tenant": "A", "secret": "A-value"}, T0, 1.0),
            ("secret_metric", {"tenant": "B", "secret": "B-T-value"}, T0, 2.0),
        ]
    )
    yield vault
    vault.close()


@pytest.mark.parametrize("read", ["select", "select_kept", "select_buckets"])
def test_a_tenants_reads_never_run_its_matchers_against_another_tenants_series(
    two_tenants: Any, read: str
) -> None:
    """The tenant matcher runs first: a user's (costly) regex is never evaluated against
    tenant B's series, so its running time cannot tell what B holds."""
    source = TenantSource(two_tenants, [Matcher("tenant", "=", "A")])
    user = [Matcher("__name__", "=", "secret_metric"), RecordingMatcher("secret", "=~", "B-T.*")]
    SEEN.clear()
    if read == "select_buckets":
        hints = SelectHints("max_over_time", 60_000, 0, T0 + 60_000, T0 + 60_000)
        source.select_buckets(user, hints)
    else:
        getattr(source, read)(user, T0, T0 + 1)
    assert SEEN == ["A-value"] or (read == "select_buckets" and SEEN in ([], ["A-value"]))
    assert "B-T-value" not in SEEN


def test_the_tenant_view_says_when_a_selection_reached_before_the_raw_horizon() -> None:
    memory = MemorySource()
    memory.add({"__name__": "m", "tenant": "A"}, [T0], [1.0])
    source = TenantSource(memory, [Matcher("tenant", "=", "A")], raw_horizon_ms=T0)
    assert len(source.select([Matcher("__name__", "=", "m")], T0, T0 + 1)) == 1
    assert not source.truncated
    source.select([Matcher("__name__", "=", "m")], T0 - 1, T0 + 1)
    assert source.truncated
    assert source.horizons() == memory.horizons()
