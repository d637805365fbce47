"""Alert label and annotation templates, expanded as Prometheus 2.42 expands them.

Prometheus renders ``labels`` and ``annotations`` of an alerting rule with Go's text/template
and the functions of its ``template/template.go``. This is that language, parsed and run here:
text and ``{{ actions }}`` (``{{-``/``-}}`` trim spaces, ``{{/* comments */}}``), pipelines
with ``|``, variables (``$x := ...``, ``$x = ...``, ``$`` the data), fields and map keys
(``.Labels.job``, ``$labels.job``), ``if``/``else if``/``else``/``range``/``with``/``end``,
``break``/``continue``, literals (strings, raw strings, numbers, booleans, ``nil``), Go's
built-ins (``and or not eq ne lt le gt ge len index slice print printf println html js
urlquery call``) and Prometheus's (``query first label value strvalue args reReplaceAll
safeHtml match title toUpper toLower graphLink tableLink sortByLabel humanize humanize1024
humanizeDuration humanizePercentage humanizeTimestamp toTime pathPrefix externalURL
parseDuration stripPort stripDomain``). An unknown function is refused when the template is
parsed, in Go's words (``function "foo" not defined``), as ``promtool check rules`` refuses it.
"""

from __future__ import annotations

import functools
import html as html_lib
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import re2

from metricvault.errors import TemplateError
from metricvault.rules.durations import parse_prometheus_duration_ms

__all__ = [
    "PROMETHEUS_FUNCTIONS",
    "QueryFunc",
    "Sample",
    "TemplateError",
    "alert_template",
    "check_template",
    "expand_alert_template",
    "go_format_value",
    "go_sprintf",
]


@dataclass
class Sample:
    """One sample of a ``query`` result, as templates see it: ``.Labels`` and ``.Value``."""

    Labels: dict[str, str]
    Value: float


QueryFunc = Callable[[str], list[Sample]]

# Go's text/template built-ins and Prometheus's functions: only these names may be called.
GO_BUILTINS = frozenset(
    {
        "and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "len", "index", "slice",
        "print", "printf", "println", "html", "js", "urlquery", "call",
    }
)  # fmt: skip
PROMETHEUS_FUNCTIONS = frozenset(
    {
        "query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml",
        "match", "title", "toUpper", "toLower", "graphLink", "tableLink", "sortByLabel",
        "humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
        "humanizeTimestamp", "toTime", "pathPrefix", "externalURL", "parseDuration",
        "stripPort", "stripDomain",
    }
)  # fmt: skip
KNOWN_FUNCTIONS = GO_BUILTINS | PROMETHEUS_FUNCTIONS

# Prometheus prefixes every alert template with these, so $labels, $value, ... exist.
ALERT_DEFS = (
    "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}"
    "{{$externalURL := .ExternalURL}}{{$value := .Value}}"
)


# --------------------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(- )?")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?)"
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class _Tok:
    kind: str  # text, ident, field, var, string, number, bool, nil, pipe, lparen, rparen,
    value: Any  # decl (:=), assign (=), dot, comma, end (of action), char
    line: int


