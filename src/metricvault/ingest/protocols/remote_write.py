"""Prometheus remote-write 1.0 and 2.0 request bodies -> the long-shape Arrow table.

A pure function: bytes and three header values in, a ``DecodedWrite`` out, or a
``MetricVaultError`` subclass raised and nothing returned: a request is taken whole or not at
all. No I/O, no store.

What is kept and what is only counted:

- Float samples with a finite value become one table row each, in request order.
- Staleness markers (NaN with bits ``0x7ff0000000000002``) are dropped and counted in
  ``stale_markers``; every other NaN/±Inf is dropped and counted in ``non_finite``. The store only
  keeps finite values. ``samples + stale_markers + non_finite`` = float samples received.
- Native histogram samples and exemplars are counted (``histograms``, ``exemplars``), not stored;
  the gateway reports them as received but not written.
- 1.0 metadata entries are returned as sent (Prometheus sends them in their own requests); 2.0
  per-series metadata is de-duplicated. 2.0 ``created_timestamp`` is read past; exemplar label
  references are not checked.
- A label with an empty value is the same as no label (Prometheus semantics): it is null, and a
  label name that only ever has empty values gets no column.

Version negotiation follows the specs and Prometheus's own receiver: the ``proto`` parameter of
``Content-Type`` decides; without one (or without a Content-Type at all) the body is 1.0. A
missing ``Content-Encoding`` is taken as snappy, as Prometheus does; any other encoding is
refused. Snappy means the *block* format; the framed stream format is refused.

How it is fast (a gateway must sustain 250,000 samples/s on two cores): the body is parsed by
the C protobuf runtime through "twin" schemas (see ``ingest/proto/messages.py``) that hand over
every label and sample of the request as flat lists; labels are resolved through a cache of
label bytes, samples are decoded with numpy, and all checks run on whole columns. When any check
fails, a plain per-series pass over the request finds the first offending series and raises the
error that names it: the slow path is only ever taken by requests that are rejected.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.errors import InputError, LabelError, TooLargeError, UnsupportedError
from metricvault.ingest.limits import DecodeBudget, check_label_names
from metricvault.ingest.proto import messages
from metricvault.model import METRIC_NAME_LABEL, label_name_ok, label_name_problem

__all__ = [
    "STALE_NAN_BITS",
    "DecodedWrite",
    "MetricMetadata",
    "decode_remote_write",
]

STALE_NAN_BITS = 0x7FF0000000000002
PROTO_V1 = "prometheus.WriteRequest"
PROTO_V2 = "io.prometheus.write.v2.Request"
_MEDIA_TYPE = "application/x-protobuf"
_CT_V1 = _MEDIA_TYPE
_CT_V2 = f"{_MEDIA_TYPE};proto={PROTO_V2}"
_FRAMED_SNAPPY_MAGIC = b"\xff\x06\x00\x00sNaPpY"
# One snappy copy element of 3 bytes emits at most 64 bytes: no valid block expands further.
_SNAPPY_MAX_RATIO = 22
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_METRIC_NAME_ANCHORED = f"^{_METRIC_NAME.pattern}$"  # for Arrow's RE2, over a whole column
_METRIC_TYPES = (
    "unknown",
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
)
_MAX_SHOWN_VALUE = 60
Describe = Callable[[], str]  # renders the offending series, only when an error needs it


@dataclass(frozen=True)
class MetricMetadata:
    """Type, unit and help of one metric family, as the sender described it."""

    metric: str
    type: str  # counter, gauge, histogram, gaugehistogram, summary, info, stateset, unknown
    unit: str
    help: str


@dataclass(frozen=True)
class DecodedWrite:
    """One decoded remote-write request.

    ``table`` is the long shape: ``metric`` (string), ``timestamp`` (int64 epoch ms), ``value``
    (float64), then one string column per label name, sorted by name, null where a series lacks
    the label. One row per stored sample, in request order. ``series`` (an addition to the
    gateway contract, defaulted so code that builds one need not pass it) counts the time series
    in the request, including those whose samples were all dropped or that only carried
    histograms.
    """

    table: pa.Table
    kinds: dict[str, str]  # metric name -> "counter" | "gauge", from this request's metadata
    metadata: tuple[MetricMetadata, ...]
    version: str  # "1.0" or "2.0"
    samples: int  # float samples stored in ``table``
    histograms: int  # native histogram samples received, not stored
    exemplars: int  # exemplars received, not stored
    stale_markers: int  # staleness markers received and dropped
    non_finite: int  # other NaN/±Inf samples received and dropped
    series: int = 0  # time series in the request (also those whose samples were all dropped)


def decode_remote_write(
    body: bytes,
    *,
    content_type: str | None,
    content_encoding: str | None,
    version_header: str | None,
    max_decoded_bytes: int = 64 * 1024**2,
    max_series: int | None = None,
    max_label_names: int | None = None,
    time_budget_s: float | None = None,
) -> DecodedWrite:
    """Decode one remote-write request body (1.0 or 2.0, snappy block compressed).

    Limits (``None``: none), each a ``TooLargeError`` (413) before the work it bounds:
    ``max_series`` time series, ``max_label_names`` distinct label names (the long shape has a
    cell per row and label name), ``time_budget_s`` seconds of this thread's CPU time.
    """
    budget = DecodeBudget(time_budget_s)
    version = negotiate_version(content_type, version_header)
    _check_encoding(content_encoding)
    raw = decompress_snappy_block(body, max_decoded_bytes)
    limits = _Limits(max_series, max_label_names, budget)
    if version == "1.0":
        return _decode_v1(raw, limits)
    return _decode_v2(raw, limits)


@dataclass(frozen=True)
class _Limits:
    max_series: int | None
    max_label_names: int | None
    budget: DecodeBudget

    def check_flat(self, flat: _Flat) -> None:
        """Before the long shape is built: its cost is rows x label names."""
        names = [name for name in flat.names if name != "__name__"]
        check_label_names(len(names), self.max_label_names, ", ".join(map(_show, names[:3])))
        self.budget.check(f"reading {len(flat.label_counts):,} series")


# --- headers ---------------------------------------------------------------------------------


def negotiate_version(content_type: str | None, version_header: str | None) -> str:
    """``"1.0"`` or ``"2.0"`` from the request headers, or ``UnsupportedError``."""
    if content_type is None or not content_type.strip():
        if version_header is not None and version_header.strip().startswith("2."):
            raise UnsupportedError(
                f"X-Prometheus-Remote-Write-Version is {version_header.strip()!r} but there is "
                f"no Content-Type to say which message the body holds; send Content-Type "
                f"{_CT_V2!r} for remote-write 2.0 or {_CT_V1!r} for 1.0"
            )
        return "1.0"
    media_type, *params = (part.strip() for part in content_type.split(";"))
    if media_type.lower() != _MEDIA_TYPE:
        raise UnsupportedError(
            f"Content-Type {content_type!r} is not supported: remote-write bodies are "
            f"{_MEDIA_TYPE!r}; send {_CT_V1!r} (remote-write 1.0) or {_CT_V2!r} (2.0)"
        )
    proto = None
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "proto":
            proto = value.strip().strip('"')
    if proto is None or proto == PROTO_V1:
        return "1.0"
    if proto == PROTO_V2:
        return "2.0"
    raise UnsupportedError(
        f"Content-Type {content_type!r} asks for protobuf message {proto!r}, which this "
        f"receiver does not speak; supported: {PROTO_V1!r} (remote-write 1.0) and {PROTO_V2!r} "
        f"(2.0)"
    )


def _check_encoding(content_encoding: str | None) -> None:
    if content_encoding is None or content_encoding.strip().lower() in ("", "snappy"):
        return
    raise UnsupportedError(
        f"Content-Encoding {content_encoding!r} is not supported: remote-write bodies must be "
        f"snappy block compressed; send the body snappy-compressed with Content-Encoding: snappy"
    )


# --- snappy ----------------------------------------------------------------------------------


def decompress_snappy_block(body: bytes, max_decoded_bytes: int) -> memoryview:
    """Decompress a snappy *block*, checking its declared size before allocating anything."""
    if not body:
        raise InputError(
            "the request body is empty; send the snappy-compressed protobuf message as the body "
            "(even an empty request compresses to one byte, 0x00)"
        )
    if body.startswith(_FRAMED_SNAPPY_MAGIC):
        raise InputError(
            "the body is a framed snappy stream, but remote-write uses the snappy block format; "
            "compress with snappy's block API (Go: snappy.Encode, Python: "
            "cramjam.snappy.compress_raw), not the framed/stream writer"
        )
    declared = _snappy_declared_length(body)
    if declared > max_decoded_bytes:
        raise TooLargeError(
            f"the snappy block declares {declared:,} decompressed bytes, over the limit of "
            f"{max_decoded_bytes:,}; send smaller batches (Prometheus: lower "
            f"queue_config.max_samples_per_send)"
        )
    if declared > _SNAPPY_MAX_RATIO * len(body) + 64:
        raise InputError(
            f"the snappy block declares {declared:,} decompressed bytes, more than a "
            f"{len(body):,}-byte block can hold: the body is truncated or not snappy block "
            f"compressed; send the whole body, compressed with the snappy block format"
        )
    try:
        raw = cramjam.snappy.decompress_raw(body)
    except Exception as exc:  # cramjam.DecompressionError, and anything else it may raise
        raise InputError(
            f"the body ({len(body):,} bytes) is not a valid snappy block: {exc}; it may be "
            f"truncated, framed, or sent uncompressed; send the whole message compressed with "
            f"the snappy block format and Content-Encoding: snappy"
        ) from exc
    view = memoryview(raw)
    if len(view) != declared:
        raise InputError(
            f"the snappy block declares {declared:,} bytes but holds {len(view):,}: the body "
            f"is corrupt; send it again, compressed with the snappy block format"
        )
    return view


def _snappy_declared_length(body: bytes) -> int:
    length = 0
    for shift, byte in zip(range(0, 35, 7), body, strict=False):
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            if length > 0xFFFFFFFF:
                break
            return length
    raise InputError(
        f"the body does not start with a snappy block header (a varint of the decompressed "
        f"length; got {bytes(body[:5]).hex(' ')}): it is truncated or not snappy block "
        f"compressed; send the protobuf message compressed with the snappy block format"
    )


# --- protobuf --------------------------------------------------------------------------------

# What the bytes of one 1.0 Label mean, as an id into _PAIR_NAMES/_PAIR_VALUES (value None
# when empty). Series repeat every scrape and label pairs repeat across series, so most labels
# cost one dict lookup instead of a protobuf parse and two Python strings. Bounded: emptied when
# it holds _CACHE_MAX pairs (about 270 bytes each, so ~35 MB at most; a cluster whose distinct
# label pairs outnumber it still decodes right, only slower). Guarded by a lock: decoders on
# several threads share it safely. It only holds facts about bytes: it never changes a result.
_PAIR_IDS: dict[bytes, int] = {}
_PAIR_NAMES: list[str] = []
_PAIR_VALUES: list[str | None] = []
_PAIRS_LOCK = threading.Lock()
_CACHE_MAX = 1 << 17
# The long shape has a cell per (row, label name): bound it against requests that combine many
# series with many distinct label names (a few MB of protobuf could otherwise ask for GBs).
_MAX_LABEL_CELLS = 1 << 25
_BUDGET_EVERY = 4096  # labels parsed between two looks at the decode time budget


class _Invalid(Exception):
    """The fast path found a problem; the slow path finds it again and names the series."""


def _parse(cls: Any, raw: memoryview, version: str) -> Any:
    name, twin = (
        (PROTO_V1, messages.WriteRequestBytes)
        if version == "1.0"
        else (PROTO_V2, messages.RequestBytes)
    )
    request = cls()
    try:
        request.ParseFromString(raw)
    except messages.DecodeError as exc:
        _raise_for_invalid_utf8(twin, raw, version)
        raise InputError(
            f"the decompressed body ({len(raw):,} bytes) is not a valid protobuf {name}: {exc}; "
            f"send a {name} message encoded with the remote-write {version} .proto, and the "
            f"Content-Type that names it"
        ) from exc
    return request


def _raise_for_invalid_utf8(twin: Any, raw: memoryview, version: str) -> None:
    """After a failed parse: if only UTF-8 was wrong, raise an error that says where."""
    request = twin()
    try:
        request.ParseFromString(raw)
    except messages.DecodeError:
        return  # malformed for other reasons too; the caller reports that
    if version == "2.0":
        for ref, symbol in enumerate(request.symbols):
            if not _is_utf8(symbol):
                raise LabelError(
                    f"symbol #{ref} ({_show_bytes(symbol)}) is not valid UTF-8; every string "
                    f"in a remote-write request must be UTF-8: fix the sender's labels"
                )
        return
    for index, series in enumerate(request.timeseries):
        pairs = [(label.name, label.value) for label in series.labels]
        describe = partial(_describe_bytes, index, pairs)
        _check_utf8_labels(pairs, describe, "label")
        for number, exemplar in enumerate(series.exemplars):
            labels = [(label.name, label.value) for label in exemplar.labels]
            _check_utf8_labels(labels, describe, f"exemplar #{number}'s label")
    for index, entry in enumerate(request.metadata):
        for part in ("metric_family_name", "help", "unit"):
            text = getattr(entry, part)
            if not _is_utf8(text):
                raise InputError(
                    f"metadata entry #{index} ({_show_bytes(entry.metric_family_name)}): its "
                    f"{part} ({_show_bytes(text)}) is not valid UTF-8; every string in a "
                    f"remote-write request must be UTF-8: fix the sender's metadata"
                )


def _check_utf8_labels(pairs: list[tuple[bytes, bytes]], describe: Describe, what: str) -> None:
    for position, (name, value) in enumerate(pairs):
        for part, text in (("name", name), ("value", value)):
            if not _is_utf8(text):
                raise LabelError(
                    f"{describe()}: the {part} of {what} #{position} ({_show_bytes(text)}) is "
                    f"not valid UTF-8; every string in a remote-write request must be UTF-8: fix "
                    f"the sender's labels"
                )


def _is_utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _label_pairs(raw_labels: Any, budget: DecodeBudget) -> tuple[Any, list[str], list[str | None]]:
    """(pair index per label, name per distinct pair, value per distinct pair) for 1.0 labels.

    ``_Invalid`` if a label is not a valid protobuf ``Label``.
    """
    with _PAIRS_LOCK:
        try:
            ids = [_PAIR_IDS[raw_label] for raw_label in raw_labels]
        except KeyError:
            ids = _learn_labels(raw_labels, budget)
        pair_of_label = np.fromiter(ids, dtype=np.int64, count=len(ids))
        seen = np.zeros(len(_PAIR_NAMES), dtype=np.bool_)
        seen[pair_of_label] = True
        distinct = np.flatnonzero(seen)
        names = [_PAIR_NAMES[pair] for pair in distinct.tolist()]
        values = [_PAIR_VALUES[pair] for pair in distinct.tolist()]
    index_of = np.empty(len(seen), dtype=np.int64)
    index_of[distinct] = np.arange(len(distinct))
    return index_of[pair_of_label], names, values


def _learn_labels(raw_labels: Any, budget: DecodeBudget) -> list[int]:
    """Ids for labels, parsing those not seen yet; the registry is emptied when full."""
    for may_evict in (True, False):
        ids: list[int] = []
        for raw_label in raw_labels:
            pair = _PAIR_IDS.get(raw_label)
            if pair is None:
                if not len(_PAIR_NAMES) % _BUDGET_EVERY:
                    budget.check(f"{len(ids):,} of {len(raw_labels):,} labels")
                if may_evict and len(_PAIR_NAMES) >= _CACHE_MAX:
                    _PAIR_IDS.clear()
                    _PAIR_NAMES.clear()
                    _PAIR_VALUES.clear()
                    break  # ids taken so far are gone: start this request again
                try:
                    label = messages.Label.FromString(raw_label)
                except messages.DecodeError as exc:
                    raise _Invalid from exc
                pair = _PAIR_IDS[raw_label] = len(_PAIR_NAMES)
                _PAIR_NAMES.append(sys.intern(label.name))
                _PAIR_VALUES.append(label.value or None)
            ids.append(pair)
        else:
            return ids
    raise AssertionError("unreachable: the second pass never evicts")  # pragma: no cover


# --- samples ---------------------------------------------------------------------------------


def _decode_samples(raw_samples: list[bytes]) -> tuple[Any, Any]:
    """Values and timestamps of encoded ``Sample`` messages, decoded with numpy.

    Senders encode a sample as ``09 <8-byte double> 10 <varint ms>``, leaving out a zero value
    or a zero timestamp (proto3). Those four shapes are decoded for all samples at once; any
    other encoding (reordered or unknown fields) goes through the protobuf runtime instead.
    """
    count = len(raw_samples)
    if count == 0:
        return np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64)
    lengths = np.fromiter(map(len, raw_samples), dtype=np.int64, count=count)
    buffer = np.frombuffer(b"".join(raw_samples) + bytes(16), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    decoded = _decode_canonical_samples(buffer, starts, lengths)
    return decoded if decoded is not None else _decode_samples_slowly(raw_samples)


def _decode_canonical_samples(buffer: Any, starts: Any, lengths: Any) -> tuple[Any, Any] | None:
    has_value = (lengths >= 9) & (buffer[starts] == 0x09)
    ts_tag_at = np.where(has_value, starts + 9, starts)
    has_ts = (lengths > np.where(has_value, 9, 0)) & (buffer[ts_tag_at] == 0x10)
    varint_len = np.where(has_ts, lengths - (ts_tag_at - starts) - 1, 0)
    shapes_ok = (lengths == 0) | (has_value & (lengths == 9)) | (has_ts & (varint_len >= 1))
    if not shapes_ok.all() or varint_len.max() > 10:
        return None
    value_bytes = buffer[(starts + 1)[:, None] + np.arange(8)]
    values = np.zeros(len(starts), dtype=np.float64)
    values[has_value] = value_bytes.view("<f8").ravel()[has_value]
    timestamps = np.zeros(len(starts), dtype=np.uint64)
    for k in range(int(varint_len.max())):
        active = varint_len > k
        byte = buffer[np.where(active, ts_tag_at + 1 + k, 0)]
        last = active & (varint_len == k + 1)
        continues = (byte & 0x80) != 0
        if (continues & last).any() or (~continues & active & ~last).any():
            return None  # not a well-formed varint of exactly the remaining bytes
        if k == 9 and (byte[last] > 1).any():
            return None  # overflows 64 bits
        chunk = np.where(active, byte & 0x7F, 0).astype(np.uint64)
        timestamps |= chunk << np.uint64(7 * k)
    return values, timestamps.view(np.int64)


def _decode_samples_slowly(raw_samples: list[bytes]) -> tuple[Any, Any]:
    try:
        samples = [messages.Sample.FromString(raw) for raw in raw_samples]
    except messages.DecodeError as exc:
        raise _Invalid from exc
    values = np.array([sample.value for sample in samples], dtype=np.float64)
    timestamps = np.array([sample.timestamp for sample in samples], dtype=np.int64)
    return values, timestamps


# --- building the long shape -----------------------------------------------------------------


@dataclass
class _Flat:
    """One request's labels and samples as flat arrays, series after series."""

    label_counts: Any  # int64 per series
    codes: Any  # per label: its name, as an index into ``names``
    names: list[str]  # distinct label names, not yet checked
    values: Any  # pa.StringArray per label; null where the value is empty
    sample_counts: Any  # int64 per series
    sample_values: Any  # float64 per sample
    sample_timestamps: Any  # int64 per sample


