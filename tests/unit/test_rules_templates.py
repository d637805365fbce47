"""Alert templates render as Prometheus renders them (the table is checked against promtool
in tests/e2e/test_rules_prometheus.py) and unknown functions are refused when parsed."""

from __future__ import annotations

import pytest

from metricvault.rules.templates import (
    PROMETHEUS_FUNCTIONS,
    Sample,
    check_template,
    expand_alert_template,
)
from tests.unit.rule_template_cases import LABELS, TEMPLATE_CASES


@pytest.mark.parametrize(("template", "value", "expected"), TEMPLATE_CASES)
def test_a_template_renders_as_prometheus_renders_it(template: str, value: float, expected: str):
    assert expand_alert_template("A", template, LABELS, value) == expected


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("{{ foo }}", 'template: __alert_A:1: function "foo" not defined'),
        ("{{ $value | nope }}", 'template: __alert_A:1: function "nope" not defined'),
        ("{{ $labels.x ", "template: __alert_A:1: unclosed action"),
        ("{{ if true }}x", "template: __alert_A:1: unexpected EOF"),
        ("{{ end }}", "template: __alert_A:1: unexpected {{end}}"),
    ],
)
def test_a_template_that_does_not_parse_is_refused(template: str, problem: str):
    assert check_template("A", template) == problem


def test_every_prometheus_function_parses():
    for name in sorted(PROMETHEUS_FUNCTIONS):
        assert check_template("A", "{{ " + name + " }}") is None, name


def test_a_failing_template_renders_prometheus_error_text():
    out = expand_alert_template("A", '{{ humanize "x" }}', LABELS, 1.0)
    assert out.startswith("<error expanding template: template: __alert_A")


def test_query_runs_an_expression_at_the_evaluation_time():
    seen: list[str] = []

    def query(expr: str) -> list[Sample]:
        seen.append(expr)
        return [Sample({"gpu": "3"}, 81.5), Sample({"gpu": "1"}, 60.0)]

    text = (
        '{{ range query "gpu_temp > 50" | sortByLabel "gpu" }}{{ .Labels.gpu }}:'
        '{{ .Value }} {{ end }}|{{ with query "x" }}{{ . | first | value }}{{ end }}'
    )
    assert expand_alert_template("A", text, LABELS, 1.0, query=query) == "1:60 3:81.5 |81.5"
    assert seen == ["gpu_temp > 50", "x"]


def test_external_url_and_labels_are_offered():
    out = expand_alert_template(
        "A",
        "{{ $externalURL }} {{ $externalLabels.cluster }} {{ pathPrefix }}",
        LABELS,
        1.0,
        external_labels={"cluster": "c1"},
        external_url="https://vault.example/mv",
    )
    assert out == "https://vault.example/mv c1 /mv"
