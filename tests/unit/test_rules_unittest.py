"""`metricvault rules test` runs promtool's rule unit-test files and reports as promtool does
(the expected reports below are promtool 2.42's for the same files; the e2e test runs both)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from metricvault.promql.source import is_stale
from metricvault.rules.unittest import parse_series, parse_series_values, run_rule_tests

RULES = """\
groups:
  - name: g
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: Down
        expr: up == 0
        for: 1m
        labels: {severity: page}
        annotations:
          summary: "{{ $labels.instance }} down ({{ $value }})"
"""

TESTS = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="a", instance="i1"}'
        values: '1 0 0 0 0 _ 0x3 stale 1+1x2'
      - series: 'up{job="a", instance="i2"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 3m
        alertname: Down
        exp_alerts:
          - exp_labels: {severity: page, instance: i1, job: a}
            exp_annotations: {summary: "i1 down (0)"}
      - eval_time: 1m
        alertname: Down
        exp_alerts: []
    promql_expr_test:
      - expr: job:up:sum
        eval_time: 2m
        exp_samples:
          - labels: 'job:up:sum{job="a"}'
            value: 1
"""

# promtool test rules' stderr for TESTS with both expectations changed
FAILED = """\
  FAILED:
    alertname: Down, time: 3m,\x20
        exp:[
            0:
              Labels:{alertname="Down", instance="i1", job="a", severity="page"}
              Annotations:{summary="i1 down (1)"}
            ],\x20
        got:[
            0:
              Labels:{alertname="Down", instance="i1", job="a", severity="page"}
              Annotations:{summary="i1 down (0)"}
            ]
    expr: "job:up:sum", time: 2m,
        exp: {__name__="job:up:sum", job="a"} 3E+00
        got: {__name__="job:up:sum", job="a"} 1E+00
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / "ok.yml").write_text(TESTS)
    mutated = TESTS.replace("i1 down (0)", "i1 down (1)").replace("value: 1", "value: 3")
    (tmp_path / "bad.yml").write_text(mutated)
    return tmp_path


def test_a_passing_file_reports_success(files: Path):
    out, err = io.StringIO(), io.StringIO()
    assert run_rule_tests([str(files / "ok.yml")], out, err) == 0
    assert out.getvalue() == f"Unit Testing:  {files / 'ok.yml'}\n  SUCCESS\n\n"
    assert err.getvalue() == ""


def test_a_failing_file_reports_promtools_diff_and_exits_1(files: Path):
    out, err = io.StringIO(), io.StringIO()
    assert run_rule_tests([str(files / "bad.yml")], out, err) == 1
    assert err.getvalue() == FAILED
    assert out.getvalue() == f"Unit Testing:  {files / 'bad.yml'}\n\n\n\n"


def test_an_invalid_rule_file_fails_the_test_file(files: Path):
    (files / "rules.yml").write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n")
    err = io.StringIO()
    assert run_rule_tests([str(files / "ok.yml")], io.StringIO(), err) == 1
    assert "field 'expr' must be set in rule" in err.getvalue()


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("1 2 3", [1.0, 2.0, 3.0]),
        ("1+2x3", [1.0, 3.0, 5.0, 7.0]),
        ("10-1x2", [10.0, 9.0, 8.0]),
        ("5x2", [5.0, 5.0, 5.0]),
        ("_ 1 _x2 2", [None, 1.0, None, None, 2.0]),
        ("-1.5 +Inf -Inf", [-1.5, float("inf"), float("-inf")]),
    ],
)
def test_the_expanding_notation(text: str, values: list[float | None]):
    assert parse_series_values(text) == values


def test_stale_is_the_stale_marker():
    (value,) = parse_series_values("stale")
    assert value is not None and bool(is_stale(np.array([value]))[0])


def test_a_series_is_parsed_with_its_labels():
    assert parse_series('gpu_temp{gpu="0", Hostname="node07"}') == {
        "__name__": "gpu_temp", "gpu": "0", "Hostname": "node07",
    }  # fmt: skip
    assert parse_series('{__name__="up", job="a\\"b"}') == {"__name__": "up", "job": 'a"b'}
