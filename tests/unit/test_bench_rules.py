"""bench/rules.py's rule and data generation at a tiny size, so the benchmark cannot rot."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import rules as bench_rules  # noqa: E402
from metricvault.promql.parse import parse  # noqa: E402
from metricvault.rules.files import check_rule_file  # noqa: E402

END_MS = 1_767_225_600_000 + 6 * 3_600_000


@pytest.mark.parametrize("count", [1, 7, 45, 200])
def test_generated_rules_are_distinct_and_mix_the_shipped_kinds(count: int) -> None:
    rules = bench_rules.make_rules(count)
    names = [r.get("alert") or r["record"] for r in rules]
    assert len(rules) == count
    assert len(set(names)) == count
    for rule in rules:
        parse(rule["expr"])
    if count >= 45:
        text = " ".join(r["expr"] for r in rules)
        for piece in ("avg_over_time", "max_over_time", "min_over_time", "rate(",
                      "by (Hostname)", "predict_linear", "unless", "[5m]"):  # fmt: skip
            assert piece in text
    if count >= 200:  # every window, 5m to 1h
        assert all(f"[{w}]" in " ".join(r["expr"] for r in rules) for w in bench_rules.WINDOWS)
        assert any("record" in r for r in rules) and any("alert" in r for r in rules)


def test_the_rule_file_is_one_prometheus_accepts(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(bench_rules.rule_file_text(bench_rules.make_rules(45), group_size=20))
    groups, problems = check_rule_file(str(path))
    assert problems == []
    assert [len(g.rules) for g in groups] == [20, 20, 5]
    assert {g.interval_ms for g in groups} == {30_000}


def test_simulated_gpu_data_and_its_openmetrics_text(tmp_path: Path) -> None:
    spec = bench_rules.gpu_spec(3, 0.25, 30, END_MS)
    assert spec.nodes == 1 and spec.end_ms == END_MS
    tables = list(bench_rules.gpu_tables(spec))
    rows = sum(t.num_rows for t in tables)
    # one 8-GPU node, 11 dcgm metrics, at most 30 scrapes in 15 min (the simulated node
    # may be down for some of them)
    assert 0 < rows <= 8 * 11 * 30 and rows % (8 * 11) == 0
    path = tmp_path / "data.om"
    assert bench_rules.write_openmetrics(path, tables) == rows
    lines = path.read_text().splitlines()
    assert lines[-1] == "# EOF" and len(lines) == rows + 1
    sample = re.compile(r'^DCGM_[A-Z_]+\{([a-zA-Z_]+="[^"]*",?)+\} \S+ \d+\.\d{3}$')
    for line in lines[:-1]:
        assert sample.match(line), line
        assert 'simulated="true"' in line and "{," not in line and ",}" not in line
    by_series: dict[str, list[float]] = {}
    for line in lines[:-1]:
        head, _value, stamp = line.rsplit(" ", 2)
        by_series.setdefault(head, []).append(float(stamp))
    assert len(by_series) == 8 * 11
    for stamps in by_series.values():  # each series once, in time order, before the end
        assert stamps == sorted(stamps) and stamps[-1] < END_MS / 1000
    heads = [line.rsplit(" ", 2)[0] for line in lines[:-1]]
    assert heads == sorted(heads, key=heads.index)  # contiguous: no series comes back later


def test_the_long_rule_data_is_one_metric() -> None:
    spec = bench_rules.gpu_spec(8, 2.0, 600, END_MS)
    tables = list(bench_rules.gpu_tables(spec, (bench_rules.LONG_METRIC,)))
    assert {m for t in tables for m in t["metric"].to_pylist()} == {bench_rules.LONG_METRIC}
    assert 0 < sum(t.num_rows for t in tables) <= 8 * 12


def test_prometheus_evaluation_times_are_read_to_the_millisecond() -> None:
    assert bench_rules.rfc3339_ms("2026-01-01T00:00:07.123456789Z") == 1_767_225_607_123
    assert bench_rules.rfc3339_ms("2026-01-01T00:00:07Z") == 1_767_225_607_000


@pytest.mark.parametrize(("asked", "simulated"), [(1, 8), (8, 8), (250, 256), (1000, 1000)])
def test_the_gpu_count_shown_is_the_whole_nodes_simulated(asked: int, simulated: int) -> None:
    assert bench_rules.whole_nodes(asked) == simulated
    assert bench_rules.gpu_spec(asked, 1.0, 30, END_MS).nodes * 8 == simulated
