"""``promtool test rules`` files, run against this evaluator (``metricvault rules test``).

The file format is promtool's (``rule_files``, ``evaluation_interval``, ``group_eval_order``,
``tests`` with ``interval``, ``input_series`` in the expanding notation ``a+bxN``, ``_``,
``stale``, ``alert_rule_test`` and ``promql_expr_test``) and so is the run: the series are
loaded into memory, every group is evaluated at ``0, interval, 2*interval, ...`` up to the
latest ``eval_time``, alerts are compared at the evaluation at or before each ``eval_time``,
expressions after all evaluations. A failure is reported with promtool's text (``exp:``/
``got:``) and the exit status is 1, so the same file passes or fails both tools alike.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import yaml

from metricvault.errors import MetricVaultError, RuleFileError, UnitTestError
from metricvault.promql import STALE_NAN, Engine, EngineOptions, MemorySource
from metricvault.protocols import SeriesSamples
from metricvault.rules.durations import format_prometheus_duration, parse_prometheus_duration_ms
from metricvault.rules.files import expand_rule_paths, read_rule_files
from metricvault.rules.group import RuleGroup, engine_query
from metricvault.rules.templates import go_format_float

__all__ = ["GrowingSource", "parse_series_values", "rule_test_errors", "run_rule_tests"]

Labels = tuple[tuple[str, str], ...]
_SERIES_ITEM = re.compile(
    r"^(?P<base>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|inf|NaN|nan))"
    r"(?:(?P<delta>[-+](?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+|Inf|inf))?x(?P<times>\d+))?$"
)


class GrowingSource(MemorySource):
    """Series in memory that grow as rules write (promtool's test storage): one entry per
    label set, samples kept in time order; read as :class:`MemorySource` reads its series."""

    def __init__(self) -> None:
        super().__init__()
        self._ts: dict[Labels, list[int]] = {}
        self._vs: dict[Labels, list[float]] = {}
        self._cache: dict[Labels, SeriesSamples] = {}

    def append(self, labels: Mapping[str, str], ts: int, value: float) -> None:
        key = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
        tss, vss = self._ts.setdefault(key, []), self._vs.setdefault(key, [])
        if tss and ts <= tss[-1]:
            if ts == tss[-1]:
                vss[-1] = value
            else:  # out of order: Prometheus's head refuses it; the test's rules never do it
                return
        else:
            tss.append(ts)
            vss.append(value)
        self._cache.pop(key, None)

    def write(self, samples: list[tuple[str, dict[str, str], int, float]]) -> None:
        for metric, labels, ts, value in samples:
            self.append({**labels, "__name__": metric}, ts, value)

    def _series(self, key: Labels) -> SeriesSamples:
        s = self._cache.get(key)
        if s is None:
            s = SeriesSamples(
                dict(key),
                np.asarray(self._ts[key], dtype=np.int64),
                np.asarray(self._vs[key], dtype=np.float64),
            )
            self._cache[key] = s
        return s

    def all_series(self) -> Iterable[SeriesSamples]:
        return (self._series(key) for key in self._ts)


# --------------------------------------------------------------------------- the notation


def parse_series_values(text: str) -> list[float | None]:
    """promtool's ``values``: ``1 2 3``, ``1+2x3`` (1 3 5 7), ``5x2`` (5 5 5), ``_`` (no
    sample), ``_x3`` (three), ``stale``; None for an omitted sample."""
    out: list[float | None] = []
    for item in text.split():
        if item == "_":
            out.append(None)
            continue
        if item.startswith("_x") and item[2:].isdigit():
            out += [None] * int(item[2:])
            continue
        if item == "stale":
            out.append(STALE_NAN)
            continue
        m = _SERIES_ITEM.match(item)
        if m is None:
            raise UnitTestError(f'bad number or duration syntax: "{item}" in values "{text}"')
        base = float(m.group("base"))
        if m.group("times") is None:
            out.append(base)
            continue
        times = int(m.group("times"))
        delta = float(m.group("delta")) if m.group("delta") else 0.0
        out.append(base)
        value = base
        for _ in range(times):  # repeated addition, as Prometheus's parser accumulates
            value += delta
            out.append(value)
    return out


_SERIES = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{.*\})?\s*$", re.S)
_PAIR = re.compile(
    r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)\s*(,|$)""",
    re.S,
)


