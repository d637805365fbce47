"""Queries: tier planning, stitching across tiers, aggregation and the long output shape.

One planner for both engines: :func:`plan` covers a step query's range with tier segments,
and :func:`plan_buckets` chooses the bucket width a PromQL range function is answered from
(the read seam's ``select_buckets``; promql/tiers.py holds the arithmetic over the rows);
the buckets of that width are then read through :func:`plan` like any step query.

A query with a ``step`` is answered per (series, bucket); buckets are aligned to multiples of
the step since the Unix epoch (``step="all"``: one bucket spanning ``[start, end)``). The
planner covers the range with the coarsest tier whose resolution divides the step, where that
tier is complete (before the rollup watermark), and fills the unaligned or not-yet-rolled-up
edges from finer tiers down to raw samples. Every source yields the same partial aggregates, so
the answer does not depend on which tier served which part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.durations import parse_duration_ms
from metricvault.errors import InputError, TimeRangeError, UnsupportedError
from metricvault.model import (
    AGGREGATES,
    PAST_HORIZON_FUNCTIONS,
    QUANTILE_AGGREGATES,
    TIER_RESOLUTION_MS,
)
from metricvault.protocols import BUCKET_FUNCTIONS, Horizons, SelectHints, SeriesLookup
from metricvault.store import rollup
from metricvault.store.catalog import Snapshot
from metricvault.store.reader import Reader
from metricvault.store.series_index import SeriesIndex
from metricvault.tables import convert, long_table

ROLLUP_TIERS: tuple[tuple[str, int], ...] = tuple(TIER_RESOLUTION_MS.items())  # model.py owns them


@dataclass(frozen=True)
class Segment:
    tier: str
    start: int
    end: int

    @property
    def res(self) -> int:
        return dict(ROLLUP_TIERS).get(self.tier, 0)


def plan(start: int, end: int, width: int | None, watermark: int | None) -> list[Segment]:
    """Cover ``[start, end)`` with tier segments, coarsest first (``width`` None: any tier)."""
    limit = end if watermark is None else min(end, watermark)

    def cover(lo: int, hi: int, tiers: Sequence[tuple[str, int]]) -> list[Segment]:
        if lo >= hi:
            return []
        for i, (name, res) in enumerate(tiers):
            if width is not None and width % res:
                continue
            a = -(-lo // res) * res
            b = min(hi, limit) // res * res
            if a < b:
                rest = tiers[i + 1 :]
                return [*cover(lo, a, rest), Segment(name, a, b), *cover(b, hi, rest)]
        return [Segment("raw", lo, hi)]

    return cover(start, end, ROLLUP_TIERS)


@dataclass(frozen=True)
class BucketChoice:
    """How a range function is answered from rollups: buckets of ``res`` ms; ``shifted``:
    its windows moved to whole buckets (``range_ms`` their width then), which only happens
    where raw samples are gone. ``inner``: a span of whole coarse rows that lies inside every
    window, read as rows of ``inner_res`` (sums, extremes, increases and sketches of rows
    compose, so the answer is the one of ``res`` rows there, from far fewer rows)."""

    res: int
    shifted: bool
    range_ms: int
    inner: tuple[int, int] | None = None
    inner_res: int = 0
    # A plain selector within raw retention (``_plan_exact_selector``): the rows answer it
    # exactly only where no raw sample there is NaN, ±Inf or a staleness marker (rows keep
    # no marker), which the store checks before answering from them.
    finite_raw: bool = False


MIN_SAMPLES_PER_ROW = 2.0  # below it a tier row is no smaller a read than the raw samples
# A plain selector reads a row's first and last sample only, and the raw path over decoded
# row groups is quick: bench/dashboards.py --selector-rows measured the 1m rows at 0.8x the
# raw path's speed at 4 samples a row (15 s scrapes) and 1.2x at 12 (5 s scrapes).
SELECTOR_MIN_SAMPLES_PER_ROW = 8.0


def plan_buckets(
    hints: SelectHints,
    horizons: Horizons,
    samples_per_row: Callable[[str, int, int], float | None],
) -> BucketChoice | None:
    """The coarsest tier whose rows answer ``hints`` exactly: the window and every evaluation
    time whole multiples of its resolution, rollups done for most of the span, and its rows
    summarising at least two samples each. Where none can and raw samples are gone before
    the first window, the finest tier with windows moved to whole buckets; else None."""
    if hints.func is None:
        return _plan_selector(hints, horizons, samples_per_row)
    past_only = hints.func in PAST_HORIZON_FUNCTIONS
    if (hints.func not in BUCKET_FUNCTIONS and not past_only) or hints.range_ms <= 0:
        return None
    range_ms = hints.range_ms
    lo, hi = hints.start_ms - range_ms, hints.end_ms
    if past_only and not (horizons.raw_start_ms and lo < horizons.raw_start_ms):
        return None  # within raw retention these read raw samples: Prometheus's answer
    # Rows per raw sample where raw samples are still kept (before the horizon there are
    # none to count, and a ratio over the whole window would undercount the rows' samples).
    counted = max(lo, horizons.raw_start_ms) if horizons.raw_start_ms < hi else lo
    for tier, res in ROLLUP_TIERS:  # coarsest first
        aligned = not (hints.start_ms % res or hints.step_ms % res or range_ms % res)
        if aligned and not hints.left_open:
            if not _mostly_rolled_up(horizons.rolled_up_until_ms, lo, hi):
                break
            if _summarises(samples_per_row(tier, counted, hi)):
                return _with_inner(hints, BucketChoice(res, False, range_ms))
    res = min(TIER_RESOLUTION_MS.values())
    if horizons.raw_start_ms and lo < horizons.raw_start_ms and range_ms >= res:
        # Each window moves to whole minutes: its end down to one, its length to the nearest.
        return _with_inner(hints, BucketChoice(res, True, max(res, round(range_ms / res) * res)))
    return None


INNER_MIN_ROWS = 2  # coarse rows below which an inner span is not worth a second read


def _with_inner(hints: SelectHints, choice: BucketChoice) -> BucketChoice:
    """``choice`` with the whole coarsest-tier rows inside every window (from the last
    window's start to the first window's end) as its inner span, where there are some."""
    coarse = ROLLUP_TIERS[0][1]
    if choice.res >= coarse:
        return choice
    first, last = hints.start_ms, hints.end_ms
    if choice.shifted:
        first, last = first // choice.res * choice.res, last // choice.res * choice.res
    a = -(-(last - choice.range_ms) // coarse) * coarse
    b = first // coarse * coarse
    if b - a < INNER_MIN_ROWS * coarse:
        return choice
    return BucketChoice(choice.res, choice.shifted, choice.range_ms, (a, b), coarse)


def _plan_selector(
    hints: SelectHints,
    horizons: Horizons,
    samples_per_row: Callable[[str, int, int], float | None],
) -> BucketChoice | None:
    """A plain selector (``hints.range_ms`` its lookback) reaching before the raw horizon:
    the rows it is answered from there, whose first and last samples are real samples at
    their own times (promql/tiers.py). The coarsest tier no wider than the step that holds
    rows there, so each step has a row of its own; the finest that holds any, else None.
    Within raw retention nothing changes: None."""
    horizon = horizons.raw_start_ms
    lo = hints.start_ms - max(hints.range_ms, 0)
    if not horizon or lo >= horizon:
        return _plan_exact_selector(hints, horizons, samples_per_row)
    hi = min(hints.end_ms, horizon)
    held = [(t, res) for t, res in ROLLUP_TIERS if samples_per_row(t, lo, hi) is not None]
    for _tier, res in held:  # coarsest first
        if hints.step_ms >= res:
            return BucketChoice(res, True, hints.range_ms)
    return BucketChoice(held[-1][1], True, hints.range_ms) if held else None


def _plan_exact_selector(
    hints: SelectHints,
    horizons: Horizons,
    samples_per_row: Callable[[str, int, int], float | None],
) -> BucketChoice | None:
    """A plain selector within raw retention, evaluated every ``step_ms`` from ``start_ms``:
    the coarsest tier whose resolution divides every evaluation time (and the step no finer
    than it), rolled up for most of the span, whose rows summarise enough samples to be
    the quicker read (``SELECTOR_MIN_SAMPLES_PER_ROW``).
    At such a time ``t`` the newest sample at or before ``t`` is the first sample of the
    bucket starting at ``t`` when it sits on ``t``, else the last sample of the newest
    bucket before ``t``; so each row's first and last sample answer it exactly
    (docs/decisions/0004), where no raw sample is NaN, ±Inf or a staleness marker
    (``finite_raw``). Else None: raw samples."""
    step, range_ms = hints.step_ms, hints.range_ms
    if hints.func is not None or step <= 0 or range_ms <= 0:
        return None
    lo, hi = hints.start_ms - range_ms, hints.end_ms
    if not _mostly_rolled_up(horizons.rolled_up_until_ms, lo, hi):
        return None
    for tier, res in ROLLUP_TIERS:  # coarsest first
        if step < res or hints.start_ms % res or step % res:
            continue
        per_row = samples_per_row(tier, lo, hi)
        if per_row is not None and per_row >= SELECTOR_MIN_SAMPLES_PER_ROW:
            return BucketChoice(res, False, range_ms, finite_raw=True)
    return None


def raw_all_finite(ctx: QueryContext, series_ids: list[int], start: int, end: int) -> bool:
    """Whether no raw sample of these series in ``[start, end)`` is NaN, ±Inf or a
    staleness marker (``Reader.all_finite``: row groups, so possibly a little wider)."""
    files = ctx.snapshot.tier_files("raw")
    return ctx.reader.all_finite(files, series_ids, start, end)


def bucket_span(hints: SelectHints, choice: BucketChoice, lookback_ms: int) -> tuple[int, int]:
    """``[start, end)`` of the buckets ``choice`` reads for ``hints``: from the row before each
    window's first (a counter's rise into it) to the bucket starting at the last evaluation
    time (its first sample is the one at that time). A plain selector (``hints.func`` None)
    reads from one bucket before its lookback (the lookback is widened to a bucket there) to
    the bucket holding its last evaluation time."""
    res = choice.res
    if hints.func is None:
        first = (hints.start_ms - max(hints.range_ms, res)) // res * res
        return first - res, hints.end_ms // res * res + res
    first, last = hints.start_ms, hints.end_ms
    if choice.shifted:
        first, last = first // res * res, last // res * res
    pad = -(-lookback_ms // res) * res + res
    return first - choice.range_ms - pad, last + res


def _summarises(per_row: float | None) -> bool:
    """Whether a tier's rows summarise several raw samples each there: at a 60 s scrape the
    1m tier holds as many rows as raw, wider ones, and reading it is slower (bench/promql.py)."""
    return per_row is None or per_row == 0 or per_row >= MIN_SAMPLES_PER_ROW


def _mostly_rolled_up(until: int | None, start: int, end: int) -> bool:
    """Whether rollups are done for most of ``[start, end]``: buckets after the watermark
    are computed from raw samples at query time, slower than the raw path itself."""
    return until is None or until - start >= (end - start) / 2


def parse_step(step: str | int | None) -> int | None:
    """Step in ms; None for raw samples; -1 for ``"all"`` (one bucket over the range)."""
    if step is None:
        return None
    if isinstance(step, str) and step.strip().lower() == "all":
        return -1
    return parse_duration_ms(step)


def check_aggs(aggs: Sequence[str]) -> tuple[str, ...]:
    if isinstance(aggs, str):
        aggs = [a.strip() for a in aggs.split(",")]
    bad = [a for a in aggs if a not in AGGREGATES]
    if bad or not aggs:
        raise InputError(
            f"unknown aggregate(s) {', '.join(bad) or '(none given)'}; "
            f"choose from {', '.join(AGGREGATES)}"
        )
    return tuple(aggs)


@dataclass
class QueryContext:
    snapshot: Snapshot
    reader: Reader
    index: SeriesIndex
    lookback_ms: int
    use_cache: bool = True  # False for one-pass scans (export) that would only evict


class ContextReader:
    """The embedded store's :class:`~metricvault.protocols.SampleReader`."""

    def __init__(self, ctx: QueryContext) -> None:
        self.ctx = ctx
        self.index = ctx.index
        self.lookback_ms = ctx.lookback_ms
        self.raw_horizon_ms = ctx.snapshot.raw_horizon_ms

    def raw_samples(self, series_ids: list[int], start: int, end: int) -> pa.Table:
        return raw_samples(self.ctx, series_ids, start, end)

    def raw_samples_at(
        self, series_ids: list[int], start: int, end: int, at: np.ndarray
    ) -> pa.Table:
        """``raw_samples``, only the newest of each series at or before each time of ``at``
        (ascending): what an instant selector evaluated at those times reads."""
        files = self.ctx.snapshot.tier_files("raw")
        return self.ctx.reader.read(
            files, series_ids, start, end, use_cache=self.ctx.use_cache, at=at
        )

    quantile_sketches = True  # partials(..., sketch=True) holds them (query --agg p95)

    def partials(
        self, series_ids: list[int], start: int, end: int, step: int, sketch: bool = False
    ) -> pa.Table:
        return aggregate(self.ctx, series_ids, start, end, step, sketch)[0]

    def partials_without_sketches(
        self, series_ids: list[int], start: int, end: int, step: int, aggs: Sequence[str] = ()
    ) -> pa.Table:
        """``partials`` for aggregates that need no quantile sketch: rollup files are read
        without their sketch columns (two thirds of a 1m row group's decoding), which are
        null in the result. ``aggs`` (the aggregates asked): a few series' first read of a
        rollup row group may leave out the columns none of them uses (null)."""
        columns = rollup_columns_for(aggs) if aggs else None
        return aggregate(
            self.ctx, series_ids, start, end, step, rollup_sketches=False, rollup_columns=columns
        )[0]