class _Lexer:
    def __init__(self, name: str, src: str) -> None:
        self.name, self.src = name, src
        self.items: list[_Tok] = []

    def fail(self, line: int, msg: str) -> TemplateError:
        return TemplateError(f"template: {self.name}:{line}: {msg}")

    def line_at(self, pos: int) -> int:
        return self.src.count("\n", 0, pos) + 1

    def run(self) -> list[_Tok]:
        pos, src = 0, self.src
        while pos < len(src):
            m = _ACTION.search(src, pos)
            if m is None:
                self.items.append(_Tok("text", src[pos:], self.line_at(pos)))
                break
            text = src[pos : m.start()]
            if m.group(1):
                text = text.rstrip(" \t\r\n")
            if text:
                self.items.append(_Tok("text", text, self.line_at(pos)))
            pos = self.action(m.end())
        return self.items

    def action(self, pos: int) -> int:
        src = self.src
        line = self.line_at(pos)
        if src.startswith("/*", pos):
            close = src.find("*/", pos + 2)
            if close < 0:
                raise self.fail(line, "unclosed comment")
            end = close + 2
            trim = src.startswith(" -}}", end)
            if trim:
                end += 4
            elif src.startswith("}}", end):
                end += 2
            else:
                raise self.fail(line, "comment ends before closing delimiter")
            return self._trim_after(end) if trim else end
        toks: list[_Tok] = []
        depth = 0
        while True:
            if pos >= len(src):
                raise self.fail(line, "unclosed action")
            c = src[pos]
            if src.startswith(" -}}", pos) or src.startswith("}}", pos):
                if depth:
                    raise self.fail(line, "unclosed left paren")
                trim = src.startswith(" -}}", pos)
                pos += 4 if trim else 2
                toks.append(_Tok("end", None, line))
                self.items.extend(toks)
                return self._trim_after(pos) if trim else pos
            if c in " \t\r":
                pos += 1
            elif c == "\n":
                raise self.fail(line, "unclosed action")
            elif c == "|":
                toks.append(_Tok("pipe", "|", line))
                pos += 1
            elif c == "(":
                depth += 1
                toks.append(_Tok("lparen", "(", line))
                pos += 1
            elif c == ")":
                if not depth:
                    raise self.fail(line, "unexpected right paren U+0029 ')'")
                depth -= 1
                toks.append(_Tok("rparen", ")", line))
                pos += 1
            elif c == ",":
                toks.append(_Tok("comma", ",", line))
                pos += 1
            elif src.startswith(":=", pos):
                toks.append(_Tok("decl", ":=", line))
                pos += 2
            elif c == "=":
                toks.append(_Tok("assign", "=", line))
                pos += 1
            elif c == '"':
                pos = self._quoted(pos, toks, line)
            elif c == "`":
                close = src.find("`", pos + 1)
                if close < 0:
                    raise self.fail(line, "unterminated raw quoted string")
                toks.append(_Tok("string", src[pos + 1 : close], line))
                pos = close + 1
            elif c == "'":
                m = re.compile(r"'(\\.|[^\\'])'").match(src, pos)
                if m is None:
                    raise self.fail(line, "unterminated character constant")
                toks.append(_Tok("number", ord(_go_unquote(m.group(1))), line))
                pos = m.end()
            elif c == "$":
                m = _IDENT.match(src, pos + 1)
                name = "$" + (m.group(0) if m else "")
                pos += len(name)
                toks.append(_Tok("var", name, line))
                pos = self._fields(pos, toks, line)
            elif c == ".":
                m = _IDENT.match(src, pos + 1)
                if m is None:
                    if pos + 1 < len(src) and src[pos + 1].isdigit():
                        pos = self._number(pos, toks, line)
                        continue
                    toks.append(_Tok("dot", ".", line))
                    pos += 1
                    continue
                pos = self._fields(pos, toks, line, first=True)
            elif c.isdigit() or (c in "+-" and pos + 1 < len(src) and src[pos + 1].isdigit()):
                pos = self._number(pos, toks, line)
            elif _IDENT.match(src, pos):
                word = _IDENT.match(src, pos).group(0)  # type: ignore[union-attr]
                pos += len(word)
                if word in ("true", "false"):
                    toks.append(_Tok("bool", word == "true", line))
                elif word == "nil":
                    toks.append(_Tok("nil", None, line))
                else:
                    toks.append(_Tok("ident", word, line))
            else:
                raise self.fail(line, f"unexpected {_go_char(c)} in command")

    def _trim_after(self, pos: int) -> int:
        while pos < len(self.src) and self.src[pos] in " \t\r\n":
            pos += 1
        return pos

    def _quoted(self, pos: int, toks: list[_Tok], line: int) -> int:
        m = re.compile(r'"((?:\\.|[^\\"\n])*)"').match(self.src, pos)
        if m is None:
            raise self.fail(line, "unterminated quoted string")
        toks.append(_Tok("string", _go_unquote(m.group(1)), line))
        return m.end()

    def _number(self, pos: int, toks: list[_Tok], line: int) -> int:
        m = _NUMBER.match(self.src, pos)
        if m is None:
            raise self.fail(line, f"bad number syntax: {self.src[pos : pos + 1]!r}")
        text = m.group(0).replace("_", "")
        try:
            value: Any = (
                int(text, 0) if re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text)
            )
        except ValueError:
            raise self.fail(line, f'bad number syntax: "{m.group(0)}"') from None
        toks.append(_Tok("number", value, line))
        return m.end()

    def _fields(self, pos: int, toks: list[_Tok], line: int, first: bool = False) -> int:
        names: list[str] = []
        while pos < len(self.src) and self.src[pos] == ".":
            m = _IDENT.match(self.src, pos + 1)
            if m is None:
                break
            names.append(m.group(0))
            pos = m.end()
        if first:
            toks.append(_Tok("field", names, line))
        elif names:
            toks[-1] = _Tok("var", (toks[-1].value, names), line)
        return pos


def _go_char(c: str) -> str:
    return f"<{c}>" if not c.isprintable() else f'"{c}"'


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a",
            "b": "\b", "f": "\f", "v": "\v", "0": "\0"}  # fmt: skip