@dataclass
class _Shape:
    table: pa.Table
    metrics: Any  # pa.StringArray, one per series
    samples: int
    stale: int
    non_finite: int


def _assemble(flat: _Flat) -> _Shape:
    """The long-shape table, or ``_Invalid`` if any series breaks a rule."""
    n_series = len(flat.label_counts)
    series_of_label = np.repeat(np.arange(n_series), flat.label_counts)
    metrics = _check_flat_labels(flat, series_of_label)
    values, timestamps = flat.sample_values, flat.sample_timestamps
    finite = np.isfinite(values)
    stale = int(np.count_nonzero(values.view(np.uint64) == STALE_NAN_BITS))
    non_finite = len(values) - int(np.count_nonzero(finite)) - stale
    rows = np.repeat(np.arange(n_series), flat.sample_counts)  # series of each row
    if stale or non_finite:
        rows, values, timestamps = rows[finite], values[finite], timestamps[finite]
    columns = {
        "metric": metrics.take(pa.array(rows)),
        "timestamp": pa.array(timestamps, type=pa.int64()),
        "value": pa.array(values, type=pa.float64()),
    }
    columns.update(_label_columns(flat, series_of_label, rows))
    return _Shape(pa.table(columns), metrics, len(values), stale, non_finite)


def _check_flat_labels(flat: _Flat, series_of_label: Any) -> Any:
    """Check names, order and metric names for all series at once; the metric per series."""
    n_series = len(flat.label_counts)
    if not n_series:
        return pa.array([], type=pa.string())
    if not all(map(_label_name_ok, flat.names)) or "__name__" not in flat.names:
        raise _Invalid
    ranks = np.empty(len(flat.names), dtype=np.int64)
    ranks[sorted(range(len(flat.names)), key=flat.names.__getitem__)] = np.arange(len(ranks))
    rank = ranks[flat.codes]
    same_series = series_of_label[1:] == series_of_label[:-1]
    if (same_series & (rank[1:] <= rank[:-1])).any():
        raise _Invalid  # a series whose labels are not strictly sorted (or repeat a name)
    is_metric = flat.codes == flat.names.index("__name__")
    if np.count_nonzero(is_metric) != n_series:  # at most one each (sorted): so one each
        raise _Invalid
    metrics = flat.values.take(pa.array(np.flatnonzero(is_metric)))
    if metrics.null_count:
        raise _Invalid
    if not pc.all(pc.match_substring_regex(metrics, _METRIC_NAME_ANCHORED)).as_py():
        raise _Invalid
    return metrics