def raw_samples(ctx: QueryContext, series_ids: list[int], start: int, end: int) -> pa.Table:
    files = ctx.snapshot.tier_files("raw")
    return ctx.reader.read(files, series_ids, start, end, use_cache=ctx.use_cache)


def aggregate(
    ctx: QueryContext, series_ids: list[int], start: int, end: int, step: int,
    sketch: bool = False, rollup_sketches: bool = True,
    rollup_columns: frozenset[str] | None = None,
) -> tuple[pa.Table, list[Segment]]:  # fmt: skip
    """Partials per (series, bucket) for a step query, and the segments that served it;
    ``sketch``: with each bucket's quantile sketch where raw samples answer (rollup rows
    hold theirs, unless ``rollup_sketches`` is False: then they are not read).
    ``rollup_columns`` (with ``rollup_sketches`` False): the partial columns the caller
    uses (:func:`rollup_columns_for`); rollup rows may hold only those (others null)."""
    if step == -1:
        lo, hi = _widen_to_empty_time(ctx.snapshot, start, end)
        width, origin = hi - lo, lo
    else:
        width, origin = step, 0
        lo, hi = start // step * step, -(-end // step) * step
    if hi <= lo:
        raise TimeRangeError(f"empty time range: start {start} is not before end {end}")
    segments = plan(lo, hi, None if step == -1 else width, ctx.snapshot.rollup_watermark_ms())
    counters = pa.array([s for s in series_ids if ctx.index.is_counter(s)], pa.int64())
    parts = []
    for seg in segments:
        if seg.tier == "raw":
            samples = raw_samples(ctx, series_ids, seg.start - ctx.lookback_ms, seg.end)
            parts.append(
                rollup.raw_partials(
                    samples,
                    counters,
                    width=width,
                    origin=origin,
                    since=seg.start,
                    until=seg.end,
                    lookback=ctx.lookback_ms,
                    sketch=sketch,
                )
            )
        else:
            files = ctx.snapshot.tier_files(seg.tier)
            alone = width == seg.res and origin % seg.res == 0  # a row is its bucket's part
            columns = rollup_columns if rollup_columns is None or alone else rollup_columns | MERGED
            rows = ctx.reader.read(
                files,
                series_ids,
                seg.start,
                seg.end,
                seg.tier,
                ctx.use_cache,
                rollup_sketches,
                columns=None if rollup_sketches else columns,
            )
            parts.append(rollup.rollup_partials(rows, width=width, origin=origin, res=seg.res))
    partials = rollup.combine(parts)
    if step == -1:  # the one bucket is labelled with the start the caller asked for
        partials = partials.set_column(1, "ts", pa.array(np.full(partials.num_rows, start)))
    return partials, segments


