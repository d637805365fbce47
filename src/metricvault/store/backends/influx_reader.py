"""Reading an InfluxDB-backed vault: raw samples, 1-minute rollups, and the partial aggregates
every query and the archive export are built from.

The planner mirrors the embedded store's: a step that is a whole number of minutes (or
``"all"``) is answered from the long-term policy's 1-minute rows for the whole minutes of the
range where those rows are complete, and from raw samples for the edges and for minutes that
received writes ``maintain`` has not rolled up yet (before the raw horizon rollups are used
regardless: they are all there is). Other steps read raw samples. Both sources are turned into
the same partials (``metricvault.store.rollup``), so the answer does not depend on which policy
served which part. Raw partials are computed with the embedded store's own code; rollup rows
are added up inside InfluxDB (``sum(sum_value)``, ``min(min_value)``, ...) for steps wider than
a minute, and read as they are for 1-minute steps. InfluxDB sums naively, so a ``sum`` or
``mean`` from rollups can differ from the embedded store's exact sum in the last bits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.errors import LabelError, TimeRangeError
from metricvault.model import SAMPLE_SCHEMA, TIER_RESOLUTION_MS
from metricvault.selector import parse_selectors
from metricvault.store import rollup
from metricvault.store.backends.influx_client import InfluxClient, ident, literal
from metricvault.store.backends.influx_lines import series_from_point
from metricvault.store.series_index import SeriesIndex

MINUTE_MS = TIER_RESOLUTION_MS["1m"]  # the 1m tier's bucket width (model.py owns the tiers)
MAX_OR_SERIES = 100  # beyond this many series, fetch the measurement and filter here
INCREASE_FIELD = "increase_value"
ROW_FIELDS = (
    "count_value",
    "mean_value",
    "sum_value",
    "min_value",
    "max_value",
    "last_value",
    INCREASE_FIELD,
)


@dataclass(frozen=True)
class Segment:
    source: str  # "raw" or "1m"
    start: int
    end: int


def plan(lo: int, hi: int, width: int | None, complete_until: int) -> list[Segment]:
    """Cover ``[lo, hi)``: 1-minute rollups for whole minutes before ``complete_until`` when
    the step (``width``; None: one bucket) is whole minutes, raw samples for the rest."""
    if width is not None and width % MINUTE_MS:
        return [Segment("raw", lo, hi)]
    a = -(-lo // MINUTE_MS) * MINUTE_MS
    b = min(hi, complete_until) // MINUTE_MS * MINUTE_MS
    if a >= b:
        return [Segment("raw", lo, hi)]
    parts = [Segment("raw", lo, a), Segment("1m", a, b), Segment("raw", b, hi)]
    return [p for p in parts if p.start < p.end]


class InfluxReader:
    """The InfluxDB backend's :class:`~metricvault.protocols.SampleReader`."""

    def __init__(
        self,
        client: InfluxClient,
        index: SeriesIndex,
        raw_rp: str,
        longterm_rp: str,
        lookback_ms: int,
        raw_horizon_ms: int,
        pending: Callable[[], dict[str, int]],
    ) -> None:
        self.client = client
        self.index = index
        self.raw_rp = raw_rp
        self.longterm_rp = longterm_rp
        self.lookback_ms = lookback_ms
        self.raw_horizon_ms = raw_horizon_ms
        self._pending = pending  # measurement -> first minute not rolled up yet

    # ------------------------------------------------------------------ SampleReader
    def raw_samples(self, series_ids: list[int], start: int, end: int) -> pa.Table:
        """``series_id, ts, value`` with ``start <= ts < end``, sorted by series and time."""
        return self._select(
            self.raw_rp, ident("value"), start, end, series_ids, _samples, SAMPLE_SCHEMA
        )

    def partials(self, series_ids: list[int], start: int, end: int, step: int) -> pa.Table:
        if not series_ids:
            return rollup.empty_partials()
        if step == -1:
            width, origin, lo, hi = end - start, start, start, end
        else:
            width, origin = step, 0
            lo, hi = start // step * step, -(-end // step) * step
        if hi <= lo:
            raise TimeRangeError(f"empty time range: start {start} is not before end {end}")
        segments = plan(lo, hi, None if step == -1 else width, self._complete_until(series_ids))
        parts = [self._segment(series_ids, seg, width, origin, step == -1) for seg in segments]
        partials = rollup.combine(parts)
        if step == -1:  # the one bucket is labelled with the start the caller asked for
            partials = partials.set_column(1, "ts", pa.array(np.full(partials.num_rows, start)))
        return partials

    def rollup_partials(
        self, series_ids: list[int], seg: Segment, width: int, origin: int, one_bucket: bool
    ) -> pa.Table:
        """Partials per (series, bucket of ``width``) from the stored 1-minute rows, added up
        by InfluxDB (buckets align to the epoch, as ``GROUP BY time()`` does; ``one_bucket``:
        one per series, stamped ``origin``). Minutes the continuous query wrote but
        ``maintain`` did not lack ``sum_value``; series with such minutes are read row by row
        and summed here with ``sum = mean * count``."""
        if width == MINUTE_MS and not one_bucket:  # the stored rows are the buckets
            rows = self._rollup_rows(series_ids, seg)
            return rollup.rollup_partials(rows, width=width, origin=origin, res=MINUTE_MS)
        when = _time_range(seg.start, seg.end)
        group = "*" if one_bucket else f"time({width}ms), * fill(none)"
        source = ident(self.longterm_rp)
        incomplete: list[int] = []

        def statement(metric: str, tags: str) -> str:
            return (
                f'SELECT sum("count_value") AS "count", sum("sum_value") AS "sum", '
                f'min("min_value") AS "min", max("max_value") AS "max", last("last_value") AS '
                f'"last", sum("{INCREASE_FIELD}") AS "increase", count("count_value") AS "rows", '
                f'count("sum_value") AS "summed" FROM {source}.{ident(metric)} WHERE {when}{tags} '
                f"GROUP BY {group}"
            )

        def convert(sid: int, values: np.ndarray) -> pa.Table:
            if not np.array_equal(values[:, 7], values[:, 8]):
                incomplete.append(sid)
            return _aggregated(sid, values, width, origin if one_bucket else None, seg.end)

        tables = [
            self._fetch(metric, ids, partial(statement, metric), convert)
            for metric, ids in self._by_metric(series_ids).items()
        ]
        partials = _sorted(tables, rollup.PARTIAL_SCHEMA)
        if not incomplete:
            return partials
        keep = pc.invert(pc.is_in(partials["series_id"], pa.array(incomplete, pa.int64())))
        rows = self._rollup_rows(incomplete, seg)
        redone = rollup.rollup_partials(rows, width=width, origin=origin, res=MINUTE_MS)
        return rollup.combine([partials.filter(keep), redone])

    def _rollup_rows(self, series_ids: list[int], seg: Segment) -> pa.Table:
        """Stored 1-minute rows as ``rollup.ROLLUP_SCHEMA``."""
        fields = ", ".join(ident(f) for f in ROW_FIELDS)
        return self._select(
            self.longterm_rp, fields, seg.start, seg.end, series_ids, _rows, rollup.ROLLUP_SCHEMA
        )

    def _select(
        self,
        policy: str,
        fields: str,
        start: int,
        end: int,
        series_ids: list[int],
        convert: Callable[[int, np.ndarray], pa.Table],
        schema: pa.Schema,
    ) -> pa.Table:
        """``fields`` of the series in ``start <= time < end`` from retention policy
        ``policy``, one statement per measurement, as one table sorted by series and time."""
        source = ident(policy)

        def statement(metric: str, tags: str) -> str:
            return (
                f"SELECT {fields} FROM {source}.{ident(metric)} "
                f"WHERE {_time_range(start, end)}{tags} GROUP BY *"
            )

        tables = [
            self._fetch(metric, ids, partial(statement, metric), convert)
            for metric, ids in self._by_metric(series_ids).items()
        ]
        return _sorted(tables, schema)

    # ------------------------------------------------------------------ planning
    def _complete_until(self, series_ids: list[int]) -> int:
        """Rollups are complete before the first pending minute of any queried metric; before
        the raw horizon they are used in any case (raw samples are gone there)."""
        pending = self._pending()
        metrics = {self.index.get(s).metric for s in series_ids}
        first = min((pending[m] for m in metrics if m in pending), default=None)
        if first is None:
            return 2**62
        return max(first, self.raw_horizon_ms)

    def _segment(
        self, series_ids: list[int], seg: Segment, width: int, origin: int, one_bucket: bool
    ) -> pa.Table:
        if seg.source == "1m":
            return self.rollup_partials(series_ids, seg, width, origin, one_bucket)
        counters = [s for s in series_ids if self.index.is_counter(s)]
        gauges = [s for s in series_ids if not self.index.is_counter(s)]
        # only counters need the samples before the segment (their increase looks back)
        parts = [self.raw_samples(gauges, seg.start, seg.end)] if gauges else []
        if counters:
            parts.append(self.raw_samples(counters, seg.start - self.lookback_ms, seg.end))
        samples = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return rollup.raw_partials(
            samples,
            pa.array(counters, pa.int64()),
            width=width,
            origin=origin,
            since=seg.start,
            until=seg.end,
            lookback=self.lookback_ms,
        )

    # ------------------------------------------------------------------ fetching
    def _by_metric(self, series_ids: Iterable[int]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = defaultdict(list)
        for sid in series_ids:
            groups[self.index.get(sid).metric].append(sid)
        return groups

    def _fetch(
        self,
        metric: str,
        ids: list[int],
        statement: Callable[[str], str],
        convert: Callable[[int, np.ndarray], pa.Table],
    ) -> pa.Table | None:
        """Run ``statement(tag filter)`` and convert each wanted series' values (a float64
        matrix, NaN for nulls); rows are matched to series ids by their tags."""
        wanted = set(ids)
        tables = []
        for series in self.client.series(
            statement(self._tag_filter(metric, ids)), exact_floats=True
        ):
            sid = _series_id(metric, series.get("tags") or {})
            if sid in wanted and series.get("values"):
                tables.append(convert(sid, np.array(series["values"], dtype=np.float64)))
        return pa.concat_tables(tables) if tables else None

    def _tag_filter(self, metric: str, ids: list[int]) -> str:
        """Narrow the query to these series where that is short; rows are matched to series
        ids afterwards in any case."""
        if len(ids) > MAX_OR_SERIES or len(ids) == len(self.index.match(parse_selectors(metric))):
            return ""
        terms = []
        for sid in ids:
            labels = self.index.get(sid).labels
            conds = [f"{ident(k)} = {literal(v)}" for k, v in sorted(labels.items())]
            terms.append("(" + (" AND ".join(conds) or "true") + ")")
        if any(t == "(true)" for t in terms):  # a series without labels: cannot narrow by tags
            return ""
        return " AND (" + " OR ".join(terms) + ")"


def _series_id(metric: str, tags: dict[str, str]) -> int | None:
    try:
        return series_from_point(metric, tags).series_id
    except LabelError:  # a series metricvault did not write and cannot name
        return None


def _samples(sid: int, values: np.ndarray) -> pa.Table:
    return pa.table(
        [
            pa.array(np.full(len(values), sid, np.int64)),
            pa.array(values[:, 0].astype(np.int64)),
            pa.array(values[:, 1]),
        ],
        schema=SAMPLE_SCHEMA,
    )


def _aggregated(
    sid: int, values: np.ndarray, width: int, stamp: int | None, seg_end: int
) -> pa.Table:
    """Columns: time, count, sum, min, max, last, increase, rows, summed (NaN where null).
    ``last_ts`` is the bucket's last instant inside the segment: later than any raw sample
    before the segment, earlier than any after it, which is all merging segments needs."""
    values = values[~np.isnan(values[:, 1])]  # buckets with only an increase written
    ts = values[:, 0].astype(np.int64) if stamp is None else np.full(len(values), stamp)
    return rollup.conform(
        pa.table(
            {
                "series_id": pa.array(np.full(len(values), sid, np.int64)),
                "ts": pa.array(ts, pa.int64()),
                "count": pa.array(values[:, 1].astype(np.int64)),
                "sum": pa.array(values[:, 2]),
                "min": pa.array(values[:, 3]),
                "max": pa.array(values[:, 4]),
                "last": pa.array(values[:, 5]),
                "last_ts": pa.array(np.minimum(ts + width, seg_end) - 1, pa.int64()),
                "increase": _nullable(values[:, 6]),
            }
        )
    )


def _rows(sid: int, values: np.ndarray) -> pa.Table:
    """Columns of ``ROW_FIELDS`` after time; ``sum`` falls back to ``mean * count``."""
    values = values[~np.isnan(values[:, 1])]
    count = values[:, 1]
    total = np.where(np.isnan(values[:, 3]), values[:, 2] * count, values[:, 3])
    return rollup.conform(
        pa.table(
            {
                "series_id": pa.array(np.full(len(values), sid, np.int64)),
                "ts": pa.array(values[:, 0].astype(np.int64)),
                "count": pa.array(count.astype(np.int64)),
                "sum": pa.array(total),
                "min": pa.array(values[:, 4]),
                "max": pa.array(values[:, 5]),
                "last": pa.array(values[:, 6]),
                "increase": _nullable(values[:, 7]),
            }
        )
    )


def _nullable(column: np.ndarray) -> pa.Array:
    return pa.array(column, mask=np.isnan(column))


def _time_range(start: int, end: int) -> str:
    return f"time >= {start}ms AND time < {end}ms"


def _sorted(tables: list[pa.Table | None], schema: pa.Schema) -> pa.Table:
    present = [t for t in tables if t is not None]
    if not present:
        return schema.empty_table()
    table = pa.concat_tables(present)
    order = np.lexsort((table["ts"].to_numpy(), table["series_id"].to_numpy()))
    return table.take(pa.array(order))
