"""PromQL series selectors: ``metric{a="x", b=~"re.*", c!="y", d!~"z"}``.

One grammar: selectors are parsed by promql-parser, the parser the PromQL engine uses, so a
selector that works in ``/api/v1/query`` works in ``match[]``, ``vault.query()``, experiments
and retention overrides alike (backtick strings, every PromQL escape, ``{__name__="x"}``).
Several selectors joined by PromQL's ``or`` select the union of their series
(``{job="llama-70b-r3"} or DCGM_FI_DEV_GPU_UTIL{Hostname=~"node0[12]"}``).

Semantics follow Prometheus: regular expressions are RE2 (linear in the length of the value, so
no regex can stall a worker, and RE2's syntax is what PromQL users write), fully anchored as
``^(?s:re)$``, and a matcher against the empty string also matches series that lack the label
(``team=""`` selects unlabelled series).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from metricvault.errors import SelectorError
from metricvault.model import LABEL_NAME_PATTERN

OPS = ("=", "!=", "=~", "!~")
_PARSER_OPS = {
    "MatchOp.Equal": "=",
    "MatchOp.NotEqual": "!=",
    "MatchOp.Re": "=~",
    "MatchOp.NotRe": "!~",
}
_BARE_LABEL_NAME = re.compile(LABEL_NAME_PATTERN).fullmatch
MAX_UNION = 256  # selectors joined by "or" in one text
_BRACES = re.compile(r"\{[^{}]*\}")
_WORDS = re.compile(r"\b(?:and|or|unless|atan2)\b", re.IGNORECASE)

# ----------------------------------------------------------------------------- RE2 regexes
# RE2's error codes (re2.h) in the words of Go's regexp/syntax, which Prometheus's errors quote.
_GO_WORDS = {
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
}
# Regexes that are plain alternatives of literal text (``a|b|c``, the most common kind) are a
# set lookup; RE2 through its Python binding costs microseconds a call.
_LITERAL_ALTERNATIVES = re.compile(r"[\w:/ -]*(?:\|[\w:/ -]*)*").fullmatch
# Results per label value of one matcher: label values repeat across series (hosts, GPUs).
_MEMO_SIZE = 4096


def re2_compile(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (the ``re2`` module's pattern object: ``match``, ``search``,
    ``fullmatch``, groups); a :class:`SelectorError` worded as Go (and so Prometheus) words
    what RE2 refuses: ``error parsing regexp: invalid or unsupported Perl syntax: `(?=```."""
    import re2  # here: the edge agent imports this module but never matches a regex

    options = re2.Options()
    options.log_errors = False  # the refusal is raised, not printed to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise SelectorError(_go_words(exc)) from None