def _label_columns(flat: _Flat, series_of_label: Any, rows: Any) -> dict[str, Any]:
    """One string column per label name (sorted), null where a row's series lacks it."""
    label_codes = [code for code in np.argsort(flat.names) if flat.names[code] != "__name__"]
    if not label_codes or not len(rows):
        return {}
    if len(flat.names) * max(len(rows), len(flat.label_counts)) > _MAX_LABEL_CELLS:
        raise TooLargeError(
            f"the request's {len(flat.label_counts):,} series use {len(flat.names):,} distinct "
            f"label names: a table of {len(rows):,} rows would need "
            f"{len(flat.names) * len(rows):,} label cells, over the limit of "
            f"{_MAX_LABEL_CELLS:,}; send fewer series per request"
        )
    # One name at a time, with one series-sized scratch array: a names x series matrix cost
    # 8 bytes per cell on top of the table itself (1 GB for 1,000 series x 33,000 names).
    order = np.argsort(flat.codes, kind="stable")  # labels grouped by name
    bounds = np.searchsorted(flat.codes[order], np.arange(len(flat.names) + 1))
    label_at = np.full(len(flat.label_counts), -1, dtype=np.int64)  # per series, this name's
    columns = {}
    for code in label_codes:
        labels = order[bounds[code] : bounds[code + 1]]
        label_at[series_of_label[labels]] = labels
        picks = label_at[rows]
        label_at[series_of_label[labels]] = -1
        if (picks >= 0).any():  # a label only dropped samples had gets no column
            columns[flat.names[code]] = flat.values.take(pa.array(picks, mask=picks < 0))
    # A name whose every kept value is empty is no label at all (empty value = absent label).
    return {name: column for name, column in columns.items() if column.null_count < len(rows)}