def _go_unquote(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        esc = m.group(1)
        if esc[0] in "xuU":
            return chr(int(esc[1:], 16))
        return _ESCAPES.get(esc, esc)

    return re.sub(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", one, body)


# --------------------------------------------------------------------------- parsing


@dataclass
class _Cmd:
    args: list[Any]  # operands: ("field", names), ("var", name, names), ("lit", v), ("ident", n),
    #                   ("pipe", _Pipe, names), ("dot",)


@dataclass
class _Pipe:
    decl: list[str]
    assign: bool
    cmds: list[_Cmd]


@dataclass
class _Node:
    kind: str  # text, action, if, range, with, break, continue
    text: str = ""
    pipe: _Pipe | None = None
    body: list[_Node] = field(default_factory=list)
    orelse: list[_Node] = field(default_factory=list)


class _Parser:
    def __init__(self, name: str, toks: list[_Tok]) -> None:
        self.name, self.toks, self.i = name, toks, 0
        self.range_depth = 0

    def fail(self, line: int, msg: str) -> TemplateError:
        return TemplateError(f"template: {self.name}:{line}: {msg}")

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def parse(self) -> list[_Node]:
        nodes, stop = self.list_until(set())
        if stop is not None:
            raise self.fail(stop.line, f"unexpected {{{{{stop.value}}}}}")
        return nodes

    def list_until(self, stops: set[str]) -> tuple[list[_Node], _Tok | None]:
        nodes: list[_Node] = []
        while (tok := self.peek()) is not None:
            if tok.kind == "text":
                self.take()
                nodes.append(_Node("text", text=tok.value))
                continue
            if tok.kind == "ident" and tok.value in ("end", "else"):
                if tok.value not in stops:
                    raise self.fail(tok.line, f"unexpected {{{{{tok.value}}}}}")
                self.take()
                return nodes, tok
            nodes.append(self.action())
        return nodes, None

    def action(self) -> _Node:
        tok = self.peek()
        assert tok is not None
        if tok.kind == "end":  # {{}}
            raise self.fail(tok.line, "missing value for command")
        if tok.kind == "ident" and tok.value in ("if", "range", "with"):
            self.take()
            return self.control(tok)
        if tok.kind == "ident" and tok.value in ("break", "continue"):
            self.take()
            if not self.range_depth:
                raise self.fail(tok.line, f"{{{{{tok.value}}}}} outside {{{{range}}}}")
            self.expect_end(tok.value)
            return _Node(tok.value)
        if tok.kind == "ident" and tok.value in ("define", "template", "block"):
            raise self.fail(tok.line, f"{{{{{tok.value}}}}} is not supported in alert templates")
        return _Node("action", pipe=self.pipeline(tok.line, "command"))

    def expect_end(self, ctx: str) -> None:
        tok = self.take() if self.peek() is not None else None
        if tok is None or tok.kind != "end":
            line = tok.line if tok else 0
            raise self.fail(line, f"unexpected {tok.value if tok else 'EOF'} in {ctx}")

    def control(self, tok: _Tok) -> _Node:
        kind = tok.value
        pipe = self.pipeline(tok.line, kind)
        if kind == "range":
            self.range_depth += 1
        body, stop = self.list_until({"end", "else"})
        if kind == "range":
            self.range_depth -= 1
        if stop is None:
            raise self.fail(tok.line, "unexpected EOF")
        node = _Node(kind, pipe=pipe, body=body)
        if stop.value == "else":
            nxt = self.peek()
            if (
                nxt is not None
                and nxt.kind == "ident"
                and nxt.value in ("if", "with")
                and kind == nxt.value
            ):
                self.take()
                node.orelse = [self.control(nxt)]  # else if: its {{end}} closes both
                return node
            self.expect_end("else")
            node.orelse, stop = self.list_until({"end"})
            if stop is None:
                raise self.fail(tok.line, "unexpected EOF")
        self.expect_end("end")
        return node

    def pipeline(self, line: int, ctx: str) -> _Pipe:
        decl: list[str] = []
        assign = False
        # $x := ... / $x = ... / $i, $e := (range)
        j = self.i
        names = []
        while (
            j < len(self.toks)
            and self.toks[j].kind == "var"
            and isinstance(self.toks[j].value, str)
        ):
            names.append(self.toks[j].value)
            j += 1
            if j < len(self.toks) and self.toks[j].kind == "comma":
                j += 1
                continue
            break
        if names and j < len(self.toks) and self.toks[j].kind in ("decl", "assign"):
            assign = self.toks[j].kind == "assign"
            decl = names
            self.i = j + 1
        cmds: list[_Cmd] = []
        while True:
            tok = self.peek()
            if tok is None:
                raise self.fail(line, "unclosed action")
            if tok.kind in ("end", "rparen"):
                if not cmds:
                    raise self.fail(tok.line, f"missing value for {ctx}")
                if tok.kind == "end":
                    self.take()
                return _Pipe(decl, assign, cmds)
            cmds.append(self.command(line))
            nxt = self.peek()
            if nxt is not None and nxt.kind == "pipe":
                self.take()
                nxt2 = self.peek()
                if nxt2 is None or nxt2.kind in ("end", "rparen"):
                    raise self.fail(line, "missing command")

    def command(self, line: int) -> _Cmd:
        args: list[Any] = []
        while True:
            tok = self.peek()
            if tok is None or tok.kind in ("end", "rparen", "pipe"):
                break
            self.take()
            if tok.kind == "ident":
                if tok.value not in KNOWN_FUNCTIONS:
                    raise self.fail(tok.line, f'function "{tok.value}" not defined')
                args.append(("ident", tok.value))
            elif tok.kind == "field":
                args.append(("field", tok.value))
            elif tok.kind == "var":
                name, names = (tok.value, []) if isinstance(tok.value, str) else tok.value
                args.append(("var", name, names))
            elif tok.kind == "dot":
                args.append(("dot",))
            elif tok.kind in ("string", "number", "bool", "nil"):
                args.append(("lit", tok.value))
            elif tok.kind == "lparen":
                inner = self.pipeline(tok.line, "parenthesized pipeline")
                close = self.take()
                assert close.kind == "rparen"
                chain: list[str] = []
                nxt = self.peek()
                if nxt is not None and nxt.kind == "field":
                    chain = self.take().value
                args.append(("pipe", inner, chain))
            else:
                raise self.fail(tok.line, f"unexpected {tok.value!r} in operand")
        if not args:
            raise self.fail(line, "missing value for command")
        return _Cmd(args)


@dataclass
class Template:
    name: str
    nodes: list[_Node]


def parse_template(name: str, text: str) -> Template:
    toks = _Lexer(name, text).run()
    return Template(name, _Parser(name, toks).parse())


@functools.lru_cache(maxsize=8192)
def alert_template(alert_name: str, text: str) -> Template:
    """``text`` parsed as Prometheus parses an alert's label or annotation (its defs first).
    Cached: every alert of every round expands the same few texts, and executing a template
    never changes its tree."""
    return parse_template("__alert_" + alert_name, ALERT_DEFS + text)


def check_template(alert_name: str, text: str) -> str | None:
    """Go's words for why ``text`` does not parse, or None (promtool's template check)."""
    try:
        alert_template(alert_name, text)
    except TemplateError as exc:
        return str(exc)
    return None


# --------------------------------------------------------------------------- running


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Missing:
    """A map's missing key: Go prints ``<no value>`` for it."""

    def __str__(self) -> str:
        return "<no value>"


MISSING = _Missing()


@dataclass
class _Env:
    query: QueryFunc | None
    external_url: str
    vars: list[tuple[str, Any]]


class _Exec:
    def __init__(self, tmpl: Template, env: _Env) -> None:
        self.tmpl, self.env = tmpl, env
        self.out: list[str] = []

    def fail(self, msg: str) -> TemplateError:
        return TemplateError(f"template: {self.tmpl.name}: executing: {msg}")

    def lookup(self, name: str) -> Any:
        for n, v in reversed(self.env.vars):
            if n == name:
                return v
        raise self.fail(f"undefined variable: {name}")

    def set_var(self, name: str, value: Any) -> None:
        for k in range(len(self.env.vars) - 1, -1, -1):
            if self.env.vars[k][0] == name:
                self.env.vars[k] = (name, value)
                return
        raise self.fail(f"undefined variable: {name}")

    def run(self, nodes: list[_Node], dot: Any) -> None:
        for node in nodes:
            self.node(node, dot)

    def node(self, node: _Node, dot: Any) -> None:
        if node.kind == "text":
            self.out.append(node.text)
        elif node.kind == "action":
            assert node.pipe is not None
            value = self.pipe(node.pipe, dot)
            if not node.pipe.decl:
                self.out.append(go_print_value(value))
        elif node.kind in ("if", "with"):
            mark = len(self.env.vars)
            assert node.pipe is not None
            value = self.pipe(node.pipe, dot)
            if truth(value):
                self.run(node.body, value if node.kind == "with" else dot)
            else:
                self.run(node.orelse, dot)
            del self.env.vars[mark:]
        elif node.kind == "range":
            self.range(node, dot)
        elif node.kind == "break":
            raise _Break()
        elif node.kind == "continue":
            raise _Continue()

    def range(self, node: _Node, dot: Any) -> None:
        assert node.pipe is not None
        pipe = _Pipe([], False, node.pipe.cmds)
        value = self.pipe(pipe, dot)
        if isinstance(value, Mapping):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list | tuple):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        elif value is None:
            items = []
        else:
            raise self.fail(f"range can't iterate over {go_print_value(value)}")
        if not items:
            self.run(node.orelse, dot)
            return
        for key, elem in items:
            mark = len(self.env.vars)
            names = node.pipe.decl
            if len(names) == 1:
                self.env.vars.append((names[0], elem))
            elif len(names) == 2:
                self.env.vars += [(names[0], key), (names[1], elem)]
            try:
                self.run(node.body, elem)
            except _Continue:
                pass
            except _Break:
                del self.env.vars[mark:]
                break
            del self.env.vars[mark:]

    def pipe(self, pipe: _Pipe, dot: Any) -> Any:
        value: Any = _NOFINAL
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, value)
        for name in pipe.decl:
            if pipe.assign:
                self.set_var(name, value)
            else:
                self.env.vars.append((name, value))
        return value

    def command(self, cmd: _Cmd, dot: Any, final: Any) -> Any:
        first = cmd.args[0]
        if first[0] == "ident":
            args = [self.operand(a, dot) for a in cmd.args[1:]]
            if final is not _NOFINAL:
                args.append(final)
            return self.call(first[1], args)
        if len(cmd.args) > 1 or final is not _NOFINAL:
            raise self.fail(f"can't give argument to non-function {self.describe(first)}")
        return self.operand(first, dot)

    def describe(self, arg: Any) -> str:
        if arg[0] == "lit":
            return go_print_value(arg[1])
        if arg[0] == "field":
            return "." + ".".join(arg[1])
        return str(arg[1])

    def operand(self, arg: Any, dot: Any) -> Any:
        kind = arg[0]
        if kind == "lit":
            return arg[1]
        if kind == "dot":
            return dot
        if kind == "field":
            return self.fields(dot, arg[1])
        if kind == "var":
            return self.fields(self.lookup(arg[1]), arg[2])
        if kind == "pipe":
            return self.fields(self.pipe(arg[1], dot), arg[2])
        if kind == "ident":
            return self.call(arg[1], [])
        raise self.fail(f"bad operand {arg!r}")

    def fields(self, value: Any, names: Sequence[str]) -> Any:
        for name in names:
            if isinstance(value, Mapping):  # Prometheus runs templates with missingkey=zero
                value = value.get(name, "")
            elif isinstance(value, Sample) and name in ("Labels", "Value"):
                value = getattr(value, name)
            elif value is None or value is MISSING:
                raise self.fail(f"nil pointer evaluating interface {{}}.{name}")
            else:
                raise self.fail(f"can't evaluate field {name} in type {go_type(value)}")
        return value

    def call(self, name: str, args: list[Any]) -> Any:
        try:
            return _call(name, args, self.env)
        except TemplateError as exc:
            raise self.fail(f"error calling {name}: {exc}") from None


