"""InfluxDB line protocol (1.x ``/write`` and 2.x ``/api/v2/write``) to the long Arrow shape.

A pure decoder: bytes in, an Arrow table out, no I/O and no store access.

Syntax (InfluxDB's line protocol reference)::

    measurement[,tag=value...] field=value[,field=value...] [timestamp]

- One point per line; ``\\n`` separates lines, a trailing ``\\r`` is ignored, blank lines and
  lines whose first non-blank character is ``#`` are skipped; leading/trailing blanks are ignored
  and runs of spaces separate the three sections.
- Escaping: in the measurement ``\\,`` and ``\\ ``; in tag keys, tag values and field keys
  ``\\,``, ``\\=`` and ``\\ ``; ``\\\\`` is one backslash everywhere. A backslash before any other
  character is kept as it is (InfluxDB 2.x documents it so; 1.x never collapsed ``\\\\``).
- Field values: floats (``1.5``, ``-0.5``, ``1e3``), integers (``12i``, int64), unsigned
  (``12u``, uint64), booleans (``t T true True TRUE`` = 1.0, ``f F false False FALSE`` = 0.0),
  strings (``"..."`` with ``\\"`` and ``\\\\``). Numbers are stored as float64, so integers above
  2**53 lose precision.
- The timestamp is an integer in ``precision`` units (``ns``/``n`` default, ``us``/``u``, ``ms``,
  ``s``, ``m``, ``h``), floored to epoch milliseconds; a point without one gets ``now_ms``.

Mapping to the Prometheus data model (what VictoriaMetrics does with ``-usePromCompatibleNaming``):

- metric name = ``<measurement>_<field key>`` with every character outside ``[a-zA-Z0-9_:]``
  replaced by ``_``, and ``_`` put in front if it then starts with a digit
  (``disk.io,... read-bytes=1`` becomes ``disk_io_read_bytes``);
- tags become labels; a tag key gets every character outside ``[a-zA-Z0-9_]`` replaced by ``_``
  and a leading ``_`` before a digit (``gpu-id`` becomes ``gpu_id``, ``0x`` becomes ``_0x``);
  tag values are kept exactly (non-empty, as InfluxDB requires; at most 4096 bytes and 64 tags,
  the store's limits).
- A tag key whose label name starts with ``__`` (reserved by Prometheus) or is a column of the
  long shape (``metric``, ``timestamp``, ``value``, ``series_id``, ``ts``, ``kind``) is an error,
  as are two tag keys (or two field keys) of one line that map to one name.

Errors. A request is atomic: any syntax error, bad value (NaN, Inf, out-of-range numbers or
timestamps, including ones outside the store's years 1990-2200, with a hint when another precision
fits), bad name, invalid UTF-8 or NUL character raises :class:`~metricvault.errors.InputError`
(400; ``LabelError`` / ``ValueRangeError`` where they fit) naming the line, showing it and saying
how to fix it; nothing is returned. A body without points gives an empty table.

String fields are the one per-line outcome: metricvault keeps numbers only, so a line with a
string field is left out as a whole and listed in ``DecodedLines.rejected``; the other lines are
kept. If every line is rejected that way, the request fails with InputError.

Limits: bodies past ``max_decoded_bytes`` (after gunzip, which inflates in bounded chunks) or
``max_lines`` points raise :class:`~metricvault.errors.TooLargeError` (413); a content encoding
other than identity or gzip raises :class:`~metricvault.errors.UnsupportedError` (415).

Speed: most lines never reach the character scanner. A fast path splits them with ``str.split``
(escapes swapped for private-use placeholder characters first) and hands anything unusual
(quotes, empty parts, odd numbers) to the scanner, which is authoritative and words the errors.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from math import isfinite

import numpy as np
import pyarrow as pa

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import (
    InputError,
    LabelError,
    TooLargeError,
    UnsupportedError,
    ValueRangeError,
)
from metricvault.ingest.limits import DecodeBudget, check_label_names
from metricvault.model import (
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    label_name_problem,
)

__all__ = ["DecodedLines", "LineError", "decode_line_protocol"]

SHOWN_LINE_CHARS = 200
_GUNZIP_CHUNK = 1 << 20

# Nanoseconds per unit, keyed by every spelling InfluxDB 1.x and 2.x accept for ``precision``.
PRECISIONS = {
    "ns": 1,
    "n": 1,
    "us": 1_000,
    "u": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
# InfluxDB's own timestamp range (models.MinNanoTime / MaxNanoTime).
_MIN_NS = -(2**63) + 2
_MAX_NS = 2**63 - 2
_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1
_MAX_DIGITS = 20  # more digits than any int64/uint64 (after leading zeros) can have

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
_FLOAT_CHARS = "0123456789.eE+-"
_DIGITS = "0123456789"
_FLOAT_ENDS = frozenset("0123456789.")

_MEASUREMENT_ESCAPES = ", \\"
_KEY_ESCAPES = ",= \\"
_STRING_ESCAPES = '"\\'

_METRIC_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")

_HOW = (
    "line protocol is 'measurement[,tag=value...] field=value[,field=value...] [timestamp]'; "
    "escape ',', '=' and ' ' in names and tag values with a backslash"
)


@dataclass(frozen=True)
class LineError:
    """One line left out of an otherwise accepted request."""

    line: int  # 1-based line number in the (decompressed) body
    text: str  # the line, at most SHOWN_LINE_CHARS characters
    reason: str


@dataclass(frozen=True)
class DecodedLines:
    """The accepted points in the long shape, plus the lines left out one by one."""

    table: pa.Table
    points: int
    samples: int
    rejected: tuple[LineError, ...]


class _LineProblem(Exception):
    """Why one line is invalid; turned into ``kind(message)`` naming the line."""

    def __init__(self, reason: str, kind: type[InputError] = InputError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


# A tag as str.partition returns it: (key, "=", value).
_Tag = tuple[str, str, str]
# (measurement, tags, field keys, field values with None for a string, timestamp or None)
_Parsed = tuple[str, list[_Tag], list[str], list[float | None], str | None]


def decode_line_protocol(
    body: bytes,
    *,
    precision: str = "ns",
    content_encoding: str | None = None,
    max_decoded_bytes: int = 64 * 1024**2,
    max_lines: int | None = None,
    now_ms: int | None = None,
    max_series: int | None = None,
    max_label_names: int | None = None,
    time_budget_s: float | None = None,
) -> DecodedLines:
    """Decode a line-protocol request body; see the module docstring for the rules.

    Limits (``None``: none), each a ``TooLargeError`` (413) as soon as it is passed:
    ``max_series`` distinct (metric, tag set) pairs, counted as written (tags in another order
    count again), ``max_label_names`` distinct labels, ``time_budget_s`` seconds of this
    thread's CPU time.
    """
    budget = DecodeBudget(time_budget_s)
    ns_per_unit = PRECISIONS.get(precision)
    if ns_per_unit is None:
        raise InputError(
            f"unknown precision {_q(precision)}; use one of {', '.join(PRECISIONS)} "
            "(n/ns = nanoseconds, the default; u/us, ms, s, m, h)"
        )
    raw = decode_body(body, content_encoding, max_decoded_bytes)
    text = _utf8(raw)
    lines = text.split("\n")
    if max_lines is not None and len(lines) > max_lines:
        _check_line_count(lines, max_lines)
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    decoder = _Decoder(precision, ns_per_unit, now_ms)
    decoder.max_series, decoder.max_label_names = max_series, max_label_names
    for number, line in enumerate(lines, 1):
        if line and line[0] != "#":
            decoder.add(number, line)
        if not number % _BUDGET_EVERY:
            budget.check(f"{number:,} of {len(lines):,} lines")
    return decoder.result()


_BUDGET_EVERY = 4096  # lines decoded between two looks at the decode time budget


def decode_body(body: bytes, content_encoding: str | None, max_decoded_bytes: int) -> bytes:
    """The body as sent, or gunzipped; never more than ``max_decoded_bytes`` of it."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        if len(body) > max_decoded_bytes:
            raise TooLargeError(_too_large(f"the body is {len(body)} bytes", max_decoded_bytes))
        return body
    if encoding in ("gzip", "x-gzip"):
        return _gunzip(body, max_decoded_bytes)
    raise UnsupportedError(
        f"Content-Encoding {_q(content_encoding)} is not supported for line protocol; "
        "send the body uncompressed or with 'Content-Encoding: gzip'"
    )