def _go_words(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if text.startswith("pattern too large"):
        return "error parsing regexp: expression too large"
    code, _, arg = text.partition(": ")
    return f"error parsing regexp: {_GO_WORDS.get(code, code)}: `{arg}`"


def compile_matcher_regex(regex: str) -> Callable[[str], bool]:
    """A test of whether a whole label value matches ``regex`` as Prometheus's label matchers
    match: RE2 over ``^(?s:regex)$`` (``.`` matches a newline too)."""
    compiled = re2_compile(f"^(?s:{regex})$")
    if regex == ".*":
        return lambda text: True
    if regex == ".+":
        return lambda text: text != ""
    if _LITERAL_ALTERNATIVES(regex):
        return frozenset(regex.split("|")).__contains__
    fullmatch = compiled.fullmatch
    memo: dict[str, bool] = {}

    def test(text: str) -> bool:
        hit = memo.get(text)
        if hit is None:
            hit = fullmatch(text) is not None
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[text] = hit
        return hit

    return test


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise SelectorError(
                f"unknown matcher operator {self.op!r} for label {self.name!r}: use =, !=, =~ or !~"
            )
        test = None
        if self.op in ("=~", "!~"):
            try:
                test = compile_matcher_regex(self.value)
            except SelectorError as exc:
                raise SelectorError(
                    f"invalid regular expression {self.value!r} for label {self.name!r}: {exc}"
                ) from None
        object.__setattr__(self, "_test", test)

    def __reduce__(self) -> tuple[type[Matcher], tuple[str, str, str]]:
        return (Matcher, (self.name, self.op, self.value))  # the compiled regex is rebuilt

    def matches(self, value: str | None) -> bool:
        text = value or ""
        if self.op == "=":
            return text == self.value
        if self.op == "!=":
            return text != self.value
        hit: bool = self._test(text)  # type: ignore[attr-defined]
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        name = self.name if _BARE_LABEL_NAME(self.name) else promql_quote(self.name)
        return f"{name}{self.op}{promql_quote(self.value)}"


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    @property
    def metric(self) -> str | None:
        """The metric name when the selector pins one with ``=``."""
        for m in self.matchers:
            if m.name == "__name__" and m.op == "=":
                return m.value
        return None

    def matches(self, metric: str, labels: Mapping[str, str]) -> bool:
        for m in self.matchers:
            value = metric if m.name == "__name__" else labels.get(m.name)
            if not m.matches(value):
                return False
        return True

    def __str__(self) -> str:
        return "{" + ", ".join(str(m) for m in self.matchers) + "}"


@dataclass(frozen=True)
class SelectorUnion:
    """Selectors joined by ``or``: a series belongs if any of them matches it."""

    parts: tuple[Selector, ...]

    def matches(self, metric: str, labels: Mapping[str, str]) -> bool:
        return any(p.matches(metric, labels) for p in self.parts)

    def __str__(self) -> str:
        return " or ".join(str(p) for p in self.parts)


def promql_quote(value: str) -> str:
    """``value`` as a double-quoted PromQL string that parses back to exactly ``value``."""
    if value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return '"' + "".join(_ESCAPES.get(ch) or _escape(ch) for ch in value) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


# ----------------------------------------------------------------------------- parsing
def parse_selectors(text: str) -> SelectorUnion:
    """Parse one selector or several joined by ``or``; raise :class:`SelectorError` naming the
    bad position."""
    import promql_parser as pp  # here: the edge agent imports this module but never parses

    _check_size(text)
    try:
        node = pp.parse(rewrite_strings(text))
    except ValueError as exc:
        raise _refusal(text, str(exc)) from None
    parts = tuple(_selector(leaf, text) for leaf in _or_operands(node, text))
    return SelectorUnion(parts)


def _check_size(text: str) -> None:
    # promql-parser (Rust) recurses per operator and kills the process (a stack overflow) near
    # a few thousand; a selector union needs no nesting, and no one joins hundreds.
    bare = _BRACES.sub("", _STRINGS.sub('""', text))
    operators = sum(bare.count(c) for c in "([+-*/%^<>=!") + len(_WORDS.findall(bare))
    if operators >= MAX_UNION:
        raise SelectorError(
            f"selector {_shown(text)} joins or nests {operators} operators; at most "
            f"{MAX_UNION} selectors may be joined by 'or' (split it into several queries)"
        )


def parse_selector(text: str) -> Selector:
    """Parse one PromQL series selector; raise :class:`SelectorError` naming the bad position."""
    union = parse_selectors(text)
    if len(union.parts) != 1:
        raise SelectorError(
            f"cannot parse selector {_shown(text)}: one series selector is expected here, "
            f"not {len(union.parts)} joined by 'or' (give each on its own)"
        )
    return union.parts[0]


def _or_operands(node: Any, text: str) -> list[Any]:
    import promql_parser as pp

    union = isinstance(node, pp.BinaryExpr) and str(node.op) == "or"
    if union and (node.modifier is None or node.modifier.matching is None):  # no on()/ignoring()
        return [*_or_operands(node.lhs, text), *_or_operands(node.rhs, text)]
    plain = isinstance(node, pp.VectorSelector) and node.offset is None and node.at is None
    if plain and node.matchers.or_matchers:  # the engine has no such form: refused, not ignored
        raise SelectorError(
            f"cannot parse selector {_shown(text)}: 'or' between matchers inside braces is not "
            'supported; join whole selectors instead: up{a="x"} or up{b="y"}'
        )
    if plain:
        return [node]
    raise SelectorError(
        f"cannot parse selector {_shown(text)}: a series selector was expected "
        f"(metric{{label=\"value\", ...}}, several joined by 'or'), not the PromQL "
        f"expression {str(node)!r}"
    )


def _selector(node: Any, text: str) -> Selector:
    matchers = [Matcher("__name__", "=", node.name)] if node.name is not None else []
    for m in node.matchers.matchers:
        op = _PARSER_OPS[str(m.op)]
        try:
            matchers.append(Matcher(m.name, op, m.value))
        except SelectorError as exc:  # a regex the parser's (Rust) engine took but RE2 refuses
            words = str(exc)
            words = (
                words[words.find("error parsing regexp") :] if "error parsing" in words else words
            )
            at = _regex_position(text, m.value)
            raise SelectorError(f"cannot parse selector {_shown(text)}{at}: {words}") from None
    if all(m.matches("") for m in matchers):
        raise _matches_everything(text)
    return Selector(tuple(matchers))


# ---------------------------------------------------------------------- strings and refusals
# (start, original text, text handed to the parser)
_Token = tuple[int, str, str]
_STRING = (
    r""""(?:[^"\\\n]|\\[^\n])*"?"""  # a double-quoted string (unterminated: to the line's end)
    r"""|'(?:[^'\\\n]|\\[^\n])*'?"""
    r"""|`[^`]*`?"""  # a raw string: no escapes, newlines allowed
    r"""|\#[^\n]*"""  # a comment
)
_STRINGS = re.compile(_STRING)
_TOKEN = re.compile(_STRING + r"""|[\w:.]+|\s+|[=!]~|[!=<>]=|.""", re.DOTALL)
# Escapes JSON has and Go's strconv lacks (the old hand-written parser read JSON strings, and
# earlier selectors were written by json.dumps): "\/" and UTF-16 surrogate pairs.
_JSON_ESCAPE = re.compile(r"\\(u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|.)", re.S)


def rewrite_strings(expr: str) -> str:
    """``expr`` with its strings spelled as promql-parser reads them as Prometheus does: a raw
    (backtick) string has no escapes (promql-parser refuses `\\d` in one), and JSON's ``\\/``
    and surrogate pairs (which the old selector parser read) as PromQL spells them."""
    if "`" not in expr and "\\/" not in expr and "\\u" not in expr and '\\"' not in expr:
        return expr  # the common case (C-speed checks): nothing to respell
    return _STRINGS.sub(lambda m: _respell(m.group()), expr)  # C-speed between the strings


def _split(text: str) -> list[_Token]:
    return [(m.start(), m.group(), _respell(m.group())) for m in _TOKEN.finditer(text)]


def _respell(token: str) -> str:
    if token[0] == "`":
        return promql_quote(token[1:-1]) if len(token) > 1 and token[-1] == "`" else token
    quote = token[0]
    if quote not in "\"'" or ("\\/" not in token and "\\u" not in token and '\\"' not in token):
        return token

    def one(m: re.Match[str]) -> str:
        escaped = m.group(1)
        if len(escaped) > 1:  # a surrogate pair: the one code point it encodes
            high, low = int(escaped[1:5], 16), int(escaped[7:11], 16)
            return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"
        if escaped == "/" or (escaped == '"' and quote == "'"):
            return escaped
        return m.group()

    return _JSON_ESCAPE.sub(one, token)


_ENDS = ("", "}", '"x"}', '="x"}', " x", ")")  # what may complete a valid prefix
_LOCATE_TOKENS = 256  # more tokens: the refusal names no position (each try is a parse)


def _refusal(text: str, reason: str) -> SelectorError:
    if "no expression found" in reason:
        return SelectorError(
            f'empty selector {_shown(text)}: give a metric name and/or {{label="value"}} matchers'
        )
    if "at least one non-empty matcher" in reason:
        return _matches_everything(text)
    reason = explain_parse_error(reason)
    pos = _position(text)
    if pos is None:
        at = ""
    elif pos == len(text):
        at = f" at char {pos} (the end)"
    else:
        at = f" at char {pos} (near {text[pos : pos + 20]!r})"
        if _parses(rewrite_strings(f"{text[:pos]},{text[pos:]}")):
            reason = f"expected ',' between matchers ({reason})"
    return SelectorError(
        f"cannot parse selector {_shown(text)}{at}: {reason}; a selector looks like "
        'metric{label="value", label=~"regex"}, several joined by \'or\''
    )


def explain_parse_error(reason: str) -> str:
    """promql-parser's refusal ``reason``, with Prometheus's words for a regex its (Rust) regex
    engine refused: ``illegal regex for (: error parsing regexp: missing closing ): ...``."""
    if not reason.startswith("illegal regex for "):
        return reason
    regex = reason.removeprefix("illegal regex for ")
    try:
        re2_compile(f"^(?s:{regex})$")
    except SelectorError as exc:
        return f"{reason}: {exc}"
    return f"{reason}: RE2 takes it, but the PromQL parser does not"


def _matches_everything(text: str) -> SelectorError:
    return SelectorError(
        f"selector {_shown(text)} matches every series (vector selector must contain at least "
        "one non-empty matcher): give a metric name or at least one matcher that does not "
        'match the empty string (e.g. job="x")'
    )


def _position(text: str) -> int | None:
    """Where the first token lies after which no ending parses (promql-parser's errors name no
    position); None for a selector too long to search."""
    if len(text) > 8 * _LOCATE_TOKENS:
        return None
    tokens = _split(text)
    if len(tokens) > _LOCATE_TOKENS:
        return None
    prefix = ""
    for start, original, spelled in tokens:
        prefix += spelled
        if original.isspace() or original.startswith("#"):
            continue
        if not any(_parses(prefix + end) for end in _ENDS):
            return start
    return len(text)


def _parses(candidate: str) -> bool:
    """Whether the parser takes ``candidate`` as syntax (matching every series is no syntax)."""
    import promql_parser as pp

    try:
        pp.parse(candidate)
    except ValueError as exc:
        return "at least one non-empty matcher" in str(exc)
    return True


def _regex_position(text: str, regex: str) -> str:
    """`` at char N``: where the string that spells ``regex`` after ``=~``/``!~`` starts."""
    import promql_parser as pp

    spelled = [t for t in _split(text) if not t[1].isspace()]
    for before, (start, original, respelled) in itertools.pairwise(spelled):
        if before[1] not in ("=~", "!~") or original[0] not in "\"'`":
            continue
        with contextlib.suppress(ValueError):
            literal = pp.parse(respelled)
            if isinstance(literal, pp.StringLiteral) and literal.val == regex:
                return f" at char {start}"
    return ""


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 200 else repr(text[:200] + "…")