def _label_name_ok(name: str) -> bool:
    return name == METRIC_NAME_LABEL or label_name_ok(name)


def _check_series_count(count: int, max_series: int | None) -> None:
    if max_series is not None and count > max_series:
        raise TooLargeError(
            f"the request holds {count:,} time series, over the limit of {max_series:,} per "
            f"request (max_series_per_request); nothing was stored: send smaller batches "
            f"(Prometheus: lower queue_config.max_samples_per_send) or raise "
            f"max_series_per_request"
        )


# --- the slow path: find the first bad series and say what is wrong --------------------------


def _check_series(names: Sequence[str], values: Sequence[str | None], describe: Describe) -> None:
    previous = ""
    for position, name in enumerate(names):
        problem = None if name == METRIC_NAME_LABEL else label_name_problem(name)
        if problem is not None:
            raise LabelError(f"{describe()}: {problem}")
        if position and name <= previous:
            problem = "is duplicated" if name == previous else f"comes after {previous!r}"
            raise LabelError(
                f"{describe()}: label {name!r} {problem}; labels must be unique and sorted by "
                f"name, as the remote-write spec requires: sort and de-duplicate them before "
                f"sending"
            )
        previous = name
    if "__name__" not in names:
        raise LabelError(
            f"{describe()}: the series has no __name__ label; every series needs a metric "
            f"name: add __name__ (or fix the relabel rule that dropped it)"
        )
    metric = values[list(names).index("__name__")]
    if not metric:
        raise LabelError(
            f"{describe()}: the __name__ label is empty; every series needs a metric name "
            f"matching [a-zA-Z_:][a-zA-Z0-9_:]*"
        )
    if _METRIC_NAME.fullmatch(metric) is None:
        raise LabelError(
            f"{describe()}: metric name {_show(metric)} is invalid; metric names must match "
            f"[a-zA-Z_:][a-zA-Z0-9_:]* (replace other characters with '_')"
        )


