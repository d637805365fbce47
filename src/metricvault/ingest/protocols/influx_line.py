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
- A tag key whose label name ``metricvault.model`` refuses (starting with ``__``, reserved by
  Prometheus, or one of ``RESERVED_LABEL_NAMES``, the columns beside the labels: ``metric``,
  ``timestamp``, ``ts``, ``value``, ``series_id``, ``kind`` and the aggregates) is an error, as
  are two tag keys (or two field keys) of one line that map to one name.

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

The work is split by job: ``influx_body`` (encoding, UTF-8, line count),
``influx_tokens`` (the tokenizer, fast and slow), ``influx_values`` (field values and types),
``influx_batch`` (names, timestamps, limits, the Arrow table); this module is the entry point.
"""

from __future__ import annotations

import time

from metricvault.errors import InputError
from metricvault.ingest.protocols.decode_limits import DecodeBudget
from metricvault.ingest.protocols.influx_batch import (
    PRECISIONS,
    SHOWN_LINE_CHARS,
    DecodedLines,
    Decoder,
    LineError,
    long_schema,
)
from metricvault.ingest.protocols.influx_body import check_line_count, decode_body, utf8_text
from metricvault.ingest.protocols.influx_tokens import parse_fast, parse_slow
from metricvault.ingest.protocols.influx_values import q

__all__ = [
    "PRECISIONS",
    "SHOWN_LINE_CHARS",
    "DecodedLines",
    "LineError",
    "decode_body",
    "decode_line_protocol",
    "long_schema",
    "parse_fast",
    "parse_slow",
]


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
            f"unknown precision {q(precision)}; use one of {', '.join(PRECISIONS)} "
            "(n/ns = nanoseconds, the default; u/us, ms, s, m, h)"
        )
    raw = decode_body(body, content_encoding, max_decoded_bytes)
    text = utf8_text(raw)
    lines = text.split("\n")
    if max_lines is not None and len(lines) > max_lines:
        check_line_count(lines, max_lines)
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    decoder = Decoder(precision, ns_per_unit, now_ms)
    decoder.max_series, decoder.max_label_names = max_series, max_label_names
    for number, line in enumerate(lines, 1):
        if line and line[0] != "#":
            decoder.add(number, line)
        if not number % BUDGET_EVERY:
            budget.check(f"{number:,} of {len(lines):,} lines")
    return decoder.result()


BUDGET_EVERY = 4096  # lines decoded between two looks at the decode time budget
