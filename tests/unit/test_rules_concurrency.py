"""Rule groups run concurrently, bounded by max_concurrent_groups; a group's samples that no
later rule reads are written once per round; the converger's topology is queried once per
evaluation round."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from metricvault.errors import ConfigError
from metricvault.promql import Engine
from metricvault.protocols import SelectHints, SeriesSamples
from metricvault.rules import load_rule_files
from metricvault.rules.convergence import TOPOLOGY_QUERIES, RoundCache
from metricvault.rules.group import engine_query
from metricvault.rules.manager import ManagerOptions, RuleManager
from metricvault.rules.unittest import GrowingSource
from metricvault.selector import Matcher

WAIT_S = 10.0  # how long a round waits for the others to be in flight beside it


class MeetingSource(GrowingSource):
    """A source whose reads wait (bounded) until ``expect`` of them are in flight at once,
    and that records the most ever in flight; its data behind a lock, as the vault's."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.expect = expect
        self.in_flight = 0
        self.peak = 0
        self.cond = threading.Condition()
        self.data = threading.Lock()

    def write(self, samples: list[tuple[str, dict[str, str], int, float]]) -> None:
        with self.data:
            super().write(samples)

    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        with self.cond:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.peak >= self.expect, timeout=WAIT_S)
        try:
            with self.data:
                return super().select(matchers, start_ms, end_ms, hints)
        finally:
            with self.cond:
                self.in_flight -= 1


def _groups_file(tmp_path: Path, groups: int) -> Path:
    path = tmp_path / "r.yml"
    text = "groups:\n"
    for i in range(groups):
        text += f"  - name: g{i}\n    interval: 1m\n    rules:\n"
        text += f"      - record: r{i}\n        expr: sum(up)\n"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("bound", "groups"), [(1, 3), (2, 3), (4, 4)])
def test_groups_are_evaluated_concurrently_up_to_the_bound(tmp_path: Path, bound: int, groups: int):
    source = MeetingSource(expect=min(bound, groups))
    source.append({"__name__": "up", "job": "a"}, 0, 1.0)
    now = [0.0]
    options = ManagerOptions(max_concurrent_groups=bound)
    manager = RuleManager(source, source.write, options, clock=lambda: now[0])
    manager.load([str(_groups_file(tmp_path, groups))])
    now[0] = 120.0
    try:
        done = manager.run_due()
    finally:
        manager.close()
    assert len(done) == groups
    assert source.peak == min(bound, groups)
    assert all(manager.evaluations_total[g.key] == 1 for g in manager.groups)


def test_a_bound_below_one_is_refused():
    with pytest.raises(ConfigError, match="rules_max_concurrent_groups"):
        RuleManager(GrowingSource(), None, ManagerOptions(max_concurrent_groups=0))


class CountingWriter:
    def __init__(self, source: GrowingSource) -> None:
        self.source = source
        self.calls: list[int] = []

    def __call__(self, samples: list[tuple[str, dict[str, str], int, float]]) -> None:
        self.calls.append(len(samples))
        self.source.write(samples)


@pytest.mark.parametrize(
    ("rules", "writes", "expect"),
    [
        # nothing read later: one write for the round
        (["a: vector(1)", "b: vector(2)", "c: vector(3)"], [3], {"a": 1, "b": 2, "c": 3}),
        # b reads a: a written before b runs; b and c together at the end
        (["a: vector(1)", "b: a * 10", "c: vector(3)"], [1, 2], {"a": 1, "b": 10, "c": 3}),
        # a chain: each written before the next reads it
        (["a: vector(2)", "b: a + 1", "c: b * 2"], [1, 1, 1], {"a": 2, "b": 3, "c": 6}),
    ],
)
def test_later_rules_read_what_earlier_ones_wrote_this_round(
    tmp_path: Path, rules: list[str], writes: list[int], expect: dict[str, float]
):
    path = tmp_path / "r.yml"
    body = "".join(
        f"      - record: {r.split(':')[0]}\n        expr: {r.split(': ', 1)[1]}\n" for r in rules
    )
    path.write_text("groups:\n  - name: g\n    rules:\n" + body)
    (group,) = load_rule_files([str(path)])
    source = GrowingSource()
    writer = CountingWriter(source)
    result = group.evaluate(60_000, engine_query(Engine(source)), writer)
    assert writer.calls == writes
    assert {m: v for m, _, _, v in result.samples} == expect
    assert not result.errors


def test_the_topology_is_queried_once_per_evaluation_round():
    source = GrowingSource()
    source.append({"__name__": "up", "Hostname": "n1"}, 0, 0.0)
    cache = RoundCache(engine_query(Engine(source)))
    interval = 30_000
    for at in (30_000, 31_000, 45_000, 59_999):  # several groups' rounds, one interval
        _, down = cache.round(at, interval)
        assert down("n1")
    assert cache.queries == len(TOPOLOGY_QUERIES)
    cache.round(60_000, interval)  # the next round
    cache.round(10_000, interval)  # an earlier time: not the cached answer
    assert cache.queries == 3 * len(TOPOLOGY_QUERIES)