def _too_large(what: str, limit: int) -> str:
    return (
        f"{what}, more than the limit of {limit} bytes of line protocol per request "
        "(max_decoded_bytes); split the batch into smaller requests"
    )


def _gunzip(body: bytes, limit: int) -> bytes:
    """Inflate gzip members in bounded chunks, so a gzip bomb stops at ``limit`` bytes."""
    out: list[bytes] = []
    total = 0
    data = body
    try:
        while True:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            while not inflater.eof:
                chunk = inflater.decompress(data, min(_GUNZIP_CHUNK, limit + 1 - total))
                total += len(chunk)
                if total > limit:
                    raise TooLargeError(_too_large("the gzip body inflates to more", limit))
                progress = bool(chunk) or len(inflater.unconsumed_tail) != len(data)
                data = inflater.unconsumed_tail
                out.append(chunk)
                if not progress:
                    break
            if not inflater.eof:
                raise InputError(
                    f"the gzip body ends early after {total} decompressed bytes (truncated "
                    "upload?); send the complete gzip stream"
                )
            data = inflater.unused_data
            if not data:
                return b"".join(out)
    except zlib.error as exc:
        raise InputError(
            f"the body is not valid gzip ({exc}); compress it with gzip or drop the "
            "'Content-Encoding: gzip' header"
        ) from exc


