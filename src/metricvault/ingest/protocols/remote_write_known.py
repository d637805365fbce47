"""Remote-write 1.0's fast path for series seen before: one dict lookup per series.

A gateway receives the same series in every request (Prometheus sends each scrape's samples,
time-major, so a request of 2,000 samples holds ~1,000 series with one or two samples each):
decoding each label of each series again, then joining them into a key per row to find the
series, was most of the ingest time. Here the request is parsed (in C) into one ``bytes`` per
series; a series' labels are the first fields of those bytes, found for all series at once
with numpy, and those label bytes are the key of a process-wide cache that maps them to the
series (id, metric, labels, kind), validated and hashed once, the first time they are seen.
The samples after the labels are located and decoded with numpy too.

The result is the same :class:`DecodedWrite` as the general path's (the same table, row for
row) plus :class:`ResolvedSamples`, which lets the store skip finding the series again.
Anything unusual returns ``None`` and the general path decides, with its errors: a label seen
for the first time that breaks a rule, metadata, exemplars or histograms, fields out of the
usual order, more than :data:`MAX_SAMPLES_PER_SERIES` samples in a series (few series: the
general path is quick for those), varints longer than usual.
"""

from __future__ import annotations

import threading
from functools import partial
from operator import itemgetter
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from metricvault import compiled
from metricvault.errors import MetricVaultError, TooLargeError
from metricvault.ingest.protocols.decode_limits import check_label_names
from metricvault.ingest.protocols.remote_write_checks import (
    check_series,
    check_series_count,
    show,
)
from metricvault.ingest.protocols.remote_write_checks import describe as describe_series
from metricvault.ingest.protocols.remote_write_columns import (
    DecodedWrite,
    KnownDecodedWrite,
    Limits,
    ResolvedSamples,
    _decode_canonical_samples,
    special_value_counts,
)
from metricvault.model import (
    KINDS,
    DistinctSeriesRows,
    Series,
    SeriesRows,
    kind_from_name,
    series_key_block,
)
from metricvault.wire.proto import messages

MAX_SAMPLES_PER_SERIES = 64  # numpy steps over the samples: one per sample of a series
MAX_LABELS_PER_SERIES = 256
SERIES_CACHE_MAX = 1 << 18  # ~1 KB each: emptied when full (a bigger cluster only decodes slower)
_LABEL_TAG = 0x0A  # TimeSeries.labels: field 1, length-delimited
_SAMPLE_TAG = 0x12  # TimeSeries.samples: field 2, length-delimited
_PADDING = bytes(24)  # after the series: fixed-width reads past a series' end stay inside


class KnownSeries:
    """What one series' label bytes mean: (series_id, metric, labels_json, kind), the labels."""

    __slots__ = ("kind", "labels", "labels_json", "metric", "names", "row", "series_id")

    def __init__(self, series: Series, kind: str, names: frozenset[str]) -> None:
        self.series_id = series.series_id
        self.metric = series.metric
        self.labels_json = series.labels_json
        self.kind = kind
        self.labels = dict(series.labels)
        self.names = names  # shared by all series with these label names
        self.row = (self.series_id, self.metric, self.labels_json, self.kind)


class _Generation:
    """The entries a cache learned since it was last emptied, each by its index here: the
    label bytes map to that index, and the per-entry facts a request needs for all its series
    at once are numpy arrays (series id, label-name set). Emptying the cache starts a new
    generation and leaves this one as it is, for requests still reading it."""

    def __init__(self, max_series: int) -> None:
        self.known: dict[bytes, int] = {}
        self.entries: list[KnownSeries] = []
        self.rows: list[tuple[int, str, str, str]] = []
        self.series_ids = np.zeros(64, dtype=np.int64)
        self.name_set_of = np.zeros(64, dtype=np.int64)
        self.name_sets: list[frozenset[str]] = []
        self.name_set_index: dict[frozenset[str], int] = {}
        self.first_token = series_key_block(max_series)  # its entries' SeriesRows keys
        self.ids: set[int] = set()
        self.distinct_ids = True  # no two entries share a series id (only ever turns False)
        self.table: Any = None  # the compiled path's KeyTable, made by its first decode

    def add(self, key: bytes, entry: KnownSeries) -> int:
        at = len(self.entries)
        if at == len(self.series_ids):  # grown by copying: readers keep the old array
            self.series_ids = np.concatenate((self.series_ids, np.zeros(at, np.int64)))
            self.name_set_of = np.concatenate((self.name_set_of, np.zeros(at, np.int64)))
        name_set = self.name_set_index.setdefault(entry.names, len(self.name_sets))
        if name_set == len(self.name_sets):
            self.name_sets.append(entry.names)
        self.series_ids[at] = entry.series_id
        if entry.series_id in self.ids:  # the same labels in other bytes, or a collision
            self.distinct_ids = False
        self.ids.add(entry.series_id)
        self.name_set_of[at] = name_set
        self.entries.append(entry)
        self.rows.append(entry.row)
        self._add_to_table(key, at)
        self.known[key] = at  # last: a reader that finds the key finds the facts
        return at

    def _add_to_table(self, key: bytes, at: int) -> None:
        if self.table is not None:  # else made with every entry by the first compiled decode
            self.table.add(key, at)

    def make_table(self, compiled: ModuleType) -> None:
        """The compiled path's table of every entry so far (under the cache's lock)."""
        if self.table is None:
            table = compiled.KeyTable()
            for key, index in self.known.items():  # in the order they were added
                table.add(key, index)
            self.table = table