@dataclass(frozen=True)
class Buckets:
    """Per-(series, bucket) summaries for PromQL over the rollup tiers (promql/tiers.py):
    the partials of :func:`aggregate` (first/last samples with their times, NaN counts, and
    for counters the increase; buckets holding only NaN samples kept, with ``count`` 0),
    sorted by ``(series_id, ts)``."""

    table: pa.Table
    labels: dict[int, dict[str, str]]  # series_id -> labels, ``__name__`` included
    counters: frozenset[int]
    tiers: tuple[str, ...]  # the tiers that served them, coarsest first
    raw_horizon_ms: int  # raw samples before this are gone (0: none dropped)
    counter_lookback_ms: int  # how far back a bucket's increase looked for the sample before


def buckets(
    ctx: QueryContext,
    series_ids: list[int],
    start: int,
    end: int,
    width: int,
    inner: tuple[int, int] | None = None,
    inner_width: int = 0,
    sketches: bool = True,
    columns: Sequence[str] | None = None,
) -> Buckets:
    """Buckets of ``width`` (a multiple of every tier it may use) over ``[start, end)``;
    with ``inner`` (within it, whole ``inner_width`` buckets), buckets of ``inner_width``
    there and of ``width`` before and after (BucketChoice.inner). With ``sketches`` every
    bucket has its quantile sketch (the rollup rows' own, and made from the raw samples of
    hours not rolled up yet); ``sketches=False``: no sketches are read or made (null), and
    ``columns`` (partial columns; None: all) are the only ones read from the rollup rows
    and kept beside ``series_id`` and the (null) sketch columns."""
    wanted = None if sketches or columns is None else frozenset(("series_id", "ts", *columns))
    if series_ids and inner is not None and start <= inner[0] < inner[1] <= end:
        parts, segments = [], []
        for lo, hi, w in ((start, inner[0], width), (*inner, inner_width), (inner[1], end, width)):
            if lo < hi:
                part, used = aggregate(ctx, series_ids, lo, hi, w, sketches, sketches, wanted)
                parts.append(_keep(part, wanted))
                segments += used
        table = _series_major(pa.concat_tables(parts, promote_options="default"))
    elif series_ids:
        table, segments = aggregate(ctx, series_ids, start, end, width, sketches, sketches, wanted)
        table = _series_major(_keep(table, wanted))
    else:
        table, segments = rollup.empty_partials(), []
    labels = {}
    for sid in series_ids:
        info = ctx.index.get(sid)
        labels[sid] = {**info.labels, "__name__": info.metric}
    return Buckets(
        table,
        labels,
        frozenset(s for s in series_ids if ctx.index.is_counter(s)),
        tuple(dict.fromkeys(seg.tier for seg in segments)),
        ctx.snapshot.raw_horizon_ms or 0,
        ctx.lookback_ms,
    )