def _utf8(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"line {number} is not valid UTF-8 (byte {raw[exc.start : exc.start + 1]!r} at "
            f"offset {exc.start}: {exc.reason}); line protocol is UTF-8 text — re-encode it"
        ) from exc
    nul = text.find("\x00")
    if nul >= 0:
        number = text.count("\n", 0, nul) + 1
        column = nul - text.rfind("\n", 0, nul)
        raise InputError(
            f"line {number} contains a NUL character at column {column}; line protocol is "
            "text — remove NUL characters from names and values"
        )
    return text


def _check_line_count(lines: list[str], max_lines: int) -> None:
    count = 0
    for line in lines:
        stripped = line.strip(" \t\r")
        if stripped and stripped[0] != "#":
            count += 1
    if count > max_lines:
        raise TooLargeError(
            f"the body has {count} lines of line protocol, more than the limit of {max_lines} "
            "per request (max_lines); split the batch into smaller requests"
        )


class _Decoder:
    """Accumulates the accepted points of one request, column by column."""

    def __init__(self, precision: str, ns_per_unit: int, now_ms: int) -> None:
        self.precision = precision
        self.ns_per_unit = ns_per_unit
        self.now_ms = now_ms
        self.metric_names: dict[str, dict[str, str]] = {}
        self.label_names: dict[str, str] = {}
        self.point_tags: list[dict[str, str]] = []
        self.point_ts: list[int] = []
        self.row_point: list[int] = []
        self.metrics: list[str] = []
        self.values: list[float] = []
        self.rejected: list[LineError] = []
        self.max_series: int | None = None
        self.max_label_names: int | None = None
        self.labels: set[str] = set()
        self.series_fields: dict[tuple[str, tuple[_Tag, ...]], set[str]] = {}
        self.series = 0

    def add(self, number: int, line: str) -> None:
        try:
            stripped = line
            if line[0] in " \t" or line[-1] in " \t\r":
                stripped = line.strip(" \t\r")
                if not stripped or stripped[0] == "#":
                    return
            parsed = _parse_fast(stripped) or _parse_slow(stripped)
            self._add_point(number, line, parsed)
        except _LineProblem as problem:
            raise problem.kind(
                f"line {number}: {problem.reason}. The line was {_shown(line)!r}; the whole "
                "request was rejected and nothing was stored"
            ) from None

    def _add_point(self, number: int, line: str, parsed: _Parsed) -> None:
        measurement, pairs, keys, values, ts_token = parsed
        ts = self.now_ms if ts_token is None else self._timestamp(ts_token)
        tags = self._tags(pairs, len(line) > MAX_LABEL_VALUE_BYTES)
        names = self._metric_names(measurement, keys)
        if None in values:
            strings = [key for key, value in zip(keys, values, strict=True) if value is None]
            self.rejected.append(LineError(number, _shown(line), _string_reason(strings)))
            return
        self._count_series(measurement, pairs, keys)
        point = len(self.point_ts)
        self.point_tags.append(tags)
        self.point_ts.append(ts)
        self.metrics.extend(names)
        self.values.extend(values)  # type: ignore[arg-type]  # no None: checked above
        self.row_point.extend([point] * len(values))

    def _count_series(self, measurement: str, pairs: list[_Tag], keys: list[str]) -> None:
        if self.max_series is None:
            return
        fields = self.series_fields.setdefault((measurement, tuple(pairs)), set())
        before = len(fields)
        fields.update(keys)
        self.series += len(fields) - before
        if self.series > self.max_series:
            raise TooLargeError(
                f"the request holds more than {self.max_series:,} series (metric and tag set), "
                "over the limit per request (max_series_per_request); nothing was stored: "
                "split the batch into smaller requests or raise max_series_per_request"
            )

    def _timestamp(self, token: str) -> int:
        digits = token[1:] if token[0] == "-" else token
        if len(digits) > _MAX_DIGITS:
            digits = digits.lstrip("0") or "0"
        if not (digits.isdigit() and digits.isascii()):
            raise _LineProblem(
                f"timestamp {_q(token)} is not an integer; give whole {self.precision} since "
                f"the epoch (or leave it out for 'now'). {_HOW}"
            )
        raw = _MAX_NS + 1 if len(digits) > _MAX_DIGITS else int(digits)
        raw = -raw if token[0] == "-" else raw
        ns = raw * self.ns_per_unit
        if not _MIN_NS <= ns <= _MAX_NS:
            raise _LineProblem(
                f"timestamp {_clip(token)} in precision {_q(self.precision)} is outside the int64 "
                "nanosecond range InfluxDB allows; check the timestamp and the precision",
                ValueRangeError,
            )
        ms = ns // 1_000_000
        if not MIN_TS_MS <= ms <= MAX_TS_MS:
            raise _LineProblem(_absurd_timestamp(raw, ms, self.precision), ValueRangeError)
        return ms

    def _tags(self, pairs: list[_Tag], long_line: bool) -> dict[str, str]:
        if len(pairs) > MAX_LABELS:
            raise _LineProblem(
                f"the line has {len(pairs)} tags; the limit is {MAX_LABELS}: drop "
                "high-cardinality or redundant tags",
                LabelError,
            )
        known = self.label_names
        tags = {known.get(key) or self._new_label(key): value for key, _, value in pairs}
        if len(tags) != len(pairs):
            labels = [known[key] for key, _, _ in pairs]
            label = next(label for label in labels if labels.count(label) > 1)
            keys = [key for key, _, _ in pairs if known[key] == label]
            raise _LineProblem(_duplicate("tag", keys, label), LabelError)
        if long_line:
            for key, _, value in pairs:
                if len(value.encode()) > MAX_LABEL_VALUE_BYTES:
                    raise _LineProblem(
                        f"tag {_q(key)} has a {len(value.encode())}-byte value; the limit is "
                        f"{MAX_LABEL_VALUE_BYTES} bytes: do not put free text into tags",
                        LabelError,
                    )
        return tags

    def _new_label(self, key: str) -> str:
        label = _LABEL_BAD_CHARS.sub("_", key)
        if label[0] in _DIGITS:
            label = "_" + label
        problem = label_name_problem(label)
        if problem is not None:
            mapped = f" becomes label {_q(label)}" if label != key else ""
            raise _LineProblem(f"tag {_q(key)}{mapped}: {problem}", LabelError)
        self.label_names[key] = label
        self.labels.add(label)
        check_label_names(len(self.labels), self.max_label_names, _q(label))
        return label

    def _metric_names(self, measurement: str, keys: list[str]) -> list[str]:
        known = self.metric_names.get(measurement)
        if known is None:
            known = self.metric_names[measurement] = {}
        names = [known.get(key) or _metric_name(known, measurement, key) for key in keys]
        if len(names) > 1 and len(set(names)) != len(names):
            name = next(name for name in names if names.count(name) > 1)
            same = [key for key, other in zip(keys, names, strict=True) if other == name]
            raise _LineProblem(_duplicate("field", same, name), LabelError)
        return names

    def result(self) -> DecodedLines:
        if not self.point_ts and self.rejected:
            first = self.rejected[0]
            raise InputError(
                f"all {len(self.rejected)} lines were rejected, nothing was stored; the first "
                f"is line {first.line}: {first.reason}"
            )
        row_point = pa.array(self.row_point, pa.int64())
        columns = self._tag_columns()
        labels = sorted(columns)
        arrays = [
            pa.array(self.metrics, pa.string()),
            pa.array(self.point_ts, pa.int64()).take(row_point),
            pa.array(self.values, pa.float64()),
        ]
        arrays += [columns[label].take(row_point) for label in labels]
        table = pa.Table.from_arrays(arrays, schema=long_schema(labels))
        return DecodedLines(table, len(self.point_ts), len(self.metrics), tuple(self.rejected))

    def _tag_columns(self) -> dict[str, pa.Array]:
        """One value per point for each label, visiting only the tags the points have: asking
        every point for every label cost points x labels (issue 10)."""
        points_of: dict[str, list[int]] = {}
        values_of: dict[str, list[str]] = {}
        for point, tags in enumerate(self.point_tags):
            for label, value in tags.items():
                if label not in points_of:
                    points_of[label], values_of[label] = [], []
                points_of[label].append(point)
                values_of[label].append(value)
        columns = {}
        for label, points in points_of.items():
            picks = np.full(len(self.point_tags), -1, dtype=np.int64)
            picks[points] = np.arange(len(points))
            values = pa.array(values_of[label], pa.string())
            columns[label] = values.take(pa.array(picks, mask=picks < 0))
        return columns


