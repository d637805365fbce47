"""Rule groups evaluate as Prometheus 2.42's rules manager: alert states and their times,
keep_firing_for, resolved alerts kept and sent, resends, stale markers, limit, restored `for`
state, reloads, and evaluation times aligned by the group's hash."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from metricvault.promql import Engine
from metricvault.promql.source import is_stale
from metricvault.rules import load_rule_files
from metricvault.rules.group import RuleGroup, engine_query, group_offset_ms
from metricvault.rules.manager import ManagerOptions, RuleManager
from metricvault.rules.unittest import GrowingSource
from metricvault.selector import Matcher

M = 60_000


def _group(tmp_path: Path, rules: str, interval: str = "1m", limit: int = 0) -> RuleGroup:
    path = tmp_path / "r.yml"
    path.write_text(f"groups:\n  - name: g\n    interval: {interval}\n    limit: {limit}\n"
                    f"    rules:\n{rules}")  # fmt: skip
    (group,) = load_rule_files([str(path)])
    for r in group.alerting_rules():
        r.restored = True
    return group


def _source(series: dict[str, list[float]], step: int = M) -> GrowingSource:
    source = GrowingSource()
    for text, values in series.items():
        name, _, rest = text.partition("{")
        labels = {"__name__": name}
        for pair in filter(None, rest.rstrip("}").split(",")):
            k, text_value = pair.split("=")
            labels[k] = text_value.strip('"')
        for i, v in enumerate(values):
            source.append(labels, i * step, v)
    return source


ALERT = """\
      - alert: Hot
        expr: temp > 80
        for: 2m
        labels: {severity: page}
        annotations: {summary: "{{ $value }}"}