def _keep(table: pa.Table, wanted: frozenset[str] | None) -> pa.Table:
    """The partials' columns ``wanted`` and the sketches' (null without them: what
    ``selecting.to_selection`` reads), in the table's order; all where None."""
    if wanted is None:
        return table
    return table.select(
        [n for n in table.column_names if n in wanted or n in rollup.SKETCH_COLUMNS]
    )


# Runs at least this long on average are moved as slices of the table (no copy: the caller's
# ``to_numpy`` concatenates them once); shorter ones are taken row by row
_SLICED_RUN_ROWS = 32


def _series_major(table: pa.Table) -> pa.Table:
    """``table`` ordered by ``(series_id, ts)``. It usually arrives as runs already in that
    order (a file's rows of one series, a segment's): the runs are put in order as slices of
    the table, which costs a fraction of Arrow's ``take`` of every row of every column. Runs
    that interleave (a DuckDB ``GROUP BY`` hands its groups over in hash order) are sorted
    row by row."""
    if table.num_rows < 2:
        return table
    sid = table["series_id"].to_numpy()
    ts = table["ts"].to_numpy()
    # 64-bit hashes: compare, never subtract (a difference can overflow)
    breaks = np.flatnonzero((sid[1:] != sid[:-1]) | (ts[1:] <= ts[:-1])) + 1
    starts = np.r_[0, breaks]
    ends = np.r_[breaks, sid.size]
    order = np.lexsort((ts[starts], sid[starts]))
    run_sid, first_ts, last_ts = sid[starts][order], ts[starts][order], ts[ends - 1][order]
    # each run is in order: the runs in order are too, unless two of one series overlap
    if ((run_sid[1:] == run_sid[:-1]) & (first_ts[1:] < last_ts[:-1])).any():
        return table.take(pa.array(np.lexsort((ts, sid))))
    if (order == np.arange(order.size)).all():
        return table
    first, lens = starts[order], (ends - starts)[order]
    if order.size * _SLICED_RUN_ROWS > sid.size:  # short runs: one take
        offsets = np.cumsum(lens) - lens
        return table.take(pa.array(np.arange(sid.size) - np.repeat(offsets - first, lens)))
    return _runs_of_batches(table, first, lens)


