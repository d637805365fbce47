"""Prometheus rule files: parsed and checked as Prometheus 2.42's ``rulefmt`` checks them.

A file holds ``groups``, each with a ``name``, an optional ``interval`` and ``limit``, and
``rules``: recording rules (``record``, ``expr``, ``labels``) and alerting rules (``alert``,
``expr``, ``for``, ``keep_firing_for``, ``labels``, ``annotations``). Unknown fields, bad
durations, empty or repeated group names, invalid names, expressions that do not parse and
templates that do not parse are refused with the words (and ``line:column`` positions) of
``promtool check rules``, every problem of a file at once.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from metricvault.errors import PromQLError, RuleFileError
from metricvault.promql.parse import parse as parse_promql
from metricvault.rules.durations import parse_prometheus_duration_ms
from metricvault.rules.templates import check_template

__all__ = [
    "DEFAULT_EVALUATION_INTERVAL_MS",
    "GroupSpec",
    "RuleFileError",
    "RuleSpec",
    "check_rule_file",
    "expand_rule_paths",
    "parse_rule_file",
    "read_rule_files",
]

DEFAULT_EVALUATION_INTERVAL_MS = 60_000  # Prometheus's global evaluation_interval

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_GROUPS_FIELDS = {"groups"}
_GROUP_FIELDS = {"name", "interval", "limit", "rules"}
_RULE_FIELDS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


@dataclass(frozen=True)
class RuleSpec:
    """One rule as written: ``record`` or ``alert`` names it."""

    expr: str
    record: str = ""
    alert: str = ""
    for_ms: int = 0
    keep_firing_for_ms: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.alert or self.record


@dataclass(frozen=True)
class GroupSpec:
    name: str
    file: str
    interval_ms: int  # 0: the default evaluation interval
    limit: int = 0
    rules: tuple[RuleSpec, ...] = field(default_factory=tuple)


class _Abort(Exception):
    """A problem that stops decoding the file (as yaml.v3 stops at a custom unmarshaller)."""


@dataclass
class _Decoder:
    """Walks the composed YAML as yaml.v3's strict decoding walks it into rulefmt's types."""

    unknown: list[str] = field(default_factory=list)

    def mapping(self, node: yaml.Node, type_name: str, known: set[str]) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise _Abort(
                f"yaml: unmarshal errors:\n  line {node.start_mark.line + 1}: cannot unmarshal "
                f"{_yaml_kind(node)} into {type_name}"
            )
        out: dict[str, Any] = {}
        for key, value in node.value:
            name = str(key.value)
            if name not in known:
                self.unknown.append(
                    f"  line {key.start_mark.line + 1}: field {name} not found in type {type_name}"
                )
                continue
            out[name] = (key, value)
        return out

    def sequence(self, node: yaml.Node, type_name: str) -> list[yaml.Node]:
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise _Abort(
                f"yaml: unmarshal errors:\n  line {node.start_mark.line + 1}: cannot unmarshal "
                f"{_yaml_kind(node)} into {type_name}"
            )
        return list(node.value)

    def string(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.ScalarNode):
            return "" if node.tag.endswith(":null") else str(node.value)
        raise _Abort(
            f"yaml: unmarshal errors:\n  line {node.start_mark.line + 1}: cannot unmarshal "
            f"{_yaml_kind(node)} into string"
        )

    def duration(self, node: yaml.Node) -> int:
        text = self.string(node)
        try:
            return parse_prometheus_duration_ms(text)
        except ValueError as exc:
            raise _Abort(str(exc)) from None

    def integer(self, node: yaml.Node) -> int:
        text = self.string(node)
        if not re.fullmatch(r"[-+]?\d+", text):
            raise _Abort(
                f"yaml: unmarshal errors:\n  line {node.start_mark.line + 1}: cannot unmarshal "
                f"!!str `{text}` into int"
            )
        return int(text)

    def string_map(self, node: yaml.Node) -> list[tuple[str, str]]:
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return []
        if not isinstance(node, yaml.MappingNode):
            raise _Abort(
                f"yaml: unmarshal errors:\n  line {node.start_mark.line + 1}: cannot unmarshal "
                f"{_yaml_kind(node)} into map[string]string"
            )
        return [(self.string(k), self.string(v)) for k, v in node.value]


def _yaml_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "!!map"
    if isinstance(node, yaml.SequenceNode):
        return "!!seq"
    return f"!!{node.tag.rsplit(':', 1)[-1]} `{node.value}`"


def _pos(node: yaml.Node | None) -> str:
    if node is None:
        return "0:0: "
    return f"{node.start_mark.line + 1}:{node.start_mark.column + 1}: "


def parse_rule_file(path: str, text: str) -> tuple[list[GroupSpec], list[str]]:
    """The groups of one rule file and promtool's problems with it (none: valid)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [f"yaml: {line}{problem}"]
    if root is None:
        return [], []
    dec = _Decoder()
    try:
        raw_groups = _decode_groups(dec, root)
    except _Abort as exc:
        return [], [str(exc)]
    if dec.unknown:
        return [], ["yaml: unmarshal errors:\n" + "\n".join(dec.unknown)]
    problems: list[str] = []
    groups: list[GroupSpec] = []
    seen: set[str] = set()
    for node, fields_, rules in raw_groups:
        name = fields_["name"]
        if name == "":
            problems.append(f"{_pos(node)}Groupname must not be empty")
        if name in seen:
            problems.append(f'{_pos(node)}groupname: "{name}" is repeated in the same file')
        seen.add(name)
        specs = []
        for i, rule in enumerate(rules, start=1):
            for problem in _rule_problems(rule):
                problems.append(_rule_error(name, i, rule, problem))
            specs.append(_rule_spec(rule))
        groups.append(GroupSpec(name, path, fields_["interval"], fields_["limit"], tuple(specs)))
    return groups, problems