def parse_series(text: str) -> dict[str, str]:
    """``metric{a="b"}`` (or ``{__name__="metric", ...}``) as a label dict."""
    m = _SERIES.match(text)
    if m is None:
        raise UnitTestError(f'cannot parse the series "{text}": expected metric{{label="v"}}')
    labels: dict[str, str] = {}
    if m.group(1):
        labels["__name__"] = m.group(1)
    body = (m.group(2) or "{}")[1:-1]
    pos = 0
    while body[pos:].strip():
        p = _PAIR.match(body, pos)
        if p is None:
            raise UnitTestError(f'cannot parse the labels of the series "{text}"')
        labels[p.group(1)] = _unquote(p.group(2))
        pos = p.end()
    return labels


def _unquote(quoted: str) -> str:
    body = quoted[1:-1]
    if quoted[0] == "`":
        return body
    return re.sub(
        r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)",
        lambda m: (
            chr(int(m.group(1)[1:], 16))
            if m.group(1)[0] in "xu" and len(m.group(1)) > 1
            else {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1))
        ),
        body,
    )


def go_labels_string(labels: Mapping[str, str]) -> str:
    """Prometheus's ``labels.Labels.String()`` (sorted, Go-quoted values)."""
    return "{" + ", ".join(f"{k}={_go_quote(labels[k])}" for k in sorted(labels)) + "}"


def _go_quote(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _format_e(value: float) -> str:
    """``strconv.FormatFloat(v, 'E', -1, 64)``."""
    return go_format_float(value, "E")


# --------------------------------------------------------------------------- the file


@dataclass
class _TestGroup:
    interval_ms: int
    series: list[tuple[dict[str, str], list[float | None]]]
    alert_tests: list[dict[str, Any]]
    expr_tests: list[dict[str, Any]]
    name: str = ""
    external_labels: dict[str, str] = field(default_factory=dict)
    external_url: str = ""


_FILE_FIELDS = {"rule_files", "evaluation_interval", "group_eval_order", "tests"}
_GROUP_FIELDS = {
    "interval", "input_series", "alert_rule_test", "promql_expr_test", "external_labels",
    "external_url", "name",
}  # fmt: skip


def _strict(obj: Any, known: set[str], type_name: str) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise UnitTestError(f"yaml: unmarshal errors:\n  cannot unmarshal into {type_name}")
    unknown = [k for k in obj if k not in known]
    if unknown:
        raise UnitTestError(
            "yaml: unmarshal errors:\n"
            + "\n".join(f"  field {k} not found in type {type_name}" for k in unknown)
        )
    return obj


def _duration(value: Any, default: int) -> int:
    if value is None:
        return default
    try:
        return parse_prometheus_duration_ms(str(value))
    except ValueError as exc:
        raise UnitTestError(str(exc)) from None


def _go_duration(ms: int) -> str:
    """Go's ``time.Duration.String()`` (``3m0s``), how promtool prints an evaluation time."""
    if ms == 0:
        return "0s"
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s = rest / 1000
    text = f"{s:g}s" if s != int(s) else f"{int(s)}s"
    if h:
        return f"{sign}{h}h{m}m{text}"
    if m:
        return f"{sign}{m}m{text}"
    return sign + text


def _load(path: str) -> tuple[dict[str, Any], list[str]]:
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UnitTestError(
            f"open {path}: {exc.strerror.lower() if exc.strerror else exc}"
        ) from None
    except yaml.YAMLError as exc:
        raise UnitTestError(f"yaml: {exc}") from None
    top = _strict(doc, _FILE_FIELDS, "main.unitTestFile")
    base = os.path.dirname(path)
    rule_files = []
    for f in top.get("rule_files") or []:
        pattern = f if os.path.isabs(f) else os.path.join(base, f)
        rule_files += expand_rule_paths([pattern])
    return top, rule_files


def _test_group(raw: Any, default_interval: int) -> _TestGroup:
    g = _strict(raw, _GROUP_FIELDS, "main.testGroup")
    series = []
    for item in g.get("input_series") or []:
        item = _strict(item, {"series", "values"}, "main.series")
        series.append(
            (
                parse_series(str(item.get("series", ""))),
                parse_series_values(str(item.get("values", ""))),
            )
        )
    alert_tests = []
    for item in g.get("alert_rule_test") or []:
        item = _strict(item, {"eval_time", "alertname", "exp_alerts"}, "main.alertTestCase")
        exp = []
        for a in item.get("exp_alerts") or []:
            a = _strict(a, {"exp_labels", "exp_annotations"}, "main.alert")
            exp.append(
                (
                    {str(k): str(v) for k, v in (a.get("exp_labels") or {}).items()},
                    {str(k): str(v) for k, v in (a.get("exp_annotations") or {}).items()},
                )
            )
        alert_tests.append(
            {
                "eval_time": _duration(item.get("eval_time"), 0),
                "alertname": str(item.get("alertname") or ""),
                "exp": exp,
            }
        )
    expr_tests = []
    for item in g.get("promql_expr_test") or []:
        item = _strict(item, {"expr", "eval_time", "exp_samples"}, "main.promqlTestCase")
        samples = []
        for s in item.get("exp_samples") or []:
            s = _strict(s, {"labels", "value"}, "main.sample")
            samples.append((parse_series(str(s.get("labels") or "{}")), float(s.get("value", 0))))
        expr_tests.append(
            {
                "expr": str(item.get("expr", "")),
                "eval_time": _duration(item.get("eval_time"), 0),
                "exp": samples,
            }
        )
    return _TestGroup(
        _duration(g.get("interval"), default_interval),
        series,
        alert_tests,
        expr_tests,
        str(g.get("name") or ""),
        {str(k): str(v) for k, v in (g.get("external_labels") or {}).items()},
        str(g.get("external_url") or ""),
    )


# --------------------------------------------------------------------------- running


def _alerts_string(items: list[tuple[dict[str, str], dict[str, str]]]) -> str:
    """promtool's ``labelsAndAnnotations.String()``."""
    if not items:
        return "[]"
    parts = []
    for i, (labels, ann) in enumerate(items):
        body = "\n" + f"Labels:{go_labels_string(labels)}\nAnnotations:{go_labels_string(ann)}"
        parts.append(f"{i}:" + _indent(body, "  "))
    return "[\n" + ",\n".join(parts) + "\n]"


def _indent(text: str, indent: str) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0], *(indent + line for line in lines[1:])])


