"""The line protocol tokenizer: one line into (measurement, tags, field keys, field values,
timestamp), unescaped. A fast path splits common lines with ``str.split``; anything unusual goes
to the character scanner, which knows every rule and words the errors."""

from __future__ import annotations

import re
from math import isfinite

from metricvault.ingest.protocols.influx_values import (
    FLOAT_CHARS,
    FLOAT_ENDS,
    HOW,
    _LineProblem,
    field_value,
    other_number,
    q,
)

_MEASUREMENT_ESCAPES = ", \\"
_KEY_ESCAPES = ",= \\"
_STRING_ESCAPES = '"\\'

# A tag as str.partition returns it: (key, "=", value).
Tag = tuple[str, str, str]
# (measurement, tags, field keys, field values with None for a string, timestamp or None)
Parsed = tuple[str, list[Tag], list[str], list[float | None], str | None]

# --- fast path: str.split on lines without quotes, with a careful rejoin for escapes ---------


def parse_fast(line: str) -> Parsed | None:
    """Parse a common line with C-level splits; None hands the line to the slow scanner.

    Escapes are first swapped for private-use placeholder characters, so the splits cannot cut
    at an escaped separator; tokens holding one (never pure ASCII) get the characters back.
    """
    if '"' in line:
        return None
    escaped = "\\" in line
    if escaped:
        if not line.isascii() and _PLACEHOLDER_IN(line):
            return None
        for escape, placeholder in _PLACEHOLDERS:
            if escape in line:
                line = line.replace(escape, placeholder)
    parts = line.split(" ")
    if len(parts) == 2:
        key, field_set = parts
        ts = None
    elif len(parts) == 3:
        key, field_set, ts = parts
        if not ts or not ts.isascii():
            return None
    else:
        return None
    head = key.split(",")
    measurement = head[0]
    if not measurement:
        return None
    if escaped and not measurement.isascii():
        measurement = _restore(measurement.replace(_EQUALS, "\\="))
    pairs = []
    for item in head[1:]:
        tag, _, value = pair = item.partition("=")
        if not tag or not value or "=" in value:
            return None
        if escaped and not item.isascii():
            pair = (_restore(tag), "=", _restore(value))
        pairs.append(pair)
    keys = []
    values: list[float | None] = []
    for item in field_set.split(","):
        field, _, text = item.partition("=")
        if not field or not text:
            return None
        if text[-1] in FLOAT_ENDS:
            try:
                number = float(text)
            except ValueError:
                return None
            if text.strip(FLOAT_CHARS) or text[0] == "+" or not isfinite(number):
                return None
        else:
            other = other_number(text)
            if other is None:
                return None
            number = other
        if escaped and not field.isascii():
            field = _restore(field)
        keys.append(field)
        values.append(number)
    return measurement, pairs, keys, values, ts


# Private-use characters stand in for the escapes during the fast path's splits. An escaped
# backslash goes first: in a double backslash followed by a comma, the comma is a separator.
_BACKSLASH, _SPACE, _COMMA, _EQUALS = "\ue000", "\ue001", "\ue002", "\ue003"
_PLACEHOLDERS = (("\\\\", _BACKSLASH), ("\\ ", _SPACE), ("\\,", _COMMA), ("\\=", _EQUALS))
_PLACEHOLDER_IN = re.compile("[\ue000-\ue003]").search


def _restore(token: str) -> str:
    """Undo the placeholders in a tag key, tag value or field key (all escape '=')."""
    return (
        token.replace(_SPACE, " ")
        .replace(_COMMA, ",")
        .replace(_EQUALS, "=")
        .replace(_BACKSLASH, "\\")
    )


# --- slow path: a character scanner that knows every rule and says what is wrong -------------


