"""The query layer, written once over :class:`~metricvault.protocols.SampleReader`: every
backend (embedded, InfluxDB, an opened snapshot) answers ``query()`` through :func:`answer`,
and refuses writes older than its horizon through :func:`check_horizon`, so the long shape,
the empty answers and the messages are the same on all of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.durations import TimeLike, ms_to_datetime, now_ms, parse_time_ms
from metricvault.errors import TimeRangeError, ValueRangeError
from metricvault.model import SAMPLE_SCHEMA, STALE_NAN_BITS
from metricvault.protocols import SampleReader
from metricvault.selector import Selector, SelectorUnion, parse_selectors
from metricvault.store import query as q
from metricvault.store.rollup import empty_partials, finite_rows


def run_query(
    selector: str,
    start: TimeLike,
    end: TimeLike,
    step: str | int | None,
    aggs: Sequence[str],
    output: str,
    reader_for: Callable[[SelectorUnion], SampleReader],
    stale_markers: bool = False,
) -> Any:
    """Parse and check the arguments of ``query()`` (before any I/O), then ask the reader
    that ``reader_for(selector)`` gives (it may refresh the series it knows first)."""
    sel = parse_selectors(selector)
    now = now_ms()
    t0, t1 = parse_time_ms(start, now=now), parse_time_ms(end, now=now)
    if t1 <= t0:
        raise TimeRangeError(f"start {start!r} is not before end {end!r}")
    step_ms = q.parse_step(step)
    agg_names = q.check_aggs(aggs) if step_ms is not None else ()
    return answer(reader_for(sel), sel, t0, t1, step_ms, agg_names, output, stale_markers)


def answer(
    reader: SampleReader,
    sel: SelectorUnion,
    t0: int,
    t1: int,
    step_ms: int | None,
    agg_names: Sequence[str],
    output: str,
    stale_markers: bool = False,
) -> Any:
    """Raw samples in ``[t0, t1)`` (``step_ms`` None) or per-step aggregates, long shape.

    Raw samples leave out Prometheus staleness markers (they end a series, they are not
    values) unless ``stale_markers`` is true, as the PromQL source asks; NaN and ±Inf samples
    are values and always shown. Aggregates count finite samples only (store/rollup.py)."""
    ids = reader.index.match(sel)
    if step_ms is None:
        samples = reader.raw_samples(ids, t0, t1) if ids else SAMPLE_SCHEMA.empty_table()
        if not stale_markers:
            samples = drop_stale_markers(samples)
        return q.shape(reader.index, samples, {"value": samples["value"]}, output)
    partials = (
        finite_rows(q.read_partials(reader, ids, t0, t1, step_ms, agg_names))
        if ids
        else empty_partials()
    )
    return q.shape(reader.index, partials, q.finish_aggregates(partials, agg_names), output)


def check_horizon(samples: pa.Table, bound: int, why: str) -> None:
    """ValueRangeError if a sample is older than ``bound`` (0: no bound); ``why`` says what
    dropped the data there and how to keep such samples."""
    if not bound or samples.num_rows == 0:
        return
    oldest = int(pc.min(samples["ts"]).as_py())
    if oldest < bound:
        raise ValueRangeError(
            f"sample at {ms_to_datetime(oldest):%Y-%m-%d %H:%M:%S} UTC is older than "
            f"{ms_to_datetime(bound):%Y-%m-%d %H:%M:%S} UTC: {why}"
        )


def stale_marker_mask(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """True where a float64 column holds the staleness marker's exact bit pattern."""
    column = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    as_float = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
    return np.asarray(as_float.view(np.uint64) == np.uint64(STALE_NAN_BITS))


def drop_stale_markers(samples: pa.Table) -> pa.Table:
    """``samples`` without the rows whose value is a staleness marker."""
    if samples.num_rows == 0 or pc.all(pc.is_finite(samples["value"])).as_py():
        return samples
    stale = stale_marker_mask(samples["value"])
    return samples.filter(pa.array(~stale)) if stale.any() else samples


SeriesArrays = tuple[dict[str, str], np.ndarray, np.ndarray]


def select_series(
    reader: SampleReader,
    sel: Selector | SelectorUnion,
    t0: int,
    t1: int,
    stale_markers: bool,
    at: np.ndarray | None = None,
) -> list[SeriesArrays]:
    """The raw samples in ``[t0, t1)`` of every series ``sel`` matches, one
    ``(labels, ts, values)`` per series: ``labels`` holds ``__name__`` and the series' labels
    (from the series index, once per series), ``ts`` int64 ms ascending, ``values`` float64
    with NaN and, if ``stale_markers``, the staleness markers bit for bit.

    The same samples, in the same series order (metric, then labels) as ``answer`` gives in
    the long shape, from the same ``raw_samples`` read (its dedup rules), without building a
    row per sample with label columns and splitting it back into series.

    ``at`` (ascending times in ``[t0, t1)``): only, per series, the newest sample at or
    before each of them, where the reader can pick those (``raw_samples_at``): an instant
    selector evaluated at those times answers the same from them as from all samples."""
    ids = reader.index.match(sel)
    if not ids:
        return []
    pick = getattr(reader, "raw_samples_at", None) if at is not None else None
    samples = reader.raw_samples(ids, t0, t1) if pick is None else pick(ids, t0, t1, at)
    if not stale_markers:
        samples = drop_stale_markers(samples)
    if samples.num_rows == 0:
        return []
    sid = _int64(samples["series_id"])
    ts = _int64(samples["ts"])
    values = np.asarray(samples["value"].to_numpy(), dtype=np.float64)
    order = _series_time_order(sid, ts)
    if order is None:  # already by series, then time: copies the engine may own
        ts, values = ts.copy(), values.copy()
    else:
        sid, ts, values = sid[order], ts[order], values[order]
    starts = np.flatnonzero(sid[1:] != sid[:-1]) + 1
    bounds = zip([0, *starts.tolist()], [*starts.tolist(), len(sid)], strict=True)
    out: list[tuple[str, SeriesArrays]] = []
    for lo, hi in bounds:
        info = reader.index.get(int(sid[lo]))
        labels = {"__name__": info.metric}
        labels.update((k, v) for k, v in sorted(info.labels.items()) if v)
        out.append((info.metric + "\x00" + info.labels_json, (labels, ts[lo:hi], values[lo:hi])))
    out.sort(key=lambda item: item[0])
    return [series for _, series in out]


def _int64(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _series_time_order(sid: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
    """None where rows are already ordered by series, then time (one data file); else the
    order that makes them so (several day files, each sorted by series)."""
    if len(sid) < 2:
        return None
    # compared, not np.diff: series ids are 64-bit hashes, whose differences overflow
    later, same = sid[1:] > sid[:-1], sid[1:] == sid[:-1]
    if bool(np.all(later | (same & (ts[1:] > ts[:-1])))):
        return None
    # Day files in time order: grouping by series keeps each one's samples in time order,
    # and a stable sort of sorted runs is 4x quicker than lexsort; else sort by both.
    order = np.argsort(sid, kind="stable")
    by_sid, by_ts = sid[order], ts[order]
    if bool(np.all((by_sid[1:] != by_sid[:-1]) | (by_ts[1:] > by_ts[:-1]))):
        return order
    return np.lexsort((ts, sid))