def _runs_of_batches(table: pa.Table, first: np.ndarray, lens: np.ndarray) -> pa.Table:
    """Rows ``first[i]:first[i] + lens[i]`` of ``table``, run after run, as slices of its
    record batches: a table's own ``slice`` walks every chunk of every column to find a run
    (a 7-day read is ~300 chunks, ~800 runs: 18 ms against 3 ms for the batches' slices)."""
    batches = table.to_batches()
    offsets = np.cumsum([0, *(b.num_rows for b in batches)])
    at = np.searchsorted(offsets, first, "right") - 1  # the batch each run starts in
    pieces = []
    for a, n, i in zip(first.tolist(), lens.tolist(), at.tolist(), strict=True):
        while n:  # a run may go on into the next batch
            batch = batches[i]
            offset = a - int(offsets[i])
            piece = batch.slice(offset, min(n, batch.num_rows - offset))
            pieces.append(piece)
            a, n, i = a + piece.num_rows, n - piece.num_rows, i + 1
    return pa.Table.from_batches(pieces, schema=table.schema)


def _widen_to_empty_time(snapshot: Snapshot, start: int, end: int) -> tuple[int, int]:
    """Stretch ``[start, end)`` over time that holds no data at all, to whole hours, so a
    "whole range" query starting at the first sample is answered from rollups, not raw."""
    first, last = _sample_bounds(snapshot)
    if first is None or last is None:
        return start, end
    coarsest = ROLLUP_TIERS[0][1]
    lo = start // coarsest * coarsest if start <= first else start
    hi = -(-end // coarsest) * coarsest if end > last else end
    return lo, hi


def _sample_bounds(snapshot: Snapshot) -> tuple[int | None, int | None]:
    """Earliest and latest sample time. Raw files know them exactly; rollup rows only know
    their bucket, so they count (conservatively) only where retention dropped raw data."""
    raw = snapshot.tier_files("raw")
    firsts = [f.min_ts for f in raw]
    lasts = [f.max_ts for f in raw]
    for f in snapshot.files:
        if f.tier != "raw" and (not raw or f.min_ts < snapshot.raw_horizon_ms):
            firsts.append(f.min_ts)
            lasts.append(f.max_ts + dict(ROLLUP_TIERS)[f.tier] - 1)
    return min(firsts, default=None), max(lasts, default=None)


SKETCH_AGGREGATES = frozenset({"stddev", *QUANTILE_AGGREGATES})
# The partial columns each aggregate without a sketch is finished from (finish_aggregates),
# beside those every query uses (series_id, ts, count: finite_rows).
_AGGREGATE_COLUMNS = {
    "mean": ("sum",),
    "sum": ("sum",),
    "count": (),
    "min": ("min",),
    "max": ("max",),
    "last": ("last", "last_ts"),
    "increase": ("increase",),
}


# The partial columns a merge of a bucket's rows reads beside the aggregates' own
# (rollup._merge: the rows in the order of their last samples, first/last times, NaN counts);
# rows of the tier's own buckets are answered without them (aggregate).
MERGED = frozenset({"first_ts", "last_ts", "nonfinite"})


def rollup_columns_for(aggs: Sequence[str]) -> frozenset[str] | None:
    """The partial columns ``aggs`` are answered from where each rollup row is a bucket of
    its own (a merge of rows needs :data:`MERGED` too); None where one is not known here."""
    if any(a not in _AGGREGATE_COLUMNS for a in aggs):
        return None
    return frozenset({"series_id", "ts", "count"}.union(*(_AGGREGATE_COLUMNS[a] for a in aggs)))


def read_partials(
    reader: Any, series_ids: list[int], start: int, end: int, step: int, aggs: Sequence[str]
) -> pa.Table:
    """``reader.partials``, with quantile sketches where ``aggs`` asks for a quantile. A
    reader whose rows keep no m2 or sketches (InfluxDB's continuous queries, experiment
    snapshots) refuses ``stddev`` and the quantiles, saying so, rather than answer nulls."""
    wanted = [a for a in aggs if a in SKETCH_AGGREGATES]
    if not wanted:
        lean = getattr(reader, "partials_without_sketches", None)
        if lean is not None:
            return lean(series_ids, start, end, step, aggs=aggs)
        return reader.partials(series_ids, start, end, step)
    if not getattr(reader, "quantile_sketches", False):
        raise UnsupportedError(
            f"this store keeps no variance or quantile sketch in its rollups, so it cannot "
            f"answer {', '.join(wanted)}: query the raw samples (no --step) and aggregate "
            "them yourself, or use a metricvault vault"
        )
    sketch = any(a in QUANTILE_AGGREGATES for a in aggs)
    return reader.partials(series_ids, start, end, step, sketch=sketch)


def finish_aggregates(partials: pa.Table, aggs: Sequence[str]) -> dict[str, pa.Array]:
    cols: dict[str, pa.Array] = {}
    for agg in aggs:
        if agg == "mean":
            cols[agg] = pc.divide(partials["sum"], pc.cast(partials["count"], pa.float64()))
        elif agg == "stddev":  # population, as PromQL's stddev_over_time; null: no m2 kept
            var = pc.divide(partials["m2"], pc.cast(partials["count"], pa.float64()))
            cols[agg] = pc.sqrt(pc.max_element_wise(var, 0.0))
        elif agg in QUANTILE_AGGREGATES:
            count = partials["count"].to_numpy().astype(np.float64)
            cols[agg] = rollup.row_quantiles(
                partials["sketch_keys"], partials["sketch_counts"], QUANTILE_AGGREGATES[agg], count
            )
        else:
            cols[agg] = partials[agg]
    return cols


def shape(index: SeriesLookup, table: pa.Table, value_columns: dict[str, Any], output: str) -> Any:
    """Long shape: timestamp (UTC), metric, one column per label name, then values.

    Rows are ordered by series (metric, then labels) and time.
    """
    sid = table["series_id"].to_numpy() if table.num_rows else np.empty(0, np.int64)
    ts = table["ts"].to_numpy() if table.num_rows else np.empty(0, np.int64)
    uniq, pos = np.unique(sid, return_inverse=True)
    infos = [index.get(int(s)) for s in uniq]
    rank_of = np.argsort(np.argsort([i.metric + "\x00" + i.labels_json for i in infos]))
    order = np.lexsort((ts, rank_of[pos])) if len(sid) else np.empty(0, np.int64)
    take = pa.array(order)
    values = {name: _as_array(v).take(take) for name, v in value_columns.items()}
    metrics, labels = [i.metric for i in infos], [i.labels for i in infos]
    _refuse_shadowed_columns(values, labels)
    return convert(long_table(ts[order], pos[order], metrics, labels, values), output)


def _refuse_shadowed_columns(values: dict[str, Any], labels: list[dict[str, str]]) -> None:
    """An aggregate column named like a label of the series (``p99`` is a label name a
    sender may use) would hide it: refuse the query, naming both and the way out."""
    names = {name for series_labels in labels for name in series_labels}
    clash = sorted(names & set(values))
    if clash:
        raise InputError(
            f"the aggregate(s) {', '.join(clash)} would hide the label(s) of the same name "
            "that these series carry: ask for other aggregates, or select the series with "
            f"PromQL instead (e.g. quantile_over_time(0.99, ...)), which keeps labels apart"
        )


def _as_array(values: Any) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def explain_empty(
    index: SeriesIndex, selector: str, series_ids: list[int], snapshot: Snapshot
) -> str:
    """Why a query returned no rows, in one sentence a person can act on: no series match
    (with the nearest metric names, or the label values the metric does have), or the series
    exist but hold no samples in the range (with where the vault's data lies)."""
    import difflib

    from metricvault.selector import parse_selectors

    if series_ids:
        first, last = _sample_bounds(snapshot)
        span = (
            "the vault holds no samples yet"
            if first is None or last is None
            else f"the vault holds samples from {_iso(first)} to {_iso(last)}"
        )
        return (
            f"{len(series_ids)} series match {selector} but none has samples in the range; "
            f"{span}: widen --start/--end"
        )
    infos = index.all()
    metrics = sorted({i.metric for i in infos})
    hints: list[str] = []
    for part in parse_selectors(selector).parts:
        name = part.metric
        if name is None:
            continue
        if name in metrics:
            labels = _label_values(i.labels for i in infos if i.metric == name)
            hints.append(f"{name} exists; its labels: {labels}")
        else:
            near = difflib.get_close_matches(name, metrics, n=5, cutoff=0.6)
            if near:
                hints.append(f"did you mean {', '.join(near)}?")
    if not hints:
        hints.append(
            "'metricvault series' lists what the vault holds" if metrics else "the vault is empty"
        )
    return f"no series match {selector}; " + "; ".join(hints)


def _label_values(label_sets: Any, most: int = 5) -> str:
    values: dict[str, set[str]] = {}
    for labels in label_sets:
        for k, v in labels.items():
            values.setdefault(k, set()).add(v)
    if not values:
        return "(none)"
    parts = []
    for name in sorted(values):
        shown = sorted(values[name])
        more = f", ... {len(shown) - most} more" if len(shown) > most else ""
        parts.append(f"{name} ({', '.join(shown[:most])}{more})")
    return ", ".join(parts)


def _iso(ms: int) -> str:
    from metricvault.durations import ms_to_datetime

    return ms_to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%SZ")