def long_schema(labels: list[str]) -> pa.Schema:
    """metric, timestamp (epoch ms), value, then one nullable string column per label."""
    return pa.schema(
        [
            pa.field("metric", pa.string(), nullable=False),
            pa.field("timestamp", pa.int64(), nullable=False),
            pa.field("value", pa.float64(), nullable=False),
            *(pa.field(label, pa.string()) for label in labels),
        ]
    )


def _metric_name(known: dict[str, str], measurement: str, key: str) -> str:
    name = _METRIC_BAD_CHARS.sub("_", f"{measurement}_{key}")
    if name[0] in _DIGITS:
        name = "_" + name
    known[key] = name
    return name


def _duplicate(what: str, keys: list[str], name: str) -> str:
    if len(set(keys)) == 1:
        return f"{what} {_q(keys[0])} appears more than once; give each {what} once per line"
    return (
        f"{what}s {' and '.join(_q(k) for k in keys)} all become {_q(name)} after replacing "
        f"characters outside Prometheus' name alphabet with '_'; rename one of them"
    )


def _string_reason(keys: list[str]) -> str:
    names = ", ".join(_q(k) for k in keys)
    field = "field" if len(keys) == 1 else "fields"
    it = "it" if len(keys) == 1 else "them"
    return (
        f"string {field} {names} not stored: metricvault keeps numbers; send {it} as a tag or "
        "a log (the line's other fields were left out with it)"
    )