class _NoFinal:
    pass


_NOFINAL = _NoFinal()


def truth(value: Any) -> bool:
    if value is None or value is MISSING:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str | list | tuple | dict | Mapping):
        return len(value) > 0
    return True


def go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map[string]string"
    if isinstance(value, Sample):
        return "*template.sample"
    if isinstance(value, list):
        return "template.queryResult"
    return type(value).__name__


def expand_alert_template(
    alert_name: str,
    text: str,
    labels: Mapping[str, str],
    value: float,
    *,
    external_labels: Mapping[str, str] | None = None,
    external_url: str = "",
    query: QueryFunc | None = None,
) -> str:
    """``text`` expanded for one alert, or Prometheus's ``<error expanding template: ...>``."""
    if "{{" not in text:  # no action: text/template writes the text as it is
        return text
    try:
        tmpl = alert_template(alert_name, text)
        data = {
            "Labels": dict(labels),
            "ExternalLabels": dict(external_labels or {}),
            "ExternalURL": external_url,
            "Value": float(value),
        }
        run = _Exec(tmpl, _Env(query, external_url, [("$", data)]))
        run.run(tmpl.nodes, data)
        out = "".join(run.out)
    except TemplateError as exc:
        return f"<error expanding template: {exc}>"
    # html/template is not used for alerts; text/template's output as is
    return out