def _unexplained(version: str) -> InputError:  # pragma: no cover - fast and slow paths agree
    return InputError(
        f"the remote-write {version} request was rejected, but no single series could be "
        f"blamed; check that the sender follows the remote-write {version} specification"
    )


# --- 1.0 -------------------------------------------------------------------------------------


def _decode_v1(raw: memoryview, limits: _Limits) -> DecodedWrite:
    request = _parse(messages.WriteRequestFast, raw, "1.0")
    merged = _parse(messages.WriteRequestMerged, raw, "1.0").timeseries
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    all_series = request.timeseries
    if len(raw) and not all_series and not request.metadata:
        raise InputError(
            f"the body ({len(raw):,} bytes) holds no {PROTO_V1} fields (timeseries, metadata): "
            f"is it a remote-write 2.0 body? If so, send it with Content-Type {_CT_V2!r}"
        )
    _check_series_count(len(all_series), limits.max_series)
    try:
        flat = _flatten_v1(all_series, merged, limits.budget)
        limits.check_flat(flat)
        shape = _assemble(flat)
    except _Invalid:
        raise _explain_v1(raw) from None
    metadata = tuple(_metadata_v1(request.metadata))
    census = (len(merged.histograms), len(merged.exemplars))
    return _result(shape, "1.0", metadata, _kinds_v1(metadata), *census)


