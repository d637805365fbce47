"""Remote-write protobuf -> columns: the flat label and sample lists of a request (from the
C runtime's twin schemas) turned into the long-shape Arrow table, every rule checked on whole
columns. Any broken rule raises :class:`_Invalid`; the slow path then names the series.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.errors import TooLargeError
from metricvault.ingest.protocols.decode_limits import DecodeBudget, check_label_names
from metricvault.ingest.protocols.remote_write_checks import METRIC_NAME, _Invalid, show
from metricvault.ingest.protocols.remote_write_metadata import MetricMetadata
from metricvault.model import (
    METRIC_NAME_LABEL,
    STALE_NAN_BITS,
    label_name_ok,
)
from metricvault.wire.proto import messages

_METRIC_NAME_ANCHORED = f"^{METRIC_NAME.pattern}$"  # for Arrow's RE2, over a whole column
# The long shape has a cell per (row, label name): bound it against requests that combine many
# series with many distinct label names (a few MB of protobuf could otherwise ask for GBs).
MAX_LABEL_CELLS = 1 << 25
LABEL_CACHE_MAX = 1 << 17


class LabelPairCache:
    """What the bytes of one 1.0 Label mean, as an id into ``names``/``values`` (value None
    when empty). Series repeat every scrape and label pairs repeat across series, so most labels
    cost one dict lookup instead of a protobuf parse and two Python strings. Bounded: emptied
    when it holds ``max_pairs`` pairs (about 270 bytes each, so ~35 MB at the default; a cluster
    whose distinct label pairs outnumber it still decodes right, only slower). Guarded by a
    lock: decoders on several threads share one safely. It only holds facts about bytes: it
    never changes a result. Every decoder shares :data:`LABEL_CACHE` unless given its own
    (``decode_remote_write(..., label_cache=)``), as tests do to start cold and evict often.
    """

    def __init__(self, max_pairs: int = LABEL_CACHE_MAX) -> None:
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be at least 1, not {max_pairs}")
        self.max_pairs = max_pairs
        self.ids: dict[bytes, int] = {}
        self.names: list[str] = []
        self.values: list[str | None] = []
        self.lock = threading.Lock()
        self.evictions = 0  # how often it was emptied for being full

    def __len__(self) -> int:
        return len(self.names)

    def clear(self) -> None:
        self.ids.clear()
        self.names.clear()
        self.values.clear()


LABEL_CACHE = LabelPairCache()
BUDGET_EVERY = 4096  # labels parsed between two looks at the decode time budget


@dataclass(frozen=True)
class ResolvedSamples:
    """What the store would work out again from the table: each row's series id, and the
    request's distinct series as (series_id, metric, labels_json, kind), the kind from the
    name alone. ``build_table`` makes the long shape itself, only when someone asks for it."""

    series_ids: Any  # int64 per row
    timestamps: Any  # int64 per row
    values: Any  # float64 per row
    series: list[tuple[int, str, str, str]]
    build_table: Callable[[], pa.Table]


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
    stale_markers: int  # of ``samples``: staleness markers (stored as markers)
    non_finite: int  # of ``samples``: other NaN/±Inf values (stored as values)
    series: int = 0  # time series in the request (also those whose samples were all dropped)
    resolved: ResolvedSamples | None = None  # only on a KnownDecodedWrite

    def prepared(self) -> ResolvedSamples | None:
        """The resolved samples, if ``table`` is still the one they describe (not replaced,
        e.g. by a filter); None otherwise, and the table must be normalized again."""
        return None


class _TableOnDemand:
    """``KnownDecodedWrite.table``: the table given, or else built from the resolved samples
    on first use (the store does not need it, so most requests never build it)."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        table = obj.__dict__.get("table")
        if table is None:
            table = obj.__dict__["table"] = obj.resolved.build_table()
        return table

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["table"] = value
        obj.__dict__["_given"] = value is not None


class KnownDecodedWrite(DecodedWrite):
    """A request decoded through the series cache (``remote_write_known``); built with
    ``table=None``. ``dataclasses.replace`` gives it a table, and then ``prepared`` is None."""

    table = _TableOnDemand()

    def prepared(self) -> ResolvedSamples | None:
        return None if self.__dict__.get("_given") else self.resolved


@dataclass(frozen=True)
class Limits:
    max_series: int | None
    max_label_names: int | None
    budget: DecodeBudget
    max_label_cells: int = MAX_LABEL_CELLS  # rows x label names of the long shape
    label_cache: LabelPairCache = LABEL_CACHE
    # a reserved ('__'-prefixed) label name the gateway takes off before storing (the HA
    # replica label, ``__replica__`` by default), so it is let through here
    internal_label: str = ""
    known_series: bool = True  # try the series cache first (remote_write_known)

    def check_flat(self, flat: Flat) -> None:
        """Before the long shape is built: its cost is rows x label names."""
        names = [name for name in flat.names if name != "__name__"]
        check_label_names(len(names), self.max_label_names, ", ".join(map(show, names[:3])))
        self.budget.check(f"reading {len(flat.label_counts):,} series")


