"""The read seam (:class:`metricvault.protocols.SampleSource`) over a store's
:class:`~metricvault.protocols.SampleReader`, written once for every backend: raw samples
as typed series, rollup rows as a :class:`~metricvault.protocols.BucketSelection`, and the
samples remote_read can still return where retention dropped raw data."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.protocols import (
    ALL_BUCKET_COLUMNS,
    BucketSelection,
    SampleReader,
    SelectHints,
    SeriesBuckets,
    SeriesSamples,
)
from metricvault.selector import Matcher, Selector
from metricvault.store.query import BucketChoice, Buckets
from metricvault.store.reading import select_series

MINUTE_MS = 60_000


MAX_PICKED_TIMES = 1_000_000  # evaluation times above which every sample is read


def select_samples(
    reader: SampleReader,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    hints: SelectHints | None = None,
) -> list[SeriesSamples]:
    """The samples in ``[start_ms, end_ms]`` (closed) of the series ``matchers`` select.
    For an instant selector (``hints``: no function, no range) only those it can take: per
    series, the newest sample at or before each evaluation time (:func:`instant_times`)."""
    if end_ms < start_ms:
        return []
    at = instant_times(hints, start_ms, end_ms)
    # The reader's range is half-open [start, end): ask for end + 1 to include end_ms.
    found = select_series(reader, Selector(tuple(matchers)), start_ms, end_ms + 1, True, at)
    return [SeriesSamples(labels, ts, values) for labels, ts, values in found]


def instant_times(hints: SelectHints | None, start_ms: int, end_ms: int) -> np.ndarray | None:
    """The evaluation times of an instant selector (``hints.func`` None, ``range_ms`` 0),
    within ``[start_ms, end_ms]``, or None: any other selection reads every sample. The
    engine evaluates such a selector at each time ``t`` from the newest sample at or before
    ``t`` (if within its lookback, and not a staleness marker), so those samples alone give
    the same answer, however long the lookback, staleness markers and NaN included."""
    if hints is None or hints.func is not None or hints.range_ms != 0:
        return None
    if hints.step_ms <= 0:  # one time, or every time pinned with ``@``
        times = np.asarray([hints.end_ms], np.int64)
    else:
        count = (hints.end_ms - hints.start_ms) // hints.step_ms + 1
        if count > MAX_PICKED_TIMES or hints.end_ms < hints.start_ms:
            return None
        times = hints.start_ms + hints.step_ms * np.arange(count, dtype=np.int64)
    return times[(times >= start_ms) & (times <= end_ms)]


def to_selection(
    buckets: Buckets, choice: BucketChoice, columns: Sequence[str] = ALL_BUCKET_COLUMNS
) -> BucketSelection:
    """The store's :class:`~metricvault.store.query.Buckets` as the seam's typed rows, with
    ``columns`` (of :data:`BUCKET_COLUMNS` and ``m2``: what the function reads,
    ``protocols.bucket_columns``) and the sketches."""
    table = buckets.table
    out: list[SeriesBuckets] = []
    cols: dict[str, np.ndarray] | None = None
    if table.num_rows:
        sid = table["series_id"].to_numpy()
        cols = {}
        for name in columns:
            if name in ("ts", "count", "nonfinite"):
                cols[name] = _ints(table[name], 0)
            elif name in ("first_ts", "last_ts"):
                cols[name] = _ints(table[name], -1)
            else:  # m2 too (promql/tiers.py reads it past the raw horizon): NaN where none
                cols[name] = _floats(table[name])
        sketches = _sketch_parts(table)
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        ends = np.r_[starts[1:], sid.size]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            series_id = int(sid[a])
            rows = {name: values[a:b] for name, values in cols.items()}
            rows.update(sketches(a, b))
            out.append(
                SeriesBuckets(
                    buckets.labels[series_id], series_id in buckets.counters, rows, (a, b)
                )
            )
    return BucketSelection(
        out,
        buckets.raw_horizon_ms,
        buckets.counter_lookback_ms,
        tuple(buckets.tiers),
        choice.res,
        choice.shifted,
        choice.range_ms,
        cols,
    )


def _ints(column: pa.ChunkedArray, missing: int) -> np.ndarray:
    """An integer column as numpy, ``missing`` for its nulls (without a copy where it has
    none and is one chunk: the arrays are read, never written)."""
    if column.null_count:
        column = column.fill_null(missing)
    return np.asarray(column.to_numpy())


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    """A float column as float64 numpy, NaN for its nulls (no copy where it already is)."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def _sketch_parts(table: pa.Table) -> Callable[[int, int], dict[str, np.ndarray]]:
    """Rows ``a:b``'s sketch arrays: row ``i``'s sketch is
    ``sketch_codes[sketch_start[i]:sketch_end[i]]`` (with ``sketch_counts``), none where
    ``sketch_held[i]`` is False. Rows read without sketches (lean reads, all null) skip
    Arrow's list kernels and share read-only zeros (no per-row array is filled: a query of
    a million rows would otherwise fill and fault in tens of megabytes it never reads)."""
    keys = table["sketch_keys"]
    rows = len(keys)
    if keys.null_count == rows:
        zeros, unheld, none = np.zeros(rows, np.int64), np.zeros(rows, bool), np.zeros(0, np.int64)
        for array in (zeros, unheld, none):
            array.flags.writeable = False
        return lambda a, b: {
            "sketch_start": zeros[a:b], "sketch_end": zeros[a:b], "sketch_held": unheld[a:b],
            "sketch_codes": none, "sketch_counts": none,
        }  # fmt: skip
    keys = keys.combine_chunks()
    flat_codes = np.asarray(pc.list_flatten(keys).to_numpy(), dtype=np.int64)
    flat_counts = np.asarray(
        pc.list_flatten(table["sketch_counts"].combine_chunks()).to_numpy(), dtype=np.int64
    )
    lengths = np.asarray(pc.list_value_length(keys).fill_null(-1).to_numpy(), np.int64)
    offsets = np.r_[0, np.cumsum(np.maximum(lengths, 0))]

    def part(a: int, b: int) -> dict[str, np.ndarray]:
        lo, hi = int(offsets[a]), int(offsets[b])
        return {
            "sketch_start": offsets[a:b] - lo, "sketch_end": offsets[a + 1 : b + 1] - lo,
            "sketch_held": lengths[a:b] >= 0,
            "sketch_codes": flat_codes[lo:hi], "sketch_counts": flat_counts[lo:hi],
        }  # fmt: skip

    return part