"""


def _states(group: RuleGroup, source: GrowingSource, until: int) -> list[tuple[int, str]]:
    query = engine_query(Engine(source))
    out = []
    for t in range(0, until + 1, M):
        group.evaluate(t, query, source.write)
        (rule,) = group.alerting_rules()
        out.append((t // M, rule.state()))
    return out


def test_an_alert_is_pending_then_fires_after_for_then_resolves(tmp_path: Path):
    group = _group(tmp_path, ALERT)
    source = _source({"temp{gpu=0}": [90, 90, 90, 90, 50, 50]})
    states = _states(group, source, 5 * M)
    assert states == [(0, "pending"), (1, "pending"), (2, "firing"), (3, "firing"),
                      (4, "inactive"), (5, "inactive")]  # fmt: skip
    (alert,) = group.alerting_rules()[0].active.values()
    assert (alert.active_at, alert.fired_at, alert.resolved_at) == (0, 2 * M, 4 * M)
    assert alert.labels == {"alertname": "Hot", "gpu": "0", "severity": "page"}
    assert alert.annotations == {"summary": "50"} or alert.annotations == {"summary": "90"}


def test_alerts_series_are_written_with_their_state(tmp_path: Path):
    group = _group(tmp_path, ALERT)
    source = _source({"temp{gpu=0}": [90, 90, 90, 50]})
    _states(group, source, 3 * M)
    (pending,) = source.select([Matcher("__name__", "=", "ALERTS"),
                                Matcher("alertstate", "=", "pending")], 0, 10 * M)  # fmt: skip
    assert pending.ts.tolist() == [0, M, 2 * M]  # the marker at 2m ends it as it fires
    assert pending.values[:2].tolist() == [1.0, 1.0] and is_stale(pending.values[2:]).all()
    (firing,) = source.select([Matcher("alertstate", "=", "firing")], 0, 10 * M)
    assert firing.ts.tolist() == [2 * M, 3 * M] and bool(is_stale(firing.values[1:]).all())
    (for_state,) = source.select([Matcher("__name__", "=", "ALERTS_FOR_STATE")], 0, 10 * M)
    assert for_state.values[:3].tolist() == [0.0, 0.0, 0.0]  # activeAt, Unix seconds


def test_keep_firing_for_keeps_a_vanished_alert_firing(tmp_path: Path):
    rules = ALERT.replace("for: 2m", "for: 0s\n        keep_firing_for: 2m")
    group = _group(tmp_path, rules)
    source = _source({"temp{gpu=0}": [90, 50, 50, 50, 50]})
    states = _states(group, source, 4 * M)
    assert [s for _, s in states] == ["firing", "firing", "firing", "inactive", "inactive"]
    (alert,) = group.alerting_rules()[0].active.values()
    assert alert.keep_firing_since == M and alert.resolved_at == 3 * M


def test_a_resolved_alert_is_sent_with_its_end_and_kept_fifteen_minutes(tmp_path: Path):
    group = _group(tmp_path, ALERT.replace("for: 2m", "for: 0s"))
    source = _source({"temp{gpu=0}": [90.0, 90.0] + [50.0] * 20})
    query = engine_query(Engine(source))
    sent = {}
    for t in range(0, 20 * M, M):
        result = group.evaluate(t, query, source.write, resend_delay_ms=M)
        sent[t // M] = [(a.starts_at, a.ends_at) for a in result.alerts]
    assert sent[0] == [(0, 4 * M)]  # firing: valid for 4 resend delays
    assert sent[1] == []  # not resent before the resend delay has passed
    assert sent[2] == [(0, 2 * M)]  # resolved at 2m: sent at once with endsAt
    assert sent[4] == [(0, 2 * M)]  # and resent while kept
    rule = group.alerting_rules()[0]
    assert not rule.active  # dropped once 15 minutes past its resolution


def test_series_a_rule_no_longer_produces_get_a_stale_marker(tmp_path: Path):
    group = _group(tmp_path, "      - record: hot\n        expr: temp > 80\n")
    source = _source({"temp{gpu=0}": [90, 50]})
    query = engine_query(Engine(source))
    group.evaluate(0, query, source.write)
    result = group.evaluate(M, query, source.write)
    ((name, labels, ts, value),) = result.samples
    assert (name, labels, ts) == ("hot", {"gpu": "0"}, M)
    assert bool(is_stale(np.array([value]))[0])


@pytest.mark.parametrize(
    ("rules", "error"),
    [
        ("      - record: r\n        expr: temp\n", "exceeded limit of 1 with 2 series"),
        ("      - alert: A\n        expr: temp\n", "exceeded limit of 1 with 2 alerts"),
        ("      - record: r\n        expr: temp\n        labels: {gpu: x}\n",
         "vector contains metrics with the same labelset after applying rule labels"),
        ("      - alert: A\n        expr: temp\n        labels: {gpu: x}\n",
         "vector contains metrics with the same labelset after applying alert labels"),
        ('      - record: r\n        expr: \'"text"\'\n', "rule result is not a vector or scalar"),
    ],
)  # fmt: skip
def test_a_failing_rule_is_counted_and_shows_its_error(tmp_path: Path, rules: str, error: str):
    group = _group(tmp_path, rules, limit=1 if "limit" in error else 0)
    source = _source({"temp{gpu=0}": [90], "temp{gpu=1}": [91]})
    result = group.evaluate(0, engine_query(Engine(source)), source.write)
    (rule,) = group.rules
    assert (rule.status.health, rule.status.last_error) == ("err", error)
    assert result.failures == 1 and group.failures_total == 1


def test_a_scalar_result_is_one_unlabelled_sample(tmp_path: Path):
    group = _group(tmp_path, "      - record: two\n        expr: 1 + 1\n")
    result = group.evaluate(0, engine_query(Engine(GrowingSource())), None)
    assert result.samples == [("two", {}, 0, 2.0)]


def test_evaluation_times_are_aligned_by_the_groups_hash(tmp_path: Path):
    group = _group(tmp_path, ALERT, interval="30s")
    offset = group_offset_ms(group.name, group.file, 30_000)
    assert 0 <= offset < 30_000
    for now in (1_700_000_000_000, 1_700_000_012_345, 1_700_000_029_999):
        t = group.eval_timestamp(now)
        assert t <= now < t + 30_000
        assert (t - int(offset)) % 30_000 == 0 or (t - math.floor(offset)) % 30_000 == 0


def _manager(source: GrowingSource, path: Path, now: list[float]) -> RuleManager:
    manager = RuleManager(source, source.write, ManagerOptions(), clock=lambda: now[0])
    manager.load([str(path)])
    return manager


def _run(manager: RuleManager, now: list[float], until_s: float) -> None:
    while now[0] < until_s:
        now[0] += 15
        manager.run_due()


@pytest.mark.parametrize(
    ("down_s", "expect"),
    [
        (600, "shifted"),  # 5m pending of 30m, down 10m: activeAt moves on by the outage
        (7200, "fresh"),  # down past the 1h outage tolerance: starts anew
    ],
)
def test_for_state_is_restored_after_a_restart(tmp_path: Path, down_s: int, expect: str):
    path = tmp_path / "r.yml"
    path.write_text("groups:\n  - name: g\n    rules:\n" + ALERT.replace("for: 2m", "for: 30m"))
    source = _source({"temp{gpu=0}": [90.0] * 400}, step=30_000)
    now = [0.0]
    first = _manager(source, path, now)
    _run(first, now, 330)  # rounds at 60s..300s (the group's offset aside)
    (rule,) = first.groups[0].alerting_rules()
    (alert,) = rule.active.values()
    active_at, down_at = alert.active_at, first.groups[0].last_evaluation_ms
    now[0] += down_s
    restart_ms = now[0] * 1000
    second = _manager(source, path, now)
    _run(second, now, now[0] + 200)
    (alert2,) = second.groups[0].alerting_rules()[0].active.values()
    assert second.groups[0].alerting_rules()[0].restored
    if expect == "shifted":  # activeAt + (restore time - down time): the outage not counted
        shift = alert2.active_at - active_at
        assert restart_ms - down_at <= shift <= restart_ms + 200_000 - down_at
    else:
        assert alert2.active_at >= restart_ms  # a new alert: active since the restart


def test_a_reload_keeps_the_alerts_of_groups_that_stay(tmp_path: Path):
    path = tmp_path / "r.yml"
    path.write_text("groups:\n  - name: g\n    interval: 15s\n    rules:\n" + ALERT)
    source = _source({"temp{gpu=0}": [90.0] * 100}, step=15_000)
    now = [0.0]
    manager = _manager(source, path, now)
    for r in manager.groups[0].alerting_rules():
        r.restored = True
    _run(manager, now, 200)
    (before,) = manager.groups[0].alerting_rules()[0].active.values()
    path.write_text(path.read_text().replace("{severity: page}", "{severity: page, x: y}"))
    manager.load([str(path)])
    (after,) = manager.groups[0].alerting_rules()[0].active.values()
    assert after is before and after.state == "firing"


def test_a_reload_with_an_invalid_file_changes_nothing(tmp_path: Path):
    path = tmp_path / "r.yml"
    path.write_text("groups:\n  - name: g\n    rules:\n" + ALERT)
    manager = _manager(GrowingSource(), path, [0.0])
    groups = manager.groups
    path.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n")
    with pytest.raises(Exception, match="field 'expr' must be set in rule"):
        manager.load([str(path)])
    assert manager.groups is groups