def _decode_groups(
    dec: _Decoder, root: yaml.Node
) -> list[tuple[yaml.Node, dict[str, Any], list[dict[str, Any]]]]:
    top = dec.mapping(root, "rulefmt.RuleGroups", _GROUPS_FIELDS)
    out = []
    if "groups" not in top:
        return []
    for gnode in dec.sequence(top["groups"][1], "[]rulefmt.RuleGroup"):
        g = dec.mapping(gnode, "rulefmt.RuleGroup", _GROUP_FIELDS)
        fields_: dict[str, Any] = {
            "name": dec.string(g["name"][1]) if "name" in g else "",
            "interval": dec.duration(g["interval"][1]) if "interval" in g else 0,
            "limit": dec.integer(g["limit"][1]) if "limit" in g else 0,
        }
        rules = []
        for rnode in dec.sequence(g["rules"][1], "[]rulefmt.RuleNode") if "rules" in g else []:
            r = dec.mapping(rnode, "rulefmt.RuleNode", _RULE_FIELDS)
            rule: dict[str, Any] = {"node": rnode}
            for key in ("record", "alert", "expr"):
                rule[key] = (dec.string(r[key][1]), r[key][1]) if key in r else ("", None)
            rule["for"] = dec.duration(r["for"][1]) if "for" in r else 0
            rule["keep_firing_for"] = (
                dec.duration(r["keep_firing_for"][1]) if "keep_firing_for" in r else 0
            )
            rule["labels"] = dec.string_map(r["labels"][1]) if "labels" in r else []
            rule["annotations"] = dec.string_map(r["annotations"][1]) if "annotations" in r else []
            rules.append(rule)
        out.append((gnode, fields_, rules))
    return out


@dataclass(frozen=True)
class _Problem:
    text: str
    node: yaml.Node | None = None
    alt: yaml.Node | None = None
    positioned: bool = True


def _rule_problems(r: dict[str, Any]) -> list[_Problem]:
    """rulefmt's ``RuleNode.Validate``, in its order."""
    record, record_node = r["record"]
    alert, alert_node = r["alert"]
    expr, expr_node = r["expr"]
    out: list[_Problem] = []
    if record and alert:
        out.append(
            _Problem("only one of 'record' and 'alert' must be set", record_node, alert_node)
        )
    if not record and not alert:
        out.append(_Problem("one of 'record' or 'alert' must be set", record_node))
    if not expr:
        out.append(_Problem("field 'expr' must be set in rule", expr_node))
    else:
        try:
            parse_promql(expr)
        except PromQLError as exc:
            out.append(_Problem(f"could not parse expression: {exc.message}", expr_node))
    if record:
        if r["annotations"]:
            out.append(_Problem("invalid field 'annotations' in recording rule", record_node))
        if r["for"]:
            out.append(_Problem("invalid field 'for' in recording rule", record_node))
        if r["keep_firing_for"]:
            out.append(_Problem("invalid field 'keep_firing_for' in recording rule", record_node))
        if not _METRIC_NAME.fullmatch(record):
            out.append(_Problem(f"invalid recording rule name: {record}", record_node))
    for name, _ in r["labels"]:
        if not _LABEL_NAME.fullmatch(name) or name == "__name__":
            out.append(_Problem(f"invalid label name: {name}", positioned=False))
    for name, _ in r["annotations"]:
        if not _LABEL_NAME.fullmatch(name):
            out.append(_Problem(f"invalid annotation name: {name}", positioned=False))
    if alert:
        for kind, pairs in (("label", r["labels"]), ("annotation", r["annotations"])):
            for name, text in pairs:
                problem = check_template(alert, text)
                if problem:
                    out.append(_Problem(f'{kind} "{name}": {problem}', positioned=False))
    return out