def _flatten_v1(all_series: Any, merged: Any, budget: DecodeBudget) -> _Flat:
    label_counts = np.array([len(series.labels) for series in all_series], dtype=np.int64)
    sample_counts = np.array([len(series.samples) for series in all_series], dtype=np.int64)
    pair_of_label, pair_names, pair_values = _label_pairs(merged.labels, budget)
    code_of: dict[str, int] = {}
    code_of_pair = [code_of.setdefault(name, len(code_of)) for name in pair_names]
    sample_values, sample_timestamps = _decode_samples(list(merged.samples))
    return _Flat(
        label_counts=label_counts,
        codes=np.array(code_of_pair, dtype=np.int64)[pair_of_label],
        names=list(code_of),
        values=pa.array(pair_values, type=pa.string()).take(pa.array(pair_of_label)),
        sample_counts=sample_counts,
        sample_values=sample_values,
        sample_timestamps=sample_timestamps,
    )


def _explain_v1(raw: memoryview) -> InputError:
    request = _parse(messages.WriteRequest, raw, "1.0")  # raises if the protobuf is malformed
    for index, series in enumerate(request.timeseries):
        names = [label.name for label in series.labels]
        values = [label.value for label in series.labels]
        _check_series(names, values, partial(_describe, index, names, values))
    return _unexplained("1.0")


