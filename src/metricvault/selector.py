"""PromQL series selectors: ``metric{a="x", b=~"re.*", c!="y", d!~"z"}``.

Semantics follow Prometheus: regular expressions are fully anchored, and a matcher against the
empty string also matches series that lack the label (``team=""`` selects unlabelled series).
Several selectors joined by PromQL's ``or`` select the union of their series
(``{job="llama-70b-r3"} or DCGM_FI_DEV_GPU_UTIL{Hostname=~"node0[12]"}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from metricvault.errors import SelectorError
from metricvault.model import LABEL_NAME_PATTERN, METRIC_NAME_PATTERN

_METRIC_RE = re.compile(METRIC_NAME_PATTERN)  # the name rules: metricvault.model
_MATCHER_RE = re.compile(
    rf"""\s*({LABEL_NAME_PATTERN})\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*"""
)
_OR_RE = re.compile(r"\s+or\s+")
OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_regex", re.compile(f"(?:{self.value})\\Z", re.DOTALL))
            except re.error as exc:
                raise SelectorError(
                    f"invalid regular expression {self.value!r} for label {self.name!r}: {exc}"
                ) from exc

    def matches(self, value: str | None) -> bool:
        text = value or ""
        if self.op == "=":
            return text == self.value
        if self.op == "!=":
            return text != self.value
        hit = self._regex.match(text) is not None  # type: ignore[attr-defined]
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value)}"


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


def parse_selectors(text: str) -> SelectorUnion:
    """Parse one selector or several joined by `` or `` (outside quotes and braces)."""
    return SelectorUnion(tuple(parse_selector(part) for part in split_or(text)))


def split_or(text: str) -> list[str]:
    parts: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "{}":
            depth += 1 if ch == "{" else -1
        elif depth == 0 and ch.isspace() and (gap := _OR_RE.match(text, i)):
            parts.append(text[start:i])
            i = start = gap.end()
            continue
        i += 1
    parts.append(text[start:])
    return parts


def parse_selector(text: str) -> Selector:
    """Parse a PromQL series selector; raise :class:`SelectorError` naming the bad position."""
    src = text.strip()
    if not src:
        raise SelectorError('empty selector: give a metric name and/or {label="value"} matchers')
    matchers: list[Matcher] = []
    pos = 0
    name_match = _METRIC_RE.match(src)
    if name_match:
        matchers.append(Matcher("__name__", "=", name_match.group()))
        pos = name_match.end()
    rest = src[pos:].strip()
    if rest:
        if not (rest.startswith("{") and rest.endswith("}")):
            raise SelectorError(
                f"cannot parse selector {text!r} at {rest[:20]!r}: expected "
                'metric{label="value", ...}'
            )
        matchers.extend(_parse_matchers(rest[1:-1], text))
    if not any(m.op in ("=", "=~") and not m.matches("") for m in matchers):
        raise SelectorError(
            f"selector {text!r} matches every series: give a metric name or at least one "
            'matcher that does not match the empty string (e.g. job="x")'
        )
    return Selector(tuple(matchers))


def _parse_matchers(body: str, text: str) -> list[Matcher]:
    out: list[Matcher] = []
    body = body.strip()
    pos = 0
    while pos < len(body):
        m = _MATCHER_RE.match(body, pos)
        if not m:
            raise SelectorError(
                f"cannot parse selector {text!r} near {body[pos : pos + 20]!r}: matchers look like "
                'name="value", name!="value", name=~"regex" or name!~"regex"'
            )
        name, op, quoted = m.groups()
        out.append(Matcher(name, op, _unquote(quoted)))
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise SelectorError(f"cannot parse selector {text!r}: expected ',' at {pos}")
            pos += 1
            while pos < len(body) and body[pos].isspace():
                pos += 1
    return out


def _unquote(quoted: str) -> str:
    if quoted[0] == "'":
        quoted = '"' + quoted[1:-1].replace('\\"', '"').replace('"', '\\"') + '"'
    try:
        value = json.loads(quoted)
    except json.JSONDecodeError as exc:
        raise SelectorError(f"bad escape in label value {quoted}") from exc
    return str(value)