def edge_samples(selection: BucketSelection, start_ms: int, end_ms: int) -> list[SeriesSamples]:
    """Each bucket's first and last sample, at their own times in ``[start_ms, end_ms]``:
    real samples, a subset of the raw ones (two per minute from 1m rows)."""
    out = []
    for s in selection.series:
        c = s.columns
        held = (c["count"] > 0) & (c["first_ts"] >= 0)  # old rows keep no sample times
        ts = np.concatenate([c["first_ts"][held], c["last_ts"][held]])
        values = np.concatenate([c["first"][held], c["last"][held]])
        ts, first = np.unique(ts, return_index=True)  # a one-sample bucket: once
        keep = (ts >= start_ms) & (ts <= end_ms)
        if keep.any():
            out.append(SeriesSamples(dict(s.labels), ts[keep], values[first][keep]))
    return out


def kept_samples(
    select: Callable[[int, int], list[SeriesSamples]],
    minute_buckets: Callable[[int, int], BucketSelection],
    horizon_ms: int,
    start_ms: int,
    end_ms: int,
) -> list[SeriesSamples]:
    """Raw samples from ``select(start, end)``; before ``horizon_ms`` each minute's first and
    last sample from ``minute_buckets(start, end)`` (half-open, whole minutes), sorted by
    label set."""
    if not horizon_ms or start_ms >= horizon_ms:
        return select(start_ms, end_ms)
    old_end = min(end_ms, horizon_ms - 1)
    found = minute_buckets(
        start_ms // MINUTE_MS * MINUTE_MS, old_end // MINUTE_MS * MINUTE_MS + MINUTE_MS
    )
    merged = {_key(s): s for s in edge_samples(found, start_ms, old_end)}
    if end_ms >= horizon_ms:
        for s in select(horizon_ms, end_ms):
            old = merged.get(_key(s))
            merged[_key(s)] = (
                s
                if old is None
                else SeriesSamples(
                    s.labels, np.concatenate([old.ts, s.ts]), np.concatenate([old.values, s.values])
                )
            )
    return [merged[key] for key in sorted(merged)]


def _key(s: SeriesSamples) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(s.labels.items()))