def _metadata_v1(entries: Any) -> Iterable[MetricMetadata]:
    for index, entry in enumerate(entries):
        name = entry.metric_family_name
        if _METRIC_NAME.fullmatch(name) is None:
            raise LabelError(
                f"metadata entry #{index}: metric family name {_show(name)} is invalid; names "
                f"must match [a-zA-Z_:][a-zA-Z0-9_:]*: fix the sender's metadata"
            )
        yield MetricMetadata(name, _metric_type(entry.type), entry.unit, entry.help)


def _kinds_v1(metadata: Iterable[MetricMetadata]) -> dict[str, str]:
    """Kinds of the series a family's samples arrive under (text format and OpenMetrics)."""
    kinds: dict[str, str] = {}
    for entry in metadata:
        family, kind = entry.metric, entry.type
        if kind == "counter":
            names = {family: "counter"}
            if not family.endswith("_total"):  # OpenMetrics names the family without _total
                names[f"{family}_total"] = "counter"
        elif kind == "histogram":
            names = {f"{family}{suffix}": "counter" for suffix in ("_bucket", "_count", "_sum")}
        elif kind == "summary":
            names = {family: "gauge", f"{family}_count": "counter", f"{family}_sum": "counter"}
        elif kind == "gaugehistogram":
            names = {f"{family}{suffix}": "gauge" for suffix in ("_bucket", "_gcount", "_gsum")}
        elif kind == "info":
            names = {family: "gauge", f"{family}_info": "gauge"}
        else:  # gauge, stateset, unknown
            names = {family: "gauge"}
        for name, name_kind in names.items():
            kinds.setdefault(name, name_kind)  # the first description of a name wins
    return kinds


# --- 2.0 -------------------------------------------------------------------------------------


def _decode_v2(raw: memoryview, limits: _Limits) -> DecodedWrite:
    request = _parse(messages.RequestFast, raw, "2.0")
    merged = _parse(messages.RequestMerged, raw, "2.0").timeseries
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    symbols = list(request.symbols)
    all_series = request.timeseries
    if len(raw) and not symbols and not all_series:
        raise InputError(
            f"the body ({len(raw):,} bytes) holds no {PROTO_V2} fields (symbols, timeseries): "
            f"is it a remote-write 1.0 body? If so, send it with Content-Type {_CT_V1!r}"
        )
    if symbols and symbols[0] != "":
        raise InputError(
            f"the symbol table starts with {_show(symbols[0])}, but remote-write 2.0 requires "
            f"symbols[0] to be the empty string; fix the sender's symbol table"
        )
    _check_series_count(len(all_series), limits.max_series)
    try:
        flat = _flatten_v2(all_series, merged, symbols)
        limits.check_flat(flat)
        shape = _assemble(flat)
        metadata, kinds = _metadata_v2(all_series, shape.metrics, symbols)
    except _Invalid:
        raise _explain_v2(raw, symbols) from None
    census = (len(merged.histograms), len(merged.exemplars))
    return _result(shape, "2.0", metadata, kinds, *census)


def _flatten_v2(all_series: Any, merged: Any, symbols: list[str]) -> _Flat:
    ref_counts = np.array([len(series.labels_refs) for series in all_series], dtype=np.int64)
    sample_counts = np.array([len(series.samples) for series in all_series], dtype=np.int64)
    refs = np.array(merged.labels_refs, dtype=np.int64)
    if (ref_counts % 2).any() or (len(refs) and refs.max() >= len(symbols)):
        raise _Invalid
    distinct_refs, codes = np.unique(refs[0::2], return_inverse=True)
    # A sender may repeat a string in the symbol table: one code per distinct name.
    code_of: dict[str, int] = {}
    recode = [code_of.setdefault(symbols[ref], len(code_of)) for ref in distinct_refs]
    as_values = pa.array([symbol or None for symbol in symbols], type=pa.string())
    sample_values, sample_timestamps = _decode_samples(list(merged.samples))
    return _Flat(
        label_counts=ref_counts // 2,
        codes=np.array(recode, dtype=np.int64)[codes] if len(codes) else codes,
        names=list(code_of),
        values=as_values.take(pa.array(refs[1::2])),
        sample_counts=sample_counts,
        sample_values=sample_values,
        sample_timestamps=sample_timestamps,
    )


