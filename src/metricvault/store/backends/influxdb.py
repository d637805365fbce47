"""``InfluxVault``: the store's API on an InfluxDB 1.x database (``influxdb://`` URIs).

>>> vault = Vault.open("influxdb://user:pass@127.0.0.1:8086/gpu_metrics_db")
>>> vault.write(frame)                    # durable when it returns: InfluxDB acknowledged it
>>> vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-7d", "now", step="1h",
...             aggs=("mean", "max"))
>>> vault.maintain()                      # re-rolls the minutes that received late writes

Create the database, retention policies and continuous query first with ``metricvault influx
setup --url influxdb://HOST:PORT/DB`` (see :mod:`.influx_setup`); the mapping of series to
points is in :mod:`.influx_lines`, the metadata kept in the database in :mod:`.influx_meta`,
reading and the choice of policy in :mod:`.influx_reader`. ``docs/influxdb.md`` has it all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.config import Settings
from metricvault.durations import (
    HOUR_MS,
    TimeLike,
    format_duration_ms,
    now_ms,
    parse_duration_ms,
)
from metricvault.errors import (
    LabelError,
    NotFoundError,
    UnsupportedError,
)
from metricvault.model import (
    KindUpdate,
    admissible_write_kinds,
    kind_from_name,
    metadata_kind_update,
)
from metricvault.protocols import BucketSelection, Horizons, SelectHints, SeriesSamples
from metricvault.selector import Matcher, Selector, SelectorUnion, parse_selectors
from metricvault.store import rollup, selecting
from metricvault.store.backends import influx_meta as meta
from metricvault.store.backends.influx_client import InfluxClient, ident, parse_uri
from metricvault.store.backends.influx_lines import (
    encode_points,
    parse_series_key,
    series_from_point,
    series_prefix,
)
from metricvault.store.backends.influx_reader import INCREASE_FIELD, MINUTE_MS, InfluxReader
from metricvault.store.backends.influx_setup import (
    Policies,
    policies,
    rollup_into,
    setup,
    setup_statements,
    show_databases,
    show_policies,
)
from metricvault.store.normalize import normalize
from metricvault.store.reading import check_horizon, run_query
from metricvault.store.series_index import SeriesIndex

log = logging.getLogger("metricvault")

__all__ = ["InfluxVault", "setup", "setup_statements"]

BATCH_POINTS = 10_000  # lines per POST /write (InfluxDB suggests 5,000-10,000)
HORIZON_MARGIN_MS = 5 * 60_000  # clock skew and slow writes near the raw retention edge
MAX_ROLLUP_SPAN_MS = 24 * HOUR_MS  # maintain recomputes at most a day per statement
_PREFIX_CACHE_MAX = 1_000_000
SQL_UNSUPPORTED = (
    "SQL views (raw, rollup_1m, rollup_1h, series, experiments) exist only on the embedded "
    "store and its snapshots: InfluxDB has InfluxQL — use query() or promql() (or InfluxQL "
    "directly against the database), or export an experiment (metricvault archive export) "
    "and run the same SQL on its snapshot"
)


class InfluxVault:
    """A vault on an InfluxDB 1.x database. Open with :meth:`open` (or ``Vault.open``)."""

    backend = "influxdb"
    backend_name = "InfluxDB database"
    # no "sql": InfluxDB has InfluxQL, not DuckDB views over files
    capabilities = frozenset({"read", "write", "maintain", "experiments", "serve", "export"})
    unsupported_hint = (
        "It has no SQL views (raw, rollup_1m, rollup_1h, series, experiments): use query() or "
        "promql() (or InfluxQL directly against the database), or export an experiment "
        "(metricvault archive export) and run SQL on its snapshot."
    )

    def __init__(self, client: InfluxClient, settings: Settings, pol: Policies) -> None:
        self.client = client
        self.settings = settings
        self.policies = pol
        self.index = SeriesIndex()
        self.last_flush_error: str | None = None
        self._state_dir = _state_dir(settings, client)
        self._lookback = parse_duration_ms(settings.counter_lookback)
        self._prefixes: dict[int, str] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, uri: str, settings: Settings | None = None, **overrides: Any) -> Self:
        """Connect and check that setup has run (the database and its three policies exist);
        NotFoundError says which command creates what is missing."""
        settings = (settings or Settings.load()).with_overrides(**overrides)
        client = InfluxClient(parse_uri(uri))
        pol = policies(settings)
        try:
            client.ping()
            _check_setup(client, pol)
        except BaseException:
            client.close()
            raise
        vault = cls(client, settings, pol)
        vault.index.set_metric_kinds(meta.load_kinds(client, pol.meta))
        vault.refresh()
        return vault

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is buffered: every write was acknowledged when it returned."""
        if not self._closed:
            self._closed = True
            self.client.close()

    # ------------------------------------------------------------------ the store boundary
    @property
    def uri(self) -> str:
        return self.client.target.uri

    @property
    def state_dir(self) -> Path:
        """Local lock files of a gateway serving this database (created on first use)."""
        self._state_dir.mkdir(parents=True, exist_ok=True)
        return self._state_dir.resolve()

    def buffered(self) -> tuple[int, int]:
        """Writes go straight to InfluxDB, so nothing is ever buffered."""
        return 0, 0

    def series_count(self) -> int:
        return len(self.index)

    # ------------------------------------------------------------------ writing
    def write(
        self,
        data: Any,
        kinds: Mapping[str, str] | None = None,
        *,
        admit_new_series: Callable[[int], None] | None = None,
    ) -> int:
        """Store samples; returns how many. Durable when it returns (InfluxDB acknowledged
        every batch). Input, validation and ``admit_new_series`` as ``Vault.write``.

        Everything is validated before the first batch is sent; a write of more than
        ``BATCH_POINTS`` samples that fails midway leaves its earlier batches stored (InfluxDB
        has no transactions) and is safe to retry whole (the same points overwrite)."""
        if kinds:  # a known kind stands for the series this write creates (model.py)
            known = {m: k for m in kinds if (k := self.index.kind_of_metric(m)) is not None}
            kinds = admissible_write_kinds(kinds, known)
        batch = normalize(data, kinds)
        samples = batch.samples
        if samples.num_rows and not pc.all(pc.is_finite(samples["value"])).as_py():
            # InfluxDB 1.x cannot hold NaN, ±Inf or staleness markers: they are not stored on
            # this backend, and the count returned leaves them out (the gateway reports them).
            samples = samples.filter(pc.is_finite(samples["value"]))
        if samples.num_rows == 0:
            return 0
        self._check_horizon(samples)
        new = self.index.unknown(batch.series)
        if new and admit_new_series is not None:
            admit_new_series(len(new))
        self.index.check_known(batch.series)
        prefixes = self._prefix_column(batch.series, samples["series_id"])
        self._store_kinds(batch.series, kinds or {})
        sent = False
        try:
            for body in encode_points(prefixes, samples["value"], samples["ts"], BATCH_POINTS):
                self.client.write(body, self.policies.raw)
                sent = True
        finally:
            if sent:  # also after a failure midway: the batches stored must be rolled up
                metric_of = {sid: metric for sid, metric, _, _ in batch.series}
                markers = meta.marker_body(_touched(samples, metric_of))
                self.client.write(markers, self.policies.meta, "ns")
        for sid, metric, labels_json, kind in new:
            self.index.add(sid, metric, labels_json, self._kind_of(metric, kind))
        return int(samples.num_rows)

    def set_metric_kinds(self, kinds: Mapping[str, str]) -> KindUpdate:
        """Record metric types from exposition metadata by the embedded vault's rules
        (:func:`metricvault.model.metadata_kind_update`: metadata never downgrades a counter);
        they decide how every series of the metric rolls up (stored in ``metricvault.kinds``)."""
        known = {m: k for m in kinds if (k := self.index.kind_of_metric(m)) is not None}
        update = metadata_kind_update(kinds, known, frozenset(), now_ms())
        changed = {c.metric: c.new for c in update.applied}
        if changed:
            meta.store_kinds(self.client, self.policies.meta, changed)
            self.index.set_metric_kinds(changed)
        return update

    def min_writable_ms(self) -> int:
        """The oldest timestamp a write may carry: InfluxDB drops points older than the raw
        policy's duration (less a margin for clock skew), so they are refused up front."""
        raw_ms = self.policies.raw_ms
        return 0 if raw_ms is None else now_ms() - raw_ms + HORIZON_MARGIN_MS

    def flush(self) -> int:
        """Nothing to flush (writes are synchronous); for code written for ``Vault``."""
        return 0

    def flush_other_buffers(self) -> int:
        return 0

    def _check_horizon(self, samples: pa.Table) -> None:
        check_horizon(
            samples,
            self.min_writable_ms(),
            f"InfluxDB drops points older than the raw retention policy {self.policies.raw} "
            f"({format_duration_ms(self.policies.raw_ms or 0)}, less a 5-minute margin). "
            "Nothing was written; drop samples that old, or raise retention_raw and run "
            "`metricvault influx setup` again",
        )

    def _prefix_column(self, series: list[tuple[int, str, str, str]], sids: Any) -> pa.Array:
        """Each sample's line prefix ``metric,tags value=``; LabelError (before anything is
        sent) for labels InfluxDB cannot hold."""
        mine = {
            sid: self._prefixes.get(sid) or series_prefix(metric, json.loads(labels_json))
            for sid, metric, labels_json, _ in series
        }
        if len(self._prefixes) + len(mine) > _PREFIX_CACHE_MAX:
            self._prefixes.clear()
        self._prefixes.update(mine)
        return _per_row(mine, sids)

    def _store_kinds(
        self, series: list[tuple[int, str, str, str]], kinds: Mapping[str, str]
    ) -> None:
        metrics = {metric for _, metric, _, _ in series}
        changed = {m: k for m, k in kinds.items() if m in metrics and self._kind_of(m, None) != k}
        if changed:
            self.set_metric_kinds(changed)

    def _kind_of(self, metric: str, given: str | None) -> str:
        return self.index.kind_of_metric(metric) or given or kind_from_name(metric)

    # ------------------------------------------------------------------ reading
    @property
    def experiments(self) -> meta.InfluxExperiments:
        """The experiment registry: ``vault.experiments.create("r3", '{job="r3"}')``."""
        return meta.InfluxExperiments(self.client, self.policies.meta)

    def refresh(self, selector: SelectorUnion | None = None) -> None:
        """Pick up series other writers created (only the selector's metrics when it names
        them all)."""
        metrics = {p.metric for p in selector.parts} if selector is not None else {None}
        source = (
            ""
            if None in metrics
            else " FROM " + ", ".join(ident(m) for m in sorted(m for m in metrics if m))
        )
        for result in self.client.query(f"SHOW SERIES{source}", chunked=True):
            for series in result.get("series", []):
                for (key,) in series.get("values", []):
                    self._add_series_key(str(key))

    def _add_series_key(self, key: str) -> None:
        measurement, tags = parse_series_key(key)
        try:
            s = series_from_point(measurement, tags)
        except LabelError:  # metricvault's own metadata, or foreign data it cannot name
            return
        if s.series_id not in self.index:
            self.index.add(s.series_id, s.metric, s.labels_json, self._kind_of(s.metric, None))

    def query(
        self,
        selector: str,
        start: TimeLike = "-1h",
        end: TimeLike = "now",
        step: str | int | None = None,
        aggs: Sequence[str] = ("mean",),
        output: str = "pandas",
        stale_markers: bool = False,
    ) -> Any:
        """Samples or per-step aggregates for the series matching a PromQL selector, in the
        same long shape as ``Vault.query`` (see there). Steps of whole minutes read the
        1-minute rollups where they are complete, everything else raw samples. InfluxDB holds
        no NaN, ±Inf or staleness markers (``write`` leaves them out), so ``stale_markers``
        changes nothing here."""
        return run_query(
            selector, start, end, step, aggs, output, self._query_reader, stale_markers
        )

    def _query_reader(self, selector: SelectorUnion) -> InfluxReader:
        self.refresh(selector)
        return self._reader()

    def sample_reader(self) -> InfluxReader:
        """What the archive export reads through (raw samples and partials over the
        policies), after picking up series other writers created."""
        self.refresh()
        return self._reader()

    def _reader(self) -> InfluxReader:
        return InfluxReader(
            self.client,
            self.index,
            self.policies.raw,
            self.policies.longterm,
            self._lookback,
            self._raw_horizon(),
            lambda: meta.pending_since(self.client, self.policies.meta),
        )

    # ------------------------------------------------------------------ the read seam
    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        """Raw samples in ``[start_ms, end_ms]`` (both ends included) of the series the
        matchers select (:class:`metricvault.protocols.SampleSource`)."""
        reader = self._query_reader(SelectorUnion((Selector(tuple(matchers)),)))
        return selecting.select_samples(reader, matchers, start_ms, end_ms)

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        """None: the 1-minute rows InfluxDB keeps (the continuous query's fields) hold no
        bucket's first sample and its time, which the rollup path needs to be exact, so
        range functions read raw samples (within the raw retention policy)."""
        return None

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        """Raw samples (InfluxDB's rollup rows keep no sample times to return)."""
        return self.select(matchers, start_ms, end_ms)

    def horizons(self) -> Horizons:
        """The raw policy's horizon; no rollups the seam reads (``select_buckets``)."""
        return Horizons(self._raw_horizon(), 0, self._lookback)

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        return None

    def _raw_horizon(self) -> int:
        """Raw samples before this are gone (InfluxDB accepts none older and drops them)."""
        raw_ms = self.policies.raw_ms
        return 0 if raw_ms is None else now_ms() - raw_ms

    def series(
        self,
        selector: str | None = None,
        output: str = "pandas",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> Any:
        """The series table (id, metric, kind, labels as columns), optionally filtered.
        InfluxDB's series keys carry no times here: ``start_ms``/``end_ms`` narrow nothing."""
        from metricvault.store.introspect import series_frame

        self.refresh(parse_selectors(selector) if selector else None)
        return series_frame(cast(Any, self), selector, output, start_ms, end_ms)

    def sql(self, statement: str, output: str = "pandas") -> Any:
        raise UnsupportedError(SQL_UNSUPPORTED)

    def catalog_version(self) -> Any:
        raise UnsupportedError(
            "catalog versions exist only on the embedded store: InfluxDB keeps no versions "
            "of its data. Freeze an experiment with `metricvault archive export` instead"
        )

    def snapshot(self) -> Any:
        """The old name of :meth:`catalog_version`: documented API (docs/influxdb.md)."""
        return self.catalog_version()

    def stats(self, now: int | None = None) -> dict[str, Any]:
        """Series, and points/series/bytes/coverage per policy (from SHOW and count queries);
        the same keys as ``Vault.stats`` where they mean something here."""
        from metricvault.store.backends.influx_stats import stats

        self.refresh()
        return stats(self, now_ms() if now is None else now)

    # ------------------------------------------------------------------ maintenance
    def maintain(
        self, now_ms: int | None = None, progress: bool | Callable[[str, int, int], None] = False
    ) -> dict[str, Any]:
        """Recompute the 1-minute rollups of every minute that received writes since the last
        run (late and out-of-order data included), with the continuous query's own SELECT, and
        the ``increase`` of counters; then delete the markers it consumed. Idempotent; safe to
        kill (the markers stay until their minutes are rolled up). Retention is InfluxDB's."""
        from metricvault.store.backends.influx_stats import maintenance_report

        self.refresh()
        self.index.set_metric_kinds(meta.load_kinds(self.client, self.policies.meta))
        markers = meta.read_markers(self.client, self.policies.meta)
        spans = self._rollup_spans(markers)
        minutes = 0
        for measurement, span_list in spans.items():
            for a, b in span_list:
                self._roll_up(measurement, a, b)
                minutes += (b - a) // MINUTE_MS
        meta.delete_markers(self.client, markers)
        return maintenance_report(self, markers, minutes)

    def _rollup_spans(self, markers: list[meta.Marker]) -> dict[str, list[tuple[int, int]]]:
        """Per measurement, merged minute ranges to recompute, cut into pieces of at most a
        day; a counter's range reaches one lookback further (its next sample's increase)."""
        ranges: dict[str, list[tuple[int, int]]] = {}
        for m in markers:
            reach = self._lookback if self._is_counter_metric(m.measurement) else 0
            end = -(-(m.hi + MINUTE_MS + reach) // MINUTE_MS) * MINUTE_MS
            ranges.setdefault(m.measurement, []).append((m.lo, end))
        return {name: _cut(_merge(spans), MAX_ROLLUP_SPAN_MS) for name, spans in ranges.items()}

    def _is_counter_metric(self, metric: str) -> bool:
        return self._kind_of(metric, None) == "counter" or any(
            self.index.is_counter(s) for s in self.index.match(parse_selectors(metric))
        )

    def _roll_up(self, measurement: str, start: int, end: int) -> None:
        self.client.query(
            rollup_into(self.client.target.database, self.policies, measurement, start, end)
        )
        counters = [
            s for s in self.index.match(parse_selectors(measurement)) if self.index.is_counter(s)
        ]
        if counters:
            self._write_increase(counters, start, end)

    def _write_increase(self, counters: list[int], start: int, end: int) -> None:
        """The reset-corrected ``increase`` of each minute, from raw samples with the embedded
        store's code, as field ``increase_value`` next to the continuous query's fields."""
        reader = self._reader()
        samples = reader.raw_samples(counters, start - self._lookback, end)
        partials = rollup.raw_partials(
            samples,
            pa.array(counters, pa.int64()),
            width=MINUTE_MS,
            origin=0,
            since=start,
            until=end,
            lookback=self._lookback,
        )
        if partials.num_rows == 0:
            return
        infos = {s: self.index.get(s) for s in counters}
        prefixes = {s: series_prefix(i.metric, i.labels, INCREASE_FIELD) for s, i in infos.items()}
        column = _per_row(prefixes, partials["series_id"])
        for body in encode_points(column, partials["increase"], partials["ts"], BATCH_POINTS):
            self.client.write(body, self.policies.longterm)


# --------------------------------------------------------------------------- helpers
def _check_setup(client: InfluxClient, pol: Policies) -> None:
    target = client.target
    fix = f"run `metricvault influx setup --url {target.uri}`"
    if target.database not in show_databases(client):
        raise NotFoundError(
            f"database {target.database!r} does not exist on {target.base_url}: {fix}"
        )
    missing = sorted(set(pol.wanted()) - set(show_policies(client, target.database)))
    if missing:
        raise NotFoundError(
            f"database {target.database!r} on {target.base_url} lacks the retention "
            f"polic{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)} (named after "
            f"retention_raw={format_duration_ms(pol.raw_ms) if pol.raw_ms else 'forever'} and "
            f"retention_1m): {fix}"
        )


def _per_row(per_series: dict[int, str], sids: Any) -> pa.Array:
    """Each row's string from its series (``sids``: an Arrow column of series ids)."""
    uniq, inverse = np.unique(sids.to_numpy(), return_inverse=True)
    values = pa.array([per_series[int(s)] for s in uniq], pa.string())
    return values.take(pa.array(inverse.astype(np.int64)))


def _touched(samples: pa.Table, metric_of: dict[int, str]) -> dict[str, tuple[int, int]]:
    """measurement -> (first, last) timestamp written to it."""
    grouped = samples.group_by("series_id", use_threads=False).aggregate(
        [("ts", "min"), ("ts", "max")]
    )
    touched: dict[str, tuple[int, int]] = {}
    for sid, lo, hi in zip(
        *(grouped[c].to_pylist() for c in ("series_id", "ts_min", "ts_max")), strict=True
    ):
        metric = metric_of[sid]
        old = touched.get(metric, (lo, hi))
        touched[metric] = (min(old[0], lo), max(old[1], hi))
    return touched


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _cut(spans: list[tuple[int, int]], width: int) -> list[tuple[int, int]]:
    return [(a, min(b, a + width)) for lo, b in spans for a in range(lo, b, width)]


def _state_dir(settings: Settings, client: InfluxClient) -> Path:
    """Local lock files of a gateway serving this database (``state_dir`` if set)."""
    if settings.state_dir:
        return Path(settings.state_dir)
    target = client.target
    digest = hashlib.sha1(f"{target.base_url}|{target.database}".encode()).hexdigest()[:8]
    return Path(".metricvault-state") / f"influx-{target.database}-{digest}"