def _absurd_timestamp(raw: int, ms: int, precision: str) -> str:
    try:
        when = datetime.fromtimestamp(ms / 1000, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        when = f"{ms} ms since the epoch"
    fits = [
        unit
        for unit in ("ns", "us", "ms", "s")
        if MIN_TS_MS <= raw * PRECISIONS[unit] // 1_000_000 <= MAX_TS_MS
    ]
    hint = f"; it looks like {fits[0]} — send precision={fits[0]}" if fits else ""
    return (
        f"timestamp {raw} in precision {_q(precision)} is {when}, outside "
        f"the years 1990-2200 that metricvault accepts{hint}"
    )


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _q(text: str | None) -> str:
    """A user-given name or value, quoted and clipped for an error message."""
    return repr(text if text is None else _clip(text))


def _shown(line: str) -> str:
    line = line.rstrip("\r")
    if len(line) <= SHOWN_LINE_CHARS:
        return line
    return line[: SHOWN_LINE_CHARS - 1] + "…"


# --- fast path: str.split on lines without quotes, with a careful rejoin for escapes ---------


def _parse_fast(line: str) -> _Parsed | None:
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
        if text[-1] in _FLOAT_ENDS:
            try:
                number = float(text)
            except ValueError:
                return None
            if text.strip(_FLOAT_CHARS) or text[0] == "+" or not isfinite(number):
                return None
        else:
            other = _other_number(text)
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


def _other_number(text: str) -> float | None:
    """An integer, unsigned or boolean field value; None if ``text`` is none of them."""
    last = text[-1]
    if len(text) > _MAX_DIGITS + 2:
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


# --- slow path: a character scanner that knows every rule and says what is wrong -------------


def _parse_slow(line: str) -> _Parsed:
    measurement, i = _token(line, 0, ", ", _MEASUREMENT_ESCAPES)
    if not measurement:
        raise _LineProblem(f"the line does not start with a measurement name; {_HOW}")
    n = len(line)
    pairs: list[_Tag] = []
    while i < n and line[i] == ",":
        tag, value, i = _tag(line, i + 1)
        pairs.append((tag, "=", value))
    i = _skip_spaces(line, i)
    if i >= n:
        raise _LineProblem(
            f"measurement {_q(measurement)} has no fields; every point needs at least one "
            f"field=value after a space. {_HOW}"
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
            f"unexpected text after the timestamp: {_q(ts)}; a line ends with the timestamp "
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
            raise _LineProblem(f"empty tag at character {i + 1} (a stray ','?); {_HOW}")
        raise _LineProblem(f"tag {_q(tag)} has no '=value'; tags are key=value. {_HOW}")
    if not tag:
        raise _LineProblem(f"a tag has an empty key before '=' at character {i + 1}; {_HOW}")
    value, i = _token(line, i + 1, ",= ", _KEY_ESCAPES)
    if i < len(line) and line[i] == "=":
        raise _LineProblem(
            f"tag {_q(tag)} has an unescaped '=' in its value at character {i + 1}; "
            "write it as '\\='"
        )
    if not value:
        raise _LineProblem(
            f"tag {_q(tag)} has an empty value; InfluxDB does not allow empty tag values — "
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
                raise _LineProblem(f"empty field at character {i + 1} (a stray ','?); {_HOW}")
            raise _LineProblem(f"field {_q(field)} has no '=value'; fields are key=value. {_HOW}")
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
            values.append(_field_value(field, line[i:end]))
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
        f"the string value of field {_q(field)} has no closing '\"'; close it, and write "
        "quotes inside it as '\\\"' (strings cannot span lines)"
    )


def _field_value(field: str, text: str) -> float:
    if not text:
        raise _LineProblem(f"field {_q(field)} has no value after '='; {_HOW}")
    if text.lower() in _NON_FINITE:
        raise _LineProblem(
            f"field {_q(field)} is {_clip(text)}: NaN and Inf are not valid line protocol values "
            "and metricvault stores finite numbers only; drop the field or send a number",
            ValueRangeError,
        )
    try:
        number = float(text)
    except ValueError:
        return _typed_value(field, text)
    if text.strip(_FLOAT_CHARS) or text[0] == "+":
        raise _LineProblem(_bad_value(field, text))
    if not isfinite(number):
        raise _LineProblem(
            f"field {_q(field)} = {_clip(text)} is outside the float64 range; "
            "send a smaller number",
            ValueRangeError,
        )
    return number


def _typed_value(field: str, text: str) -> float:
    number = _other_number(text)
    if number is not None:
        return number
    last = text[-1]
    body = text[1:-1] if last == "i" and text[0] == "-" else text[:-1]
    if last in "iu" and body.isdigit() and body.isascii():
        kind = "int64" if last == "i" else "uint64"
        raise _LineProblem(
            f"field {_q(field)} = {_clip(text)} is outside the {kind} range; send it as a float",
            ValueRangeError,
        )
    if last == "i":
        raise _LineProblem(
            f"field {_q(field)} = {_q(text)} is not an integer: integers are digits with an "
            "optional '-' and a trailing 'i', e.g. 12i or -3i"
        )
    if last == "u":
        raise _LineProblem(
            f"field {_q(field)} = {_q(text)} is not an unsigned integer: digits and a trailing "
            "'u', e.g. 12u"
        )
    raise _LineProblem(_bad_value(field, text))


def _bad_value(field: str, text: str) -> str:
    return (
        f"field {_q(field)} has the invalid value {_q(text)}: floats look like 1.5, -0.5 or 1e3, "
        "integers 12i, unsigned 12u, booleans t/f/true/false, and strings need double quotes"
    )