def _metadata_v2(
    all_series: Any, metrics: Any, symbols: list[str]
) -> tuple[tuple[MetricMetadata, ...], dict[str, str]]:
    described: dict[tuple[str, bytes], None] = {}
    for metric, entry in zip(metrics.to_pylist(), [s.metadata for s in all_series], strict=True):
        if entry:
            described.setdefault((metric, entry), None)
    entries: dict[MetricMetadata, None] = {}
    kinds: dict[str, str] = {}
    for metric, encoded in described:
        try:
            entry = messages.Metadata.FromString(encoded)
        except messages.DecodeError as exc:
            raise _Invalid from exc
        if entry.help_ref >= len(symbols) or entry.unit_ref >= len(symbols):
            raise _Invalid
        kind, help_text, unit = (
            _metric_type(entry.type),
            symbols[entry.help_ref],
            symbols[entry.unit_ref],
        )
        if entry.type == 0 and not help_text and not unit:
            continue  # "unspecified" and nothing else: no metadata was sent
        entries.setdefault(MetricMetadata(metric, kind, unit, help_text), None)
        if entry.type:
            kinds.setdefault(metric, _kind_of_series(metric, kind))
    return tuple(entries), kinds


def _explain_v2(raw: memoryview, symbols: list[str]) -> InputError:
    request = _parse(messages.Request, raw, "2.0")  # raises if the protobuf is malformed
    for index, series in enumerate(request.timeseries):
        refs = list(series.labels_refs)
        if len(refs) % 2:
            raise LabelError(
                f"series #{index}: labels_refs has {len(refs)} entries, an odd number; it must "
                f"hold (name, value) symbol index pairs: fix the sender"
            )
        for ref in refs:
            if ref >= len(symbols):
                raise LabelError(
                    f"series #{index}: labels_refs points at symbol {ref}, but the symbol table "
                    f"has {len(symbols)} entries (0..{len(symbols) - 1}); fix the sender's "
                    f"symbol table"
                )
        names = [symbols[ref] for ref in refs[0::2]]
        values = [symbols[ref] for ref in refs[1::2]]
        _check_series(names, values, partial(_describe, index, names, values))
        entry = series.metadata
        if entry.help_ref >= len(symbols) or entry.unit_ref >= len(symbols):
            raise LabelError(
                f"{_describe(index, names, values)}: metadata help_ref={entry.help_ref}, "
                f"unit_ref={entry.unit_ref} point past the symbol table ({len(symbols)} "
                f"entries); fix the sender's symbol table"
            )
    return _unexplained("2.0")


def _kind_of_series(metric: str, kind: str) -> str:
    """2.0 metadata describes the series itself (``foo_bucket``), not its family (``foo``)."""
    if kind in ("counter", "histogram"):
        return "counter"
    if kind == "summary" and metric.endswith(("_count", "_sum")):
        return "counter"
    return "gauge"


# --- shared ----------------------------------------------------------------------------------


def _result(
    shape: _Shape,
    version: str,
    metadata: tuple[MetricMetadata, ...],
    kinds: dict[str, str],
    histograms: int,
    exemplars: int,
) -> DecodedWrite:
    return DecodedWrite(
        table=shape.table,
        kinds=kinds,
        metadata=metadata,
        version=version,
        samples=shape.samples,
        histograms=histograms,
        exemplars=exemplars,
        stale_markers=shape.stale,
        non_finite=shape.non_finite,
        series=len(shape.metrics),
    )


def _metric_type(number: int) -> str:
    return _METRIC_TYPES[number] if 0 <= number < len(_METRIC_TYPES) else "unknown"


def _describe(index: int, names: Sequence[str], values: Sequence[str | None]) -> str:
    """``series #3 up{job="x"}``: the index, and the series as PromQL would show it."""
    pairs = {name: value or "" for name, value in zip(names, values, strict=True)}
    metric = pairs.pop("__name__", "")
    shown = ",".join(f"{name}={_show(value)}" for name, value in pairs.items())
    return f"series #{index} {_show_metric(metric)}{{{shown}}}"


def _describe_bytes(index: int, pairs: Sequence[tuple[bytes, bytes]]) -> str:
    names = [name.decode("utf-8", "replace") for name, _ in pairs]
    values = [value.decode("utf-8", "replace") for _, value in pairs]
    return _describe(index, names, values)


def _show_metric(metric: str) -> str:
    return metric if not metric or _METRIC_NAME.fullmatch(metric) else _show(metric)


def _show(text: str) -> str:
    """A quoted, escaped, length-capped rendering for error messages."""
    suffix = f"...({len(text):,} chars)" if len(text) > _MAX_SHOWN_VALUE else ""
    return json.dumps(text[:_MAX_SHOWN_VALUE], ensure_ascii=False) + suffix


def _show_bytes(raw: bytes) -> str:
    shown = raw[:_MAX_SHOWN_VALUE]
    suffix = f"...({len(raw):,} bytes)" if len(raw) > _MAX_SHOWN_VALUE else ""
    return f"{shown!r}{suffix}"