def parse_slow(line: str) -> Parsed:
    measurement, i = _token(line, 0, ", ", _MEASUREMENT_ESCAPES)
    if not measurement:
        raise _LineProblem(f"the line does not start with a measurement name; {HOW}")
    n = len(line)
    pairs: list[Tag] = []
    while i < n and line[i] == ",":
        tag, value, i = _tag(line, i + 1)
        pairs.append((tag, "=", value))
    i = _skip_spaces(line, i)
    if i >= n:
        raise _LineProblem(
            f"measurement {q(measurement)} has no fields; every point needs at least one "
            f"field=value after a space. {HOW}"
        )
    keys, values, i = _field_set(line, i)
    if i >= n:
        return measurement, pairs, keys, values, None
    if line[i] != " ":
        raise _LineProblem(
            f"unexpected {line[i]!r} at character {i + 1} after a field value; separate "
            "fields with ',' and the timestamp with a space"
        )
    ts = line[_skip_spaces(line, i) :]
    if " " in ts:
        raise _LineProblem(
            f"unexpected text after the timestamp: {q(ts)}; a line ends with the timestamp "
            "(escape spaces in names and tag values as '\\ ')"
        )
    return measurement, pairs, keys, values, ts


def _skip_spaces(line: str, i: int) -> int:
    while i < len(line) and line[i] == " ":
        i += 1
    return i


def _token(line: str, i: int, stops: str, escapable: str) -> tuple[str, int]:
    """Read up to an unescaped stop character; return the unescaped text and the stop index."""
    out = []
    n = len(line)
    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] in escapable:
            out.append(line[i + 1])
            i += 2
            continue
        if c in stops:
            break
        out.append(c)
        i += 1
    return "".join(out), i


def _tag(line: str, i: int) -> tuple[str, str, int]:
    tag, i = _token(line, i, ",= ", _KEY_ESCAPES)
    if i >= len(line) or line[i] != "=":
        if not tag:
            raise _LineProblem(f"empty tag at character {i + 1} (a stray ','?); {HOW}")
        raise _LineProblem(f"tag {q(tag)} has no '=value'; tags are key=value. {HOW}")
    if not tag:
        raise _LineProblem(f"a tag has an empty key before '=' at character {i + 1}; {HOW}")
    value, i = _token(line, i + 1, ",= ", _KEY_ESCAPES)
    if i < len(line) and line[i] == "=":
        raise _LineProblem(
            f"tag {q(tag)} has an unescaped '=' in its value at character {i + 1}; "
            "write it as '\\='"
        )
    if not value:
        raise _LineProblem(
            f"tag {q(tag)} has an empty value; InfluxDB does not allow empty tag values — "
            "leave the tag out instead"
        )
    return tag, value, i


def _field_set(line: str, i: int) -> tuple[list[str], list[float | None], int]:
    keys: list[str] = []
    values: list[float | None] = []
    n = len(line)
    while True:
        field, i = _token(line, i, ",= ", _KEY_ESCAPES)
        if i >= n or line[i] != "=":
            if not field:
                raise _LineProblem(f"empty field at character {i + 1} (a stray ','?); {HOW}")
            raise _LineProblem(f"field {q(field)} has no '=value'; fields are key=value. {HOW}")
        if not field:
            raise _LineProblem(f"a field has an empty key before '=' at character {i + 1}")
        i += 1
        if i < n and line[i] == '"':
            i = _string_end(line, i, field)
            keys.append(field)
            values.append(None)
        else:
            end = i
            while end < n and line[end] not in ", ":
                end += 1
            keys.append(field)
            values.append(field_value(field, line[i:end]))
            i = end
        if i < n and line[i] == ",":
            i += 1
            continue
        return keys, values, i


def _string_end(line: str, i: int, field: str) -> int:
    """Index after the closing quote of the string value opening at ``line[i]``."""
    n = len(line)
    i += 1
    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] in _STRING_ESCAPES:
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    raise _LineProblem(
        f"the string value of field {q(field)} has no closing '\"'; close it, and write "
        "quotes inside it as '\\\"' (strings cannot span lines)"
    )
