"""The mapping between metricvault series and InfluxDB 1.x points, both ways.

A series ``metric{k1="v1",k2="v2"}`` is the measurement ``metric`` with tags ``k1=v1,k2=v2``
and one float field ``value``; a sample is a point at its millisecond timestamp::

    DCGM_FI_DEV_GPU_UTIL,Hostname=node01,gpu=0 value=87.5 1767225600000

Metric names (``[a-zA-Z_:][a-zA-Z0-9_:]*``) and label names (``[a-zA-Z_][a-zA-Z0-9_]*``) need no
escaping; label values have ``,``, ``=`` and space escaped with a backslash. Reading back, the
series key InfluxDB reports (``SHOW SERIES``) is parsed into the same metric and labels, hence
the same ``series_id``. Three things cannot round-trip through InfluxDB 1.x line protocol and
are refused before anything is written: a label value containing a newline, a backslash right
before ``,``/``=``/space or at the end of a value (InfluxDB reads it as an escape), and a label
named ``time`` (InfluxDB drops it).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.errors import LabelError
from metricvault.model import Series

_SPECIAL = (",", "=", " ")
RESERVED_TAG_KEYS = frozenset({"time"})


def escape_tag(text: str) -> str:
    return text.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def check_label(metric: str, name: str, value: str) -> None:
    """Refuse what InfluxDB line protocol cannot carry exactly (the message says why)."""
    if name in RESERVED_TAG_KEYS:
        raise LabelError(
            f"label {name!r} on metric {metric!r} cannot be stored in InfluxDB: 1.x reserves the "
            "tag key 'time' and drops it. Rename the label, or use the embedded store"
        )
    bad = "\n" in value or "\r" in value
    bad = bad or value.endswith("\\") or any(f"\\{c}" in value for c in _SPECIAL)
    if bad:
        raise LabelError(
            f"label {name}={value!r} on metric {metric!r} cannot be stored in InfluxDB exactly: "
            "line protocol has no escape for a newline, and reads a backslash before ',', '=', "
            "a space or the end of the value as an escape. Nothing was written; clean the value "
            "or use the embedded store"
        )


def series_prefix(metric: str, labels: dict[str, str], field: str = "value") -> str:
    """``metric,k=v,... field=`` — everything of a line before the value (tags sorted)."""
    for name, value in labels.items():
        check_label(metric, name, value)
    tags = "".join(f",{k}={escape_tag(labels[k])}" for k in sorted(labels))
    return f"{metric}{tags} {field}="


def encode_points(
    prefixes: pa.Array, values: pa.Array, ts: pa.Array, batch_points: int
) -> Iterator[bytes]:
    """Line-protocol bodies of at most ``batch_points`` lines each, built one batch at a time
    (memory stays bounded by a batch).

    Arrow formats float64 in the shortest form that reads back to the same bits (``0.1``,
    ``1e-7``, ``5``); a number without an ``i`` suffix is a float in line protocol."""
    for start in range(0, len(prefixes), batch_points):
        texts = pc.cast(values.slice(start, batch_points), pa.string())
        stamps = pc.cast(ts.slice(start, batch_points), pa.string())
        points = pc.binary_join_element_wise(
            pc.binary_join_element_wise(prefixes.slice(start, batch_points), texts, ""),
            stamps,
            " ",
        )
        yield _joined(pc.binary_join_element_wise(points, pa.scalar(""), "\n"))


def _joined(lines: pa.Array | pa.ChunkedArray) -> bytes:
    """Each element already ends with its own separator: the body is the data buffer's span."""
    text = lines.combine_chunks() if isinstance(lines, pa.ChunkedArray) else lines
    text = text.cast(pa.large_string())
    offsets = np.frombuffer(text.buffers()[1], np.int64)[text.offset : text.offset + len(text) + 1]
    data = text.buffers()[2]
    return bytes(memoryview(data)[int(offsets[0]) : int(offsets[-1])])


def parse_series_key(key: str) -> tuple[str, dict[str, str]]:
    """``m,k=v\\,x`` (as ``SHOW SERIES`` prints it) -> (``m``, {``k``: ``v,x``})."""
    parts = _split_unescaped(key, ",")
    tags: dict[str, str] = {}
    for part in parts[1:]:
        pieces = _split_unescaped(part, "=")
        tags[_unescape(pieces[0])] = _unescape("=".join(pieces[1:]))
    return _unescape(parts[0]), tags


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split at ``sep`` unless a backslash escapes it (other backslashes are literal)."""
    out: list[str] = []
    start = i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _SPECIAL:
            i += 2
            continue
        if text[i] == sep:
            out.append(text[start:i])
            start = i + 1
        i += 1
    out.append(text[start:])
    return out


def _unescape(text: str) -> str:
    for ch in _SPECIAL:
        text = text.replace("\\" + ch, ch)
    return text


def series_from_point(measurement: str, tags: dict[str, str]) -> Series:
    """The metricvault series of an InfluxDB series (absent tags come back as ``""``);
    LabelError for measurements metricvault did not write (names it cannot hold)."""
    return Series.make(measurement, {k: v for k, v in tags.items() if v})


def string_field(text: str) -> str:
    """A double-quoted line-protocol string field value."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