def _rule_error(group: str, index: int, r: dict[str, Any], p: _Problem) -> str:
    name = r["alert"][0] or r["record"][0]
    where = f'group "{group}", rule {index}, "{name}": {p.text}'
    if not p.positioned:
        return where
    if p.alt is not None:
        return f"{_pos(p.node)}{_pos(p.alt)}{where}"
    return f"{_pos(p.node)}{where}"


def _rule_spec(r: dict[str, Any]) -> RuleSpec:
    return RuleSpec(
        expr=r["expr"][0],
        record=r["record"][0],
        alert=r["alert"][0],
        for_ms=r["for"],
        keep_firing_for_ms=r["keep_firing_for"],
        labels=tuple(r["labels"]),
        annotations=tuple(r["annotations"]),
    )


def check_rule_file(path: str) -> tuple[list[GroupSpec], list[str]]:
    """``path`` read and checked: its groups and promtool's problems (an unreadable file is
    one problem, in Go's words)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [f"open {path}: no such file or directory"]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"read {path}: {exc}"]
    return parse_rule_file(path, text)


def expand_rule_paths(patterns: Iterable[str]) -> list[str]:
    """Each pattern's files (globbed as Prometheus globs ``rule_files``, sorted), in order,
    each once; a pattern that matches nothing adds nothing, as in Prometheus."""
    out: list[str] = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for path in matched:
            if path not in out:
                out.append(path)
    return out


def read_rule_files(patterns: Iterable[str]) -> list[GroupSpec]:
    """Every group of every file the patterns name; :class:`RuleFileError` for the first
    file Prometheus would refuse (nothing is loaded from any file then)."""
    groups: list[GroupSpec] = []
    for path in expand_rule_paths(patterns):
        specs, problems = check_rule_file(path)
        if problems:
            raise RuleFileError(path, problems)
        groups.extend(specs)
    return groups


def duplicate_recording_rules(
    groups: Sequence[GroupSpec],
) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Recording rules that write the same series (name and labels), as ``promtool``'s
    duplicate-rules lint finds them."""
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for g in groups:
        for r in g.rules:
            if r.record:
                key = (r.record, tuple(sorted(r.labels)))
                seen[key] = seen.get(key, 0) + 1
    return sorted(k for k, n in seen.items() if n > 1)


def check_rule_files_report(
    paths: Sequence[str], out: Any, err: Any, lint_fatal: bool = False
) -> int:
    """``promtool check rules`` over ``paths``: its report and exit status (1: a file is
    invalid; a duplicate recording rule is a lint warning, an error only with ``lint_fatal``,
    then status 3 as promtool's)."""
    failed = has_errors = False
    for path in paths:
        print("Checking", path, file=out)
        groups, problems = check_rule_file(path)
        lint = False
        if not problems:
            dups = duplicate_recording_rules(groups)
            if dups:
                text = f"lint error {len(dups)} duplicate rule(s) found.\n"
                for metric, labels in dups:
                    text += f"Metric: {metric}\nLabel(s):\n"
                    text += "".join(f"\t{k}: {v}\n" for k, v in labels)
                problems = [text + "Might cause inconsistency while recording expressions"]
                lint = True
        if problems:
            out.flush()
            print("  FAILED:", file=err)
            for p in problems:
                print(p if lint else f"{path}: {p}", file=err)
            err.flush()
            failed = True
            has_errors = has_errors or not lint
        else:
            print(f"  SUCCESS: {sum(len(g.rules) for g in groups)} rules found", file=out)
        print(file=out)
    if failed and has_errors:
        return 1
    if failed and lint_fatal:
        return 3
    return 0
