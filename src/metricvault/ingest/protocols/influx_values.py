"""Line protocol field values: floats, integers (``12i``), unsigned (``12u``), booleans and
strings, each checked against its type's rules; and how a line's problem is raised and shown."""

from __future__ import annotations

from math import isfinite

from metricvault.errors import InputError, ValueRangeError

_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1
MAX_DIGITS = 20  # more digits than any int64/uint64 (after leading zeros) can have

_BOOLEANS = {
    "t": 1.0,
    "T": 1.0,
    "true": 1.0,
    "True": 1.0,
    "TRUE": 1.0,
    "f": 0.0,
    "F": 0.0,
    "false": 0.0,
    "False": 0.0,
    "FALSE": 0.0,
}
_NON_FINITE = frozenset({"nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})
# A float token may hold only these characters; Python's float() also takes "1_0", " 1", "nan".
FLOAT_CHARS = "0123456789.eE+-"
DIGITS = "0123456789"
FLOAT_ENDS = frozenset("0123456789.")

HOW = (
    "line protocol is 'measurement[,tag=value...] field=value[,field=value...] [timestamp]'; "
    "escape ',', '=' and ' ' in names and tag values with a backslash"
)


class _LineProblem(Exception):
    """Why one line is invalid; turned into ``kind(message)`` naming the line."""

    def __init__(self, reason: str, kind: type[InputError] = InputError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def q(text: str | None) -> str:
    """A user-given name or value, quoted and clipped for an error message."""
    return repr(text if text is None else clip(text))


def other_number(text: str) -> float | None:
    """An integer, unsigned or boolean field value; None if ``text`` is none of them."""
    last = text[-1]
    if len(text) > MAX_DIGITS + 2:
        return None  # the slow path says why; int() refuses more than 4300 digits anyway
    if last == "i":
        digits = text[1:-1] if text[0] == "-" else text[:-1]
        if digits.isdigit() and digits.isascii():
            number = int(text[:-1])
            if _INT64[0] <= number <= _INT64[1]:
                return float(number)
        return None
    if last == "u":
        digits = text[:-1]
        if digits.isdigit() and digits.isascii():
            number = int(digits)
            if number <= _UINT64_MAX:
                return float(number)
        return None
    return _BOOLEANS.get(text)


def field_value(field: str, text: str) -> float:
    if not text:
        raise _LineProblem(f"field {q(field)} has no value after '='; {HOW}")
    if text.lower() in _NON_FINITE:
        raise _LineProblem(
            f"field {q(field)} is {clip(text)}: NaN and Inf are not valid line protocol values "
            "(InfluxDB refuses them too): drop the field or send a number",
            ValueRangeError,
        )
    try:
        number = float(text)
    except ValueError:
        return _typed_value(field, text)
    if text.strip(FLOAT_CHARS) or text[0] == "+":
        raise _LineProblem(_bad_value(field, text))
    if not isfinite(number):
        raise _LineProblem(
            f"field {q(field)} = {clip(text)} is outside the float64 range; send a smaller number",
            ValueRangeError,
        )
    return number


def _typed_value(field: str, text: str) -> float:
    number = other_number(text)
    if number is not None:
        return number
    last = text[-1]
    body = text[1:-1] if last == "i" and text[0] == "-" else text[:-1]
    if last in "iu" and body.isdigit() and body.isascii():
        kind = "int64" if last == "i" else "uint64"
        raise _LineProblem(
            f"field {q(field)} = {clip(text)} is outside the {kind} range; send it as a float",
            ValueRangeError,
        )
    if last == "i":
        raise _LineProblem(
            f"field {q(field)} = {q(text)} is not an integer: integers are digits with an "
            "optional '-' and a trailing 'i', e.g. 12i or -3i"
        )
    if last == "u":
        raise _LineProblem(
            f"field {q(field)} = {q(text)} is not an unsigned integer: digits and a trailing "
            "'u', e.g. 12u"
        )
    raise _LineProblem(_bad_value(field, text))


def _bad_value(field: str, text: str) -> str:
    return (
        f"field {q(field)} has the invalid value {q(text)}: floats look like 1.5, -0.5 or 1e3, "
        "integers 12i, unsigned 12u, booleans t/f/true/false, and strings need double quotes"
    )
