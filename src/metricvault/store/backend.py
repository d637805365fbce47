"""The reading interface every storage backend offers to code above the query API (archive
export): the embedded store implements it over its tiers, the InfluxDB backend over its
retention policies. Writing, querying, maintenance and the experiment registry share the
``Vault`` method names on both."""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from metricvault.store.series_index import SeriesIndex


class SampleReader(Protocol):
    index: SeriesIndex  # every series: id -> metric, labels, kind; match(selector)
    lookback_ms: int  # how far back a counter's previous sample is looked for
    raw_horizon_ms: int  # raw samples before this were dropped by retention (0: none)

    def raw_samples(self, series_ids: list[int], start: int, end: int) -> pa.Table:
        """``series_id, ts, value`` with ``start <= ts < end``, sorted by series and time."""
        ...

    def partials(self, series_ids: list[int], start: int, end: int, step: int) -> pa.Table:
        """Per (series, bucket of ``step`` ms aligned to the epoch; -1: one bucket over the
        range): ``series_id, ts, count, sum, min, max, last, last_ts, increase``."""
        ...