def _sort_key(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted(labels.items())


def _samples_string(samples: list[tuple[dict[str, str], float]]) -> str:
    if not samples:
        return "nil"
    return ", ".join(f"{go_labels_string(lab)} {_format_e(v)}" for lab, v in samples)


def _same_value(a: float, b: float) -> bool:
    return a == b and not (math.isnan(a) or math.isnan(b))


def _run_group(
    tg: _TestGroup, eval_ms: int, order: dict[str, int], rule_files: list[str]
) -> list[str]:
    try:
        specs = read_rule_files(rule_files)
    except RuleFileError as exc:
        return [f"{exc.path}: {p}" for p in exc.problems]
    groups = [RuleGroup(s, tg.interval_ms) for s in specs]
    if order:  # group_eval_order: the named ones first, in that order, the rest after
        groups.sort(key=lambda g: order.get(g.name, len(order)))
    source = GrowingSource()
    inputs = []
    for labels, values in tg.series:
        for i, v in enumerate(values):
            if v is not None:
                inputs.append((i * tg.interval_ms, labels, v))
    inputs.sort(key=lambda x: x[0])
    engine = Engine(source, EngineOptions(subquery_step_ms=eval_ms, use_rollups=False))
    query = engine_query(engine)
    for g in groups:
        for ar in g.alerting_rules():
            ar.restored = True  # promtool marks them restored so ALERTS is written
    times = [t["eval_time"] for t in tg.alert_tests] + [t["eval_time"] for t in tg.expr_tests]
    maxt = max(times, default=0)
    prefix = f"    name: {tg.name},\n" if tg.name else ""
    for t in tg.alert_tests:
        if not t["alertname"]:
            log = f" (in TestGroup {tg.name})" if tg.name else ""
            return [
                "an item under alert_rule_test misses required attribute alertname at "
                f"eval_time {format_prometheus_duration(t['eval_time'])}{log}"
            ]
    alert_times = sorted({t["eval_time"] for t in tg.alert_tests})
    errors: list[str] = []
    loaded = 0
    curr = 0
    ts = 0
    while ts <= maxt:
        while loaded < len(inputs) and inputs[loaded][0] <= ts:
            t_ms, labels, v = inputs[loaded]
            source.append(labels, t_ms, v)
            loaded += 1
        eval_errors = []
        for g in groups:
            g.evaluate(
                ts,
                query,
                source.write,
                external_labels=tg.external_labels,
                external_url=tg.external_url,
            )
            for r in g.rules:
                if r.status.last_error:
                    eval_errors.append(
                        f"    rule: {r.name}, time: {_go_duration(ts)}, err: {r.status.last_error}"
                    )
        errors += eval_errors
        if eval_errors:
            return errors
        while curr < len(alert_times) and ts <= alert_times[curr] < ts + eval_ms:
            at = alert_times[curr]
            errors += _check_alerts(tg, groups, at, prefix)
            curr += 1
        ts += eval_ms
    while loaded < len(inputs):  # what promql_expr_test may read past the last evaluation
        t_ms, labels, v = inputs[loaded]
        source.append(labels, t_ms, v)
        loaded += 1
    for t in tg.expr_tests:
        errors += _check_expr(t, query)
    return errors


def _check_alerts(tg: _TestGroup, groups: list[RuleGroup], at: int, prefix: str) -> list[str]:
    tests = [t for t in tg.alert_tests if t["eval_time"] == at]
    names = {t["alertname"] for t in tests}
    got: dict[str, list[tuple[dict[str, str], dict[str, str]]]] = {}
    for g in groups:
        for r in g.alerting_rules():
            if r.name in names:
                got.setdefault(r.name, []).extend(
                    (dict(a.labels), dict(a.annotations))
                    for a in r.active.values()
                    if a.state == "firing"
                )
    out = []
    for t in tests:
        mine = sorted(got.get(t["alertname"], []), key=lambda a: (_sort_key(a[0]), _sort_key(a[1])))
        exp = sorted(
            (({**labels, "alertname": t["alertname"]}, ann) for labels, ann in t["exp"]),
            key=lambda a: (_sort_key(a[0]), _sort_key(a[1])),
        )
        if mine != exp:
            out.append(
                f"{prefix}    alertname: {t['alertname']}, time: "
                f"{format_prometheus_duration(at)}, \n"
                f"        exp:{_indent(_alerts_string(exp), ' ' * 12)}, \n"
                f"        got:{_indent(_alerts_string(mine), ' ' * 12)}"
            )
    return out


def _check_expr(t: dict[str, Any], query: Any) -> list[str]:
    when = format_prometheus_duration(t["eval_time"])
    try:
        got = query(t["expr"], t["eval_time"])
    except MetricVaultError as exc:
        return [f'    expr: "{t["expr"]}", time: {when}, err: {exc.message}']
    got_sorted = sorted(((dict(lab), v) for lab, v in got), key=lambda s: _sort_key(s[0]))
    exp_sorted = sorted(t["exp"], key=lambda s: _sort_key(s[0]))
    same = len(got_sorted) == len(exp_sorted) and all(
        a[0] == b[0] and _same_value(a[1], b[1])
        for a, b in zip(got_sorted, exp_sorted, strict=True)
    )
    if same:
        return []
    return [
        f'    expr: "{t["expr"]}", time: {when},\n'
        f"        exp: {_samples_string(exp_sorted)}\n"
        f"        got: {_samples_string(got_sorted)}"
    ]


def rule_test_errors(path: str) -> list[str]:
    """promtool's errors for one unit-test file (empty: it passes)."""
    try:
        top, rule_files = _load(path)
        eval_ms = _duration(top.get("evaluation_interval"), 60_000) or 60_000
        order: dict[str, int] = {}
        for i, name in enumerate(top.get("group_eval_order") or []):
            if name in order:
                return [f"group name repeated in evaluation order: {name}"]
            order[name] = i
        errors: list[str] = []
        for raw in top.get("tests") or []:
            tg = _test_group(raw, eval_ms)
            errors += _run_group(tg, eval_ms, order, rule_files)
        return errors
    except MetricVaultError as exc:
        return [exc.message]


def run_rule_tests(
    paths: Sequence[str], out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``promtool test rules`` over ``paths``: its report on stdout/stderr and its exit
    status (0 every file passes, 1 otherwise)."""
    out = out or sys.stdout
    err = err or sys.stderr
    failed = False
    for path in paths:
        print("Unit Testing: ", path, file=out)
        out.flush()
        errors = rule_test_errors(path)
        if errors:
            print("  FAILED:", file=err)
            for e in errors:
                print(e, file=err)
                err.flush()
                print(file=out)
                out.flush()
            failed = True
        else:
            print("  SUCCESS", file=out)
        print(file=out)
    return 1 if failed else 0