class SeriesKeyCache:
    """Label bytes -> :class:`KnownSeries`, shared by the decoders of a process (lock-guarded).
    It only holds facts about bytes, so it never changes a result, only the speed."""

    def __init__(self, max_series: int = SERIES_CACHE_MAX) -> None:
        self.max_series = max_series
        self.generation = _Generation(max_series)
        self.lock = threading.Lock()

    @property
    def known(self) -> dict[bytes, int]:
        return self.generation.known

    def learn(self, key: bytes, generation: _Generation) -> int | None:
        """Parse, check and hash a series' labels into ``generation``; its index there, or
        None if they break a rule or the cache was emptied meanwhile (a new generation)."""
        try:
            parsed = messages.TimeSeries.FromString(key)
        except messages.DecodeError:
            return None
        names = [label.name for label in parsed.labels]
        values = [label.value or None for label in parsed.labels]
        try:
            check_series(names, values, partial(describe_series, 0, names, values))
            metric = str(values[names.index("__name__")])
            labels = {n: v for n, v in zip(names, values, strict=True) if v and n != "__name__"}
            kind = kind_from_name(metric)
            if kind not in KINDS:
                return None
            series = Series.make(metric, labels)
        except (MetricVaultError, ValueError):
            return None
        with self.lock:
            if generation is not self.generation:
                return None
            if len(generation.entries) >= self.max_series:
                self.generation = _Generation(self.max_series)
                return None  # this request's other indexes belong to the old generation
            found = generation.known.get(key)
            if found is not None:  # another thread learned it meanwhile
                return found
            return generation.add(key, KnownSeries(series, kind, frozenset(labels)))


SERIES_KEYS = SeriesKeyCache()


USE_COMPILED = True  # False: numpy's path alone (tests run both)
_MODULE = "metricvault.ingest.protocols.remote_write_compiled"


def compiled_walk() -> ModuleType | None:
    """The compiled decoder if a server has loaded it (:func:`start_compiling`), else None:
    numpy's path. Decoding never starts the loading itself: a library user's process gets no
    compiler thread it did not ask for."""
    return compiled.ready(_MODULE) if USE_COMPILED else None


def start_compiling(wait: bool = False) -> bool:
    """Start loading the compiled decoder on a thread (a gateway worker at start; ``wait``:
    block until it is loaded or has failed); True once it is ready."""
    return compiled.start(_MODULE, wait) is not None


def decode_v1_known(
    raw: memoryview, limits: Limits, cache: SeriesKeyCache = SERIES_KEYS
) -> DecodedWrite | None:
    """The request decoded through the series cache, or None for the general path."""
    walk = compiled_walk()
    if walk is not None:
        taken, decoded = _decode_compiled(walk, raw, limits, cache)
        if taken:
            return decoded
    return _decode_numpy(raw, limits, cache)


def _decode_compiled(
    compiled: ModuleType, raw: memoryview, limits: Limits, cache: SeriesKeyCache
) -> tuple[bool, DecodedWrite | None]:
    """(True, the answer) from the compiled path, or (False, None): the numpy path decides."""
    generation = cache.generation  # one generation for the whole request
    if generation.table is None:
        with cache.lock:
            generation.make_table(compiled)
    decoded = compiled.decode(raw, generation.table, MAX_SAMPLES_PER_SERIES)
    if decoded is None:
        return False, None
    starts, ends, counts, values, timestamps, found = decoded
    check_series_count(len(starts), limits.max_series)
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    for i in np.flatnonzero(found < 0).tolist():
        at = cache.learn(bytes(raw[starts[i] : ends[i]]), generation)
        if at is None:
            return True, None  # the general path names the rule it breaks
        found[i] = at
    return True, _result(generation, found, counts, values, timestamps, limits)