# --------------------------------------------------------------------------- Go formatting


def go_format_float(v: float, verb: str = "g") -> str:
    """Go's shortest ``strconv.FormatFloat(v, verb, -1, 64)`` for ``g``/``G``/``e``/``E``
    (``%v`` of a float64 is ``g``): exponent form below 1e-4 or from 1e6 on for ``g``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    mant, exp = _shortest(abs(v))
    sign = "-" if math.copysign(1, v) < 0 else ""
    e = "E" if verb in "GE" else "e"
    if verb in "eE" or exp < -4 or exp >= 6:  # Go: shortest 'g' decides with precision 6
        return sign + _exp_text(mant, exp, e)
    return sign + _fixed_text(mant, exp)


def _shortest(v: float) -> tuple[str, int]:
    """The shortest digits of ``v`` that read back to it, and its decimal exponent
    (``1500.0`` -> ("15", 3)), as Go's strconv finds them (Python's repr finds the same)."""
    if v == 0:
        return "0", 0
    t = Decimal(repr(v)).as_tuple()
    digits = "".join(map(str, t.digits))
    exp = int(t.exponent) + len(digits) - 1
    return digits.rstrip("0") or "0", exp


def _exp_text(mant: str, exp: int, e: str) -> str:
    body = mant[0] + ("." + mant[1:] if len(mant) > 1 else "")
    return f"{body}{e}{'+' if exp >= 0 else '-'}{abs(exp):02d}"


def _fixed_text(mant: str, exp: int) -> str:
    if exp < 0:
        return "0." + "0" * (-exp - 1) + mant
    if len(mant) <= exp + 1:
        return mant + "0" * (exp + 1 - len(mant))
    return mant[: exp + 1] + "." + mant[exp + 1 :]


def go_format_value(v: float) -> str:
    """``fmt.Sprint`` of a float64 (``%v``): shortest digits, exponent past 1e21 or below
    1e-4 (Go's %v threshold for floats)."""
    return go_format_float(v, "g")


def go_print_value(value: Any) -> str:
    """How ``{{ x }}`` prints ``x`` (Go's ``fmt.Sprint``)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_format_value(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{k}:{go_print_value(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, Sample):
        return "&{" + go_print_value(value.Labels) + " " + go_print_value(value.Value) + "}"
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_print_value(v) for v in value) + "]"
    return str(value)


def _go_g4(v: float) -> str:
    """Go's ``%.4g``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d+)?)?([a-zA-Z%])")


def go_sprintf(fmt: str, args: Sequence[Any]) -> str:
    """Go's ``fmt.Sprintf`` for the verbs templates use (%s %v %d %f %e %g %x %X %q %t %%),
    with Go's ``%!verb(type=value)`` for a mismatch and ``%!(EXTRA ...)`` for extra args."""
    out: list[str] = []
    pos, argi = 0, 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[argi]
        argi += 1
        out.append(_format_one(arg, flags, width, prec, verb))
    out.append(fmt[pos:])
    if argi < len(args):
        extra = ", ".join(f"{go_type(a)}={go_print_value(a)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _format_one(arg: Any, flags: str, width: str | None, prec: str | None, verb: str) -> str:
    spec_prec = "" if prec is None else "." + prec
    bad = f"%!{verb}({go_type(arg)}={go_print_value(arg)})"
    if verb == "v":
        text = go_print_value(arg)
    elif verb == "s":
        if not isinstance(arg, str):
            return bad if not isinstance(arg, Mapping | list) else go_print_value(arg)
        text = arg if prec is None else arg[: int(prec)]
    elif verb == "q":
        if not isinstance(arg, str):
            return bad
        text = '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    elif verb == "t":
        if not isinstance(arg, bool):
            return bad
        text = "true" if arg else "false"
    elif verb in "dxXob":
        if not isinstance(arg, int) or isinstance(arg, bool):
            if verb in "xX" and isinstance(arg, str):
                text = arg.encode().hex()
                text = text.upper() if verb == "X" else text
            else:
                return bad
        else:
            text = format(arg, {"d": "d", "x": "x", "X": "X", "o": "o", "b": "b"}[verb])
    elif verb in "feEgG":
        if not isinstance(arg, float | int) or isinstance(arg, bool):
            return bad
        v = float(arg)
        if math.isnan(v) or math.isinf(v):
            text = "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
        elif verb in "gG" and prec is None:
            text = go_format_float(v, verb)
        elif verb in "eE" and prec is None:
            text = f"{v:.6{verb}}"
        else:
            text = f"{v:{'+' if '+' in flags else ''}{spec_prec}{verb}}"
            if verb in "f" and prec is None:
                text = f"{v:{'+' if '+' in flags else ''}.6f}"
        if "+" in flags and not text.startswith(("-", "+")):
            text = "+" + text
    else:
        return bad
    if width and width != "*":
        w = int(width)
        if "-" in flags:
            text = text.ljust(w)
        elif "0" in flags and verb not in "sqvt":
            sign = text[0] if text[:1] in "+-" else ""
            text = sign + text[len(sign) :].rjust(w - len(sign), "0")
        else:
            text = text.rjust(w)
    return text


# --------------------------------------------------------------------------- functions


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TemplateError("can't convert bool to float")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace("_", "")) if value.strip() else _bad_float(value)
        except ValueError:
            raise TemplateError(f'strconv.ParseFloat: parsing "{value}": invalid syntax') from None
    raise TemplateError(f"can't convert {go_type(value)} to float")


def _bad_float(value: str) -> float:
    raise TemplateError(f'strconv.ParseFloat: parsing "{value}": invalid syntax')


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _go_g4(v)
    if abs(v) >= 1:
        prefix = ""
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _go_g4(v) + prefix
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _go_g4(v) + prefix


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _go_g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _go_g4(v) + prefix


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _go_g4(v)
    if v == 0:
        return _go_g4(v) + "s"
    if abs(v) >= 1:
        sign = ""
        if v < 0:
            sign, v = "-", -v
        d = int(v)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_go_g4(v)}{prefix}s"