def special_value_counts(values: Any) -> tuple[int, int]:
    """(staleness markers, other non-finite values) among float64 ``values``: a decoded
    write's counts, whichever protocol decoded it."""
    stale = int(np.count_nonzero(values.view(np.uint64) == STALE_NAN_BITS))
    return stale, len(values) - int(np.count_nonzero(np.isfinite(values))) - stale


def label_pairs(
    raw_labels: Any, budget: DecodeBudget, cache: LabelPairCache = LABEL_CACHE
) -> tuple[Any, list[str], list[str | None]]:
    """(pair index per label, name per distinct pair, value per distinct pair) for 1.0 labels.

    ``_Invalid`` if a label is not a valid protobuf ``Label``.
    """
    with cache.lock:
        known = cache.ids
        try:
            ids = [known[raw_label] for raw_label in raw_labels]
        except KeyError:
            ids = _learn_labels(raw_labels, budget, cache)
        pair_of_label = np.fromiter(ids, dtype=np.int64, count=len(ids))
        seen = np.zeros(len(cache.names), dtype=np.bool_)
        seen[pair_of_label] = True
        distinct = np.flatnonzero(seen)
        pair_names, pair_values = cache.names, cache.values
        names = [pair_names[pair] for pair in distinct.tolist()]
        values = [pair_values[pair] for pair in distinct.tolist()]
    index_of = np.empty(len(seen), dtype=np.int64)
    index_of[distinct] = np.arange(len(distinct))
    return index_of[pair_of_label], names, values


def _learn_labels(raw_labels: Any, budget: DecodeBudget, cache: LabelPairCache) -> list[int]:
    """Ids for labels, parsing those not seen yet; the cache is emptied when full."""
    known, names, values = cache.ids, cache.names, cache.values
    for may_evict in (True, False):
        ids: list[int] = []
        for raw_label in raw_labels:
            pair = known.get(raw_label)
            if pair is None:
                if not len(names) % BUDGET_EVERY:
                    budget.check(f"{len(ids):,} of {len(raw_labels):,} labels")
                if may_evict and len(names) >= cache.max_pairs:
                    cache.clear()
                    cache.evictions += 1
                    break  # ids taken so far are gone: start this request again
                try:
                    label = messages.Label.FromString(raw_label)
                except messages.DecodeError as exc:
                    raise _Invalid from exc
                pair = known[raw_label] = len(names)
                names.append(sys.intern(label.name))
                values.append(label.value or None)
            ids.append(pair)
        else:
            return ids
    raise AssertionError("unreachable: the second pass never evicts")  # pragma: no cover


def decode_samples(raw_samples: list[bytes]) -> tuple[Any, Any]:
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
    return decoded if decoded is not None else decode_samples_slowly(raw_samples)


# Remote-write samples, read 8 bytes at a time: a double, or a varint of up to 8 bytes (every
# timestamp from 1970 to year 4253 in ms), as one unaligned little-endian uint64 per sample.
_BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
_CONTINUED = np.array(
    [0x8080808080808080 & ((1 << (8 * n - 8)) - 1) if n else 0 for n in range(9)], dtype=np.uint64
)
_PAIRS = (
    (0x007F007F007F007F, 0x7F007F007F007F00, 1),
    (0x00003FFF00003FFF, 0x3FFF00003FFF0000, 2),
    (0x000000000FFFFFFF, 0x0FFFFFFF00000000, 4),
)
_PAIRS_U64 = [(np.uint64(lo), np.uint64(hi), np.uint64(s)) for lo, hi, s in _PAIRS]
_HIGH_BITS = np.uint64(0x8080808080808080)


def _words(buffer: Any, dtype: str) -> Any:
    """``buffer`` as overlapping 8-byte words, one starting at each byte (a view)."""
    return np.ndarray((max(len(buffer) - 7, 0),), dtype=dtype, buffer=buffer, strides=(1,))