def _decode_numpy(raw: memoryview, limits: Limits, cache: SeriesKeyCache) -> DecodedWrite | None:
    request = messages.WriteRequestSeries()
    try:
        request.ParseFromString(raw)
    except messages.DecodeError:
        return None
    if request.metadata or not len(request.timeseries):
        return None
    series_bytes = list(request.timeseries)
    count = len(series_bytes)
    check_series_count(count, limits.max_series)
    lengths = np.fromiter(map(len, series_bytes), dtype=np.int64, count=count)
    series_bytes.append(_PADDING)  # read past the last series' end without another copy
    joined = b"".join(series_bytes)
    buffer = np.frombuffer(joined, dtype=np.uint8)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    label_ends = _skip_labels(buffer, starts, ends)
    if label_ends is None:
        return None
    located = _locate_samples(buffer, label_ends, ends)
    if located is None:
        return None
    sample_starts, sample_lengths, sample_counts = located
    decoded = _decode_canonical_samples(buffer, sample_starts, sample_lengths)
    if decoded is None:
        return None
    values, timestamps = decoded
    limits.budget.check(f"parsing {len(raw):,} bytes of protobuf")
    found = _known(cache, joined, starts.tolist(), label_ends.tolist())
    if found is None:
        return None
    return _result(*found, sample_counts, values, timestamps, limits)


def _skip_labels(buffer: Any, starts: Any, ends: Any) -> Any:
    """Where each series' labels end (its first field that is not a label), or None.

    One step per label position, over every series at once; labels under 128 bytes (a
    one-byte length) are the usual case, any longer one sends the request to
    :func:`_skip_long_labels`."""
    pos = starts.copy()
    last = len(buffer) - 4
    for _ in range(MAX_LABELS_PER_SERIES):
        here = np.minimum(pos, last)
        active = (buffer[here] == _LABEL_TAG) & (pos < ends)
        if not active.any():
            return None if (pos > ends).any() else pos
        size = buffer[here + 1].astype(np.int64)
        if (size[active] >= 0x80).any():
            return _skip_long_labels(buffer, starts, ends)
        pos += np.where(active, size + 2, 0)
    return None


def _skip_long_labels(buffer: Any, starts: Any, ends: Any) -> Any:
    """:func:`_skip_labels` for labels of up to 16 KB (a two-byte length)."""
    pos = starts.copy()
    last = len(buffer) - 4
    active = (pos < ends) & (buffer[np.minimum(pos, last)] == _LABEL_TAG)
    for _ in range(MAX_LABELS_PER_SERIES):
        at = np.flatnonzero(active)
        if not at.size:
            break
        here = pos[at]
        first = buffer[here + 1].astype(np.int64)
        second = buffer[here + 2].astype(np.int64)
        short = first < 0x80
        if not (short | (second < 0x80)).all():
            return None  # a label over 16 KB: the general path
        size = np.where(short, first, (first & 0x7F) | (second << 7))
        pos[at] = here + np.where(short, 2, 3) + size
        active[at] = (pos[at] < ends[at]) & (buffer[np.minimum(pos[at], last)] == _LABEL_TAG)
    else:
        return None
    if (pos > ends).any():
        return None
    return pos


def _locate_samples(buffer: Any, begins: Any, ends: Any) -> tuple[Any, Any, Any] | None:
    """(start, length) of every Sample message, series after series, and the count per series,
    if everything after each series' labels is samples; else None."""
    pos = begins.copy()
    count = np.zeros(len(pos), dtype=np.int64)
    found_series, found_starts, found_lengths, found_steps = [], [], [], []
    active = np.flatnonzero(pos < ends)
    step = 0
    while active.size:
        if step == MAX_SAMPLES_PER_SERIES:
            return None
        here = pos[active]
        size = buffer[here + 1].astype(np.int64)
        if (buffer[here] != _SAMPLE_TAG).any() or (size >= 0x80).any():
            return None  # another field (exemplar, histogram, a late label) or a long sample
        found_series.append(active)
        found_starts.append(here + 2)
        found_lengths.append(size)
        found_steps.append(np.full(active.size, step, dtype=np.int64))
        pos[active] = here + 2 + size
        count[active] += 1
        active = active[pos[active] < ends[active]]
        step += 1
    if (pos != ends).any():
        return None
    if not count.all():
        return None  # a series without samples: the general path leaves its labels out
    total = int(count.sum())
    series = np.concatenate(found_series)
    at = (np.cumsum(count) - count)[series] + np.concatenate(found_steps)  # series-major order
    sample_starts = np.empty(total, dtype=np.int64)
    sample_lengths = np.empty(total, dtype=np.int64)
    sample_starts[at] = np.concatenate(found_starts)
    sample_lengths[at] = np.concatenate(found_lengths)
    return sample_starts, sample_lengths, count