def humanize_timestamp(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _go_g4(v)
    ns = v * 1e9
    if ns > 2**63 - 1 or ns < -(2**63):
        raise TemplateError(
            f"{go_format_value(v)} cannot be represented as a nanoseconds timestamp since it "
            "overflows int64"
        )
    return go_time_string(int(ns) // 1_000_000)


def go_time_string(ms: int) -> str:
    """Go's ``time.Time.String()`` of a UTC time with millisecond precision."""
    t = datetime.fromtimestamp(ms / 1000, UTC)
    frac = ms % 1000
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if frac:
        text += ("." + f"{frac:03d}").rstrip("0")
    return text + " +0000 UTC"


def _parse_duration(text: str) -> float:
    """Prometheus's ``model.ParseDuration`` in seconds (``1h30m``, ``2d``)."""
    return parse_prometheus_duration_ms(text) / 1000


def _first(value: Any) -> Any:
    if isinstance(value, list) and value:
        return value[0]
    raise TemplateError("first() called on vector with no elements")


def _sort_by_label(label: str, value: Any) -> list[Sample]:
    return sorted(value, key=lambda s: s.Labels.get(label, ""))


def _strip_port(host: str) -> str:
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host


def _strip_domain(host: str) -> str:
    if host.startswith("["):  # an IPv6 address keeps its port and is not a domain name
        return host
    port = ""
    if host.count(":") == 1:
        host, port = host.split(":", 1)
        port = ":" + port
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", host):
        return host + port
    return host.split(".", 1)[0] + port


def _go_title(s: str) -> str:
    return re.sub(r"(^|[^\w'])(\w)", lambda m: m.group(1) + m.group(2).upper(), s)


def _cmp(name: str, a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool) or (isinstance(a, str) != isinstance(b, str)):
        raise TemplateError("incompatible types for comparison")
    if name == "eq":
        return bool(a == b)
    if name == "ne":
        return bool(a != b)
    if isinstance(a, bool):
        raise TemplateError("invalid type for comparison")
    return bool({"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[name])


def _call(name: str, args: list[Any], env: _Env) -> Any:
    def need(n: int) -> None:
        if len(args) != n:
            raise TemplateError(f"wrong number of args for {name}: want {n} got {len(args)}")

    if name == "and":
        for a in args:
            if not truth(a):
                return a
        return args[-1] if args else None
    if name == "or":
        for a in args:
            if truth(a):
                return a
        return args[-1] if args else None
    if name == "not":
        need(1)
        return not truth(args[0])
    if name == "eq":
        if len(args) < 2:
            raise TemplateError("missing argument for comparison")
        return any(_cmp("eq", args[0], b) for b in args[1:])
    if name in ("ne", "lt", "le", "gt", "ge"):
        need(2)
        return _cmp(name, args[0], args[1])
    if name == "len":
        need(1)
        if isinstance(args[0], str | list | tuple | Mapping):
            return len(args[0])
        raise TemplateError(f"len of type {go_type(args[0])}")
    if name == "index":
        value = args[0]
        for key in args[1:]:
            if isinstance(value, Mapping):
                value = value.get(key, "")
            elif isinstance(value, list | tuple | str) and isinstance(key, int):
                if not 0 <= key < len(value):
                    raise TemplateError(f"index out of range: {key}")
                value = value[key]
            else:
                raise TemplateError(f"can't index item of type {go_type(value)}")
        return value
    if name == "slice":
        value, bounds = args[0], [int(a) for a in args[1:]]
        return value[slice(*bounds)] if bounds else value
    if name == "print":
        return _go_sprint(args)
    if name == "println":
        return " ".join(go_print_value(a) for a in args) + "\n"
    if name == "printf":
        if not args or not isinstance(args[0], str):
            raise TemplateError("printf needs a format string")
        return go_sprintf(args[0], args[1:])
    if name in ("html", "safeHtml"):
        text = _go_sprint(args)
        return text if name == "safeHtml" else html_lib.escape(text).replace("&#x27;", "&#39;")
    if name == "js":
        text = _go_sprint(args)
        return re.sub(
            r"[\\'\"<>&=]",
            lambda m: f"\\u{ord(m.group(0)):04X}" if m.group(0) in "<>&=" else "\\" + m.group(0),
            text,
        )
    if name == "urlquery":
        return urllib.parse.quote_plus(_go_sprint(args))
    if name == "call":
        raise TemplateError("call of nil")
    if name == "query":
        need(1)
        if env.query is None:
            raise TemplateError("query is not available here")
        return env.query(str(args[0]))
    if name == "first":
        need(1)
        return _first(args[0])
    if name == "label":
        need(2)
        sample = args[1]
        return sample.Labels.get(args[0], "") if isinstance(sample, Sample) else ""
    if name == "value":
        need(1)
        return args[0].Value if isinstance(args[0], Sample) else 0.0
    if name == "strvalue":
        need(1)
        return args[0].Labels.get("__value__", "") if isinstance(args[0], Sample) else ""
    if name == "args":
        return {f"arg{i}": a for i, a in enumerate(args)}
    if name == "reReplaceAll":
        need(3)
        return _re_replace_all(str(args[0]), str(args[1]), str(args[2]))
    if name == "match":
        need(2)
        try:
            return re2.search(str(args[0]), str(args[1])) is not None
        except re2.error as exc:
            raise TemplateError(f"error parsing regexp: {exc}") from None
    if name == "title":
        need(1)
        return _go_title(str(args[0]))
    if name == "toUpper":
        need(1)
        return str(args[0]).upper()
    if name == "toLower":
        need(1)
        return str(args[0]).lower()
    if name == "graphLink":
        need(1)
        return _expr_link(env, str(args[0]), 0)
    if name == "tableLink":
        need(1)
        return _expr_link(env, str(args[0]), 1)
    if name == "sortByLabel":
        need(2)
        return _sort_by_label(str(args[0]), args[1])
    if name in ("humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
                "humanizeTimestamp", "toTime"):  # fmt: skip
        need(1)
        v = _to_float(args[0])
        if name == "humanize":
            return humanize(v)
        if name == "humanize1024":
            return humanize1024(v)
        if name == "humanizeDuration":
            return humanize_duration(v)
        if name == "humanizePercentage":
            return _go_g4(v * 100) + "%"
        if name == "humanizeTimestamp":
            return humanize_timestamp(v)
        return GoTime(int(v * 1000))
    if name == "pathPrefix":
        return urllib.parse.urlparse(env.external_url).path
    if name == "externalURL":
        return env.external_url
    if name == "parseDuration":
        need(1)
        try:
            return _parse_duration(str(args[0]))
        except Exception as exc:
            raise TemplateError(str(exc)) from None
    if name == "stripPort":
        need(1)
        return _strip_port(str(args[0]))
    if name == "stripDomain":
        need(1)
        return _strip_domain(str(args[0]))
    raise TemplateError(f'function "{name}" not defined')


@dataclass(frozen=True)
class GoTime:
    """What ``toTime`` returns: a time that prints as Go's ``time.Time``."""

    ms: int

    def __str__(self) -> str:
        return go_time_string(self.ms)


def _go_sprint(args: Sequence[Any]) -> str:
    """``fmt.Sprint``: a space between operands when neither side is a string."""
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_print_value(a)
    return out


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    try:
        rx = re2.compile(pattern)
    except re2.error as exc:
        raise TemplateError(f"error parsing regexp: {exc}") from None
    # Go's $1 / ${name} expansion -> Python's \g<1>
    py_repl = re.sub(
        r"\$(\d+|\{\w+\})",
        lambda m: "\\g<" + m.group(1).strip("{}") + ">",
        repl.replace("\\", "\\\\"),
    )
    return str(rx.sub(py_repl, text))


def _expr_link(env: _Env, expr: str, tab: int) -> str:
    q = urllib.parse.quote(expr, safe="")
    return f"/graph?g0.expr={q}&g0.tab={tab}"