def _decode_canonical_samples(buffer: Any, starts: Any, lengths: Any) -> tuple[Any, Any] | None:
    """Values and timestamps of the samples at ``starts`` (``lengths`` bytes each) in
    ``buffer`` (uint8, with at least 8 bytes of padding after the last sample), or None if a
    sample is not in one of the four usual shapes."""
    has_value = (lengths >= 9) & (buffer[starts] == 0x09)
    ts_tag_at = starts + 9 * has_value
    has_ts = (lengths > 9 * has_value) & (buffer[ts_tag_at] == 0x10)
    varint_len = np.where(has_ts, lengths - (ts_tag_at - starts) - 1, 0)
    shapes_ok = (lengths == 0) | (has_value & (lengths == 9)) | (has_ts & (varint_len >= 1))
    widest = int(varint_len.max())
    if not shapes_ok.all() or widest > 10:
        return None
    last = len(buffer) - 8
    values = np.where(has_value, _words(buffer, "<f8")[np.minimum(starts + 1, last)], 0.0)
    if widest > 8:
        timestamps = _long_varints(buffer, ts_tag_at, varint_len, widest)
        return None if timestamps is None else (values, timestamps)
    words = _words(buffer, "<u8")[np.minimum(ts_tag_at + 1, last)]
    if ((words & _HIGH_BITS & _BYTE_MASKS[varint_len]) != _CONTINUED[varint_len]).any():
        return None  # not a well-formed varint of exactly the remaining bytes
    bits = words & _BYTE_MASKS[varint_len] & np.uint64(0x7F7F7F7F7F7F7F7F)
    for low, high, shift in _PAIRS_U64:  # 8 x 7 bits -> 4 x 14 -> 2 x 28 -> 56
        bits = (bits & low) | ((bits & high) >> shift)
    return values, bits.view(np.int64)


def _long_varints(buffer: Any, ts_tag_at: Any, varint_len: Any, widest: int) -> Any:
    timestamps = np.zeros(len(ts_tag_at), dtype=np.uint64)
    for k in range(widest):
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
    return timestamps.view(np.int64)


def decode_samples_slowly(raw_samples: list[bytes]) -> tuple[Any, Any]:
    try:
        samples = [messages.Sample.FromString(raw) for raw in raw_samples]
    except messages.DecodeError as exc:
        raise _Invalid from exc
    values = np.array([sample.value for sample in samples], dtype=np.float64)
    timestamps = np.array([sample.timestamp for sample in samples], dtype=np.int64)
    return values, timestamps


@dataclass
class Flat:
    """One request's labels and samples as flat arrays, series after series."""

    label_counts: Any  # int64 per series
    codes: Any  # per label: its name, as an index into ``names``
    names: list[str]  # distinct label names, not yet checked
    values: Any  # pa.StringArray per label; null where the value is empty
    sample_counts: Any  # int64 per series
    sample_values: Any  # float64 per sample
    sample_timestamps: Any  # int64 per sample


@dataclass
class Shape:
    table: pa.Table
    metrics: Any  # pa.StringArray, one per series
    samples: int
    stale: int
    non_finite: int


def assemble(flat: Flat, max_label_cells: int = MAX_LABEL_CELLS, internal_label: str = "") -> Shape:
    """The long-shape table, or ``_Invalid`` if any series breaks a rule."""
    n_series = len(flat.label_counts)
    series_of_label = np.repeat(np.arange(n_series), flat.label_counts)
    metrics = _check_flat_labels(flat, series_of_label, internal_label)
    values, timestamps = flat.sample_values, flat.sample_timestamps
    stale, non_finite = special_value_counts(values)
    rows = np.repeat(np.arange(n_series), flat.sample_counts)  # series of each row
    # every float sample is kept, staleness markers and NaN/±Inf bit-exact
    columns = {
        "metric": metrics.take(pa.array(rows)),
        "timestamp": pa.array(timestamps, type=pa.int64()),
        "value": pa.array(values, type=pa.float64()),
    }
    columns.update(_label_columns(flat, series_of_label, rows, max_label_cells))
    return Shape(pa.table(columns), metrics, len(values), stale, non_finite)


def _check_flat_labels(flat: Flat, series_of_label: Any, internal_label: str = "") -> Any:
    """Check names, order and metric names for all series at once; the metric per series."""
    n_series = len(flat.label_counts)
    if not n_series:
        return pa.array([], type=pa.string())
    if (
        not all(_label_name_ok(name) or name == (internal_label or None) for name in flat.names)
        or "__name__" not in flat.names
    ):
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


def _label_columns(
    flat: Flat, series_of_label: Any, rows: Any, max_label_cells: int
) -> dict[str, Any]:
    """One string column per label name (sorted), null where a row's series lacks it."""
    label_codes = [code for code in np.argsort(flat.names) if flat.names[code] != "__name__"]
    if not label_codes or not len(rows):
        return {}
    if len(flat.names) * max(len(rows), len(flat.label_counts)) > max_label_cells:
        raise TooLargeError(
            f"the request's {len(flat.label_counts):,} series use {len(flat.names):,} distinct "
            f"label names: a table of {len(rows):,} rows would need "
            f"{len(flat.names) * len(rows):,} label cells, over the limit of "
            f"{max_label_cells:,}; send fewer series per request"
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


def result(
    shape: Shape,
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