def _known(
    cache: SeriesKeyCache, joined: bytes, starts: list[int], label_ends: list[int]
) -> tuple[_Generation, Any] | None:
    """Each series' index in the cache's current generation (learning those seen for the
    first time), or None: a series breaks a rule, or the cache was emptied meanwhile."""
    generation = cache.generation  # one generation for the whole request
    get = generation.known.get
    found = [get(joined[start:end]) for start, end in zip(starts, label_ends, strict=True)]
    if None in found:
        for i, at in enumerate(found):
            if at is None:
                at = found[i] = cache.learn(joined[starts[i] : label_ends[i]], generation)
                if at is None:
                    return None  # the general path names the rule it breaks
    return generation, np.array(found, dtype=np.int64)


def _result(
    generation: _Generation,
    found: Any,
    counts: Any,
    values: Any,
    timestamps: Any,
    limits: Limits,
) -> DecodedWrite:
    ordered = np.sort(found)
    distinct = ordered[np.r_[True, ordered[1:] != ordered[:-1]]]  # one per label bytes
    name_sets = set(generation.name_set_of[distinct].tolist())
    names: set[str] = set().union(*(generation.name_sets[i] for i in name_sets))
    if limits.max_label_names is not None and len(names) > limits.max_label_names:
        check_label_names(len(names), limits.max_label_names, _shown(names))
    series_ids = np.repeat(generation.series_ids[found], counts)
    _check_cells(len(found), len(series_ids), len(names) + 1, limits.max_label_cells)
    stale, non_finite = special_value_counts(values)
    rows = generation.rows
    # read after ``found``: every entry found was added before, so if no two ids in the
    # generation were equal then, these rows' ids are distinct
    rows_type = DistinctSeriesRows if generation.distinct_ids else SeriesRows
    series = rows_type(_rows(rows, distinct.tolist()))
    series.keys = distinct + generation.first_token
    build = partial(_table, generation, found, counts, names, timestamps, values)
    return KnownDecodedWrite(
        table=None,
        kinds={},
        metadata=(),
        version="1.0",
        samples=len(values),
        histograms=0,
        exemplars=0,
        stale_markers=stale,
        non_finite=non_finite,
        series=len(found),
        resolved=ResolvedSamples(series_ids, timestamps, values, series, build),
    )


def _shown(names: set[str]) -> str:
    return ", ".join(map(show, sorted(names)[:3]))


def _rows(rows: list[tuple[int, str, str, str]], at: list[int]) -> list[Any]:
    """``rows[i] for i in at``, in C (itemgetter) rather than a comprehension."""
    if len(at) == 1:
        return [rows[at[0]]]
    return list(itemgetter(*at)(rows)) if at else []


def _check_cells(series: int, rows: int, names: int, max_label_cells: int) -> None:
    """The general path's bound on the long shape (rows x label names), the same 413."""
    if names * max(rows, series) > max_label_cells:
        raise TooLargeError(
            f"the request's {series:,} series use {names:,} distinct label names: a table of "
            f"{rows:,} rows would need {names * rows:,} label cells, over the limit of "
            f"{max_label_cells:,}; send fewer series per request"
        )


def _table(
    generation: _Generation,
    found: Any,
    counts: Any,
    names: set[str],
    timestamps: Any,
    values: Any,
) -> pa.Table:
    """The long shape, as the general path builds it: metric, timestamp, value, then one
    string column per label name (sorted), null where a row's series lacks the label."""
    entries = [generation.entries[i] for i in found.tolist()]
    take = pa.array(np.repeat(np.arange(len(entries)), counts))
    columns: dict[str, Any] = {
        "metric": pa.array([e.metric for e in entries], pa.string()).take(take),
        "timestamp": pa.array(timestamps, type=pa.int64()),
        "value": pa.array(values, type=pa.float64()),
    }
    for name in sorted(names):
        per_series = pa.array([e.labels.get(name) for e in entries], pa.string())
        columns[name] = per_series.take(take)
    return pa.table(columns)
