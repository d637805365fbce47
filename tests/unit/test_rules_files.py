"""Rule files are parsed and refused as Prometheus 2.42's rulefmt (and promtool check rules)
refuses them: the same lines, positions included (each expectation below is promtool's
output for the same file; tests/e2e/test_rules_prometheus.py runs promtool on them)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from metricvault.errors import RuleFileError
from metricvault.rules import load_rule_files
from metricvault.rules.durations import parse_prometheus_duration_ms
from metricvault.rules.files import check_rule_files_report, parse_rule_file

VALID = """\
groups:
  - name: g
    interval: 15s
    limit: 10
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: Down
        expr: up == 0
        for: 1m
        keep_firing_for: 2m
        labels: {severity: page}
        annotations:
          summary: "{{ $labels.instance }} down ({{ $value | humanize }})"
"""

# (file text, promtool's lines after "FILE: "); all verified against promtool 2.42
REFUSED = [
    (
        """\
groups:
  - name: g
    rules:
      - record: "bad name"
        expr: up
      - alert: B
        expr: up
        annotations:
          x: "{{ foo }}"
      - record: r
        expr: up
        for: 5m
      - alert: C
        record: D
        expr: up
      - alert: E
      - alert: F
        expr: up
        labels:
          "0bad": x
  - name: g
    rules: []
""",
        [
            '4:17: group "g", rule 1, "bad name": invalid recording rule name: bad name',
            'group "g", rule 2, "B": annotation "x": template: __alert_B:1: function "foo" '
            "not defined",
            '10:17: group "g", rule 3, "r": invalid field \'for\' in recording rule',
            "14:17: 13:16: group \"g\", rule 4, \"C\": only one of 'record' and 'alert' must "
            "be set",
            '0:0: group "g", rule 5, "E": field \'expr\' must be set in rule',
            'group "g", rule 6, "F": invalid label name: 0bad',
            '21:5: groupname: "g" is repeated in the same file',
        ],
    ),
    (
        "groups:\n  - name: g\n    interval: 1m\n    bogus: 1\n    rules:\n"
        "      - alert: A\n        expr: up\n",
        ["yaml: unmarshal errors:\n  line 4: field bogus not found in type rulefmt.RuleGroup"],
    ),
    (
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n"
        "        what: 1\n        for: 1m\n",
        ["yaml: unmarshal errors:\n  line 6: field what not found in type rulefmt.RuleNode"],
    ),
    (
        "foo: 1\n",
        ["yaml: unmarshal errors:\n  line 1: field foo not found in type rulefmt.RuleGroups"],
    ),
    (
        "groups:\n  - name: g\n    interval: 5x\n    rules:\n      - alert: A\n        expr: up\n",
        ['not a valid duration string: "5x"'],
    ),
    (
        'groups:\n  - name: ""\n    rules:\n      - alert: A\n        expr: up\n'
        '        annotations:\n          a: "{{ $labels.x "\n',
        [
            "2:5: Groupname must not be empty",
            'group "", rule 1, "A": annotation "a": template: __alert_A:1: unclosed action',
        ],
    ),
    (
        """\
groups:
  - name: g
    rules:
      - alert: A
        expr: '"x"'
        labels:
          l: "{{ $value | nope }}"
        annotations:
          "a-b": x
      - record: r
        expr: up
        annotations: {a: b}
        keep_firing_for: 1m
      - expr: up
      - alert: ""
        record: ""
        expr: up
""",
        [
            'group "g", rule 1, "A": invalid annotation name: a-b',
            'group "g", rule 1, "A": label "l": template: __alert_A:1: function "nope" not defined',
            '10:17: group "g", rule 2, "r": invalid field \'annotations\' in recording rule',
            '10:17: group "g", rule 2, "r": invalid field \'keep_firing_for\' in recording rule',
            "0:0: group \"g\", rule 3, \"\": one of 'record' or 'alert' must be set",
            "16:17: group \"g\", rule 4, \"\": one of 'record' or 'alert' must be set",
        ],
    ),
    (
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n"
        "        labels:\n          __name__: x\n",
        ['group "g", rule 1, "A": invalid label name: __name__'],
    ),
]


@pytest.mark.parametrize(("text", "expected"), REFUSED)
def test_an_invalid_rule_file_is_refused_with_promtools_lines(text: str, expected: list[str]):
    _, problems = parse_rule_file("f.yml", text)
    assert problems == expected


def test_an_expression_that_does_not_parse_is_refused_at_its_position():
    text = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up ==\n"
    _, problems = parse_rule_file("f.yml", text)
    assert len(problems) == 1
    assert problems[0].startswith('5:15: group "g", rule 1, "A": could not parse expression: ')


def test_a_valid_file_loads_its_groups_and_rules(tmp_path: Path):
    path = tmp_path / "ok.yml"
    path.write_text(VALID)
    (group,) = load_rule_files([str(tmp_path / "*.yml")])
    assert (group.name, group.file, group.interval_ms, group.limit) == ("g", str(path), 15_000, 10)
    record, alert = group.rules
    assert record.name == "job:up:sum" and record.kind == "recording"
    assert alert.spec.for_ms == 60_000 and alert.spec.keep_firing_for_ms == 120_000
    assert dict(alert.spec.labels) == {"severity": "page"}


def test_an_empty_file_holds_no_groups():
    assert parse_rule_file("f.yml", "") == ([], [])


def test_loading_refuses_the_whole_set_when_one_file_is_invalid(tmp_path: Path):
    (tmp_path / "a.yml").write_text(VALID)
    (tmp_path / "b.yml").write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n")
    with pytest.raises(RuleFileError) as caught:
        load_rule_files([str(tmp_path / "*.yml")])
    assert caught.value.path.endswith("b.yml")
    assert "field 'expr' must be set in rule" in caught.value.message
    assert "promtool check rules" in caught.value.message  # says how to check the fix


def test_check_reports_as_promtool(tmp_path: Path):
    good, bad = tmp_path / "ok.yml", tmp_path / "bad.yml"
    good.write_text(VALID)
    bad.write_text("groups:\n  - name: g\n    interval: 5x\n    rules: []\n")
    out, err = io.StringIO(), io.StringIO()
    assert check_rule_files_report([str(good), str(bad)], out, err) == 1
    assert out.getvalue() == (f"Checking {good}\n  SUCCESS: 2 rules found\n\nChecking {bad}\n\n")
    assert err.getvalue() == f'  FAILED:\n{bad}: not a valid duration string: "5x"\n'


def test_duplicate_recording_rules_are_a_lint_warning(tmp_path: Path):
    path = tmp_path / "dup.yml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - record: r\n        expr: up\n"
        "      - record: r\n        expr: up\n"
    )
    out, err = io.StringIO(), io.StringIO()
    assert check_rule_files_report([str(path)], out, err) == 0
    assert "lint error 1 duplicate rule(s) found." in err.getvalue()
    assert check_rule_files_report([str(path)], io.StringIO(), io.StringIO(), True) == 3


@pytest.mark.parametrize(
    ("text", "ms"),
    [("0", 0), ("5m", 300_000), ("1h30m", 5_400_000), ("2d", 172_800_000), ("1y", 31_536_000_000),
     ("100ms", 100), ("1w2d", 777_600_000)],
)  # fmt: skip
def test_durations_are_prometheus_durations(text: str, ms: int):
    assert parse_prometheus_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5", "1.5h", "5x", "1m1h", "-1m"])
def test_a_duration_prometheus_refuses_is_refused(text: str):
    with pytest.raises(ValueError, match="not a valid duration string"):
        parse_prometheus_duration_ms(text)
