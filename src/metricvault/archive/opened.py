"""A snapshot file opened with the vault's query API: ``Vault.open("r3.parquet").query(...)``.

Reads only the row groups that hold the selected series (the snapshot's metadata maps each
series to its row range) and answers with the same aggregation code and output shape as the
vault, so a figure made from the vault can be remade from the snapshot years later.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricvault.archive.snapshot_format import (
    ROLLUP_COLUMNS,
    TIER_MS,
    SnapshotInfo,
    read_info,
    read_metadata,
)
from metricvault.config import Settings
from metricvault.durations import TimeLike, now_ms, parse_duration_ms, parse_time_ms
from metricvault.errors import InputError, ReadOnlyError, TimeRangeError, UnsupportedError
from metricvault.experiment import Experiment, experiments_table
from metricvault.model import SAMPLE_SCHEMA, TIERS
from metricvault.protocols import (
    BucketSelection,
    Horizons,
    SelectHints,
    SeriesSamples,
    require,
)
from metricvault.selector import Matcher, parse_selectors
from metricvault.store import query as q
from metricvault.store import rollup
from metricvault.store.introspect import empty_view
from metricvault.store.reading import answer
from metricvault.store.selecting import select_samples
from metricvault.store.series_index import SeriesIndex
from metricvault.tables import convert


class SnapshotVault:
    """Read-only, query-compatible view of one snapshot file."""

    capabilities = frozenset({"read", "sql"})
    backend_name = "experiment snapshot"
    unsupported_hint = (
        "A snapshot is a frozen, read-only file: query it, or open the vault directory it was "
        "exported from (or `metricvault archive restore` it into one) to do that."
    )

    def __init__(self, path: str | Path, settings: Settings | None = None) -> None:
        self.path = Path(path)
        meta = read_metadata(self.path)
        self.info: SnapshotInfo = read_info(self.path, meta)
        self.tier = self.info.tier
        self.index = SeriesIndex()
        self._rows: dict[int, tuple[int, int]] = {}
        self._prev: dict[int, tuple[int, float]] = {}  # counters: last sample before the start
        for sid, metric, labels, kind, first, n, *rest in json.loads(meta["series"]):
            self.index.add(sid, metric, labels, kind)
            self._rows[sid] = (first, n)
            if rest and rest[0] is not None:
                self._prev[sid] = (int(rest[0][0]), float(rest[0][1]))
        self._group_rows = int(meta["row_group_rows"])
        self._file = pq.ParquetFile(self.path)
        settings = settings or Settings.load()
        self._lookback = parse_duration_ms(settings.counter_lookback)
        self.lookback_ms = self._lookback

    @property
    def experiment(self) -> Experiment:
        return self.info.experiment

    @property
    def uri(self) -> str:
        return str(self.path)

    @property
    def experiments(self) -> Any:
        """A snapshot holds one experiment (:attr:`experiment`), not a registry: says so."""
        require(self, "experiments", str(self.path))

    def __enter__(self) -> SnapshotVault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    # ------------------------------------------------------------------ queries
    def query(
        self,
        selector: str,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        step: str | int | None = None,
        aggs: Sequence[str] = ("mean",),
        output: str = "pandas",
        stale_markers: bool = False,
    ) -> Any:
        """As :meth:`Vault.query`; ``start``/``end`` default to the snapshot's whole range."""
        t0, t1 = self._window(start, end)
        step_ms = q.parse_step(step)
        if step_ms is None and self.tier != "raw":
            raise InputError(
                f"{self.path.name} holds {self.tier} rollups, not raw samples: pass a step "
                f"that is a multiple of {self.tier} (or step='all')"
            )
        if step_ms is not None:
            self._check_step(step_ms)
        agg_names = q.check_aggs(aggs) if step_ms is not None else ()
        sel = parse_selectors(selector)
        return answer(self, sel, t0, t1, step_ms, agg_names, output, stale_markers)

    # the SampleReader the shared query layer (metricvault.store.reading) reads through
    raw_horizon_ms = 0  # a snapshot holds its whole range

    def raw_samples(self, series_ids: list[int], start: int, end: int) -> pa.Table:
        return self._read(series_ids, start, end)

    def partials(self, series_ids: list[int], start: int, end: int, step: int) -> pa.Table:
        self._check_step(step)
        return self._aggregate(series_ids, start, end, step)

    # the read seam (metricvault.protocols.SampleSource): raw samples only
    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        """Raw samples in ``[start_ms, end_ms]`` (both ends included): what the PromQL
        engine reads, so a query over the vault runs over its raw snapshot alike."""
        if self.tier != "raw":
            raise UnsupportedError(
                f"{self.path.name} holds {self.tier} rollups, not raw samples, and PromQL reads "
                "raw samples: query it with query(..., step=...), or export the experiment "
                "with --tier raw"
            )
        return select_samples(self, matchers, start_ms, end_ms)

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        """None: a snapshot holds one tier; the engine reads its raw samples."""
        return None

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        return self.select(matchers, start_ms, end_ms)

    def horizons(self) -> Horizons:
        return Horizons(0, 0, self._lookback)

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        return None

    def _check_step(self, step: int) -> None:
        res = TIER_MS.get(self.tier, 0)
        if res and step != -1 and step % res:
            raise InputError(
                f"{self.path.name} holds {self.tier} rollups: the step must be a multiple "
                f"of {self.tier}, got {step} ms"
            )

    def history(self, experiment: Any, metrics: Sequence[str], **options: Any) -> Any:
        """A frame indexed by training step, one column per metric: each metric's samples
        joined exactly to the ``train_step`` series (see ``metricvault.archive.compare.
        history``), e.g. ``vault.history("r3", metrics=["train_loss", "mfu"])``."""
        from metricvault.archive.compare import history

        return history(self, experiment, metrics, **options)

    def _window(self, start: TimeLike | None, end: TimeLike | None) -> tuple[int, int]:
        now = now_ms()
        last = self.info.last_ms if self.info.last_ms is not None else self.info.start_ms
        t0 = self.info.start_ms if start is None else parse_time_ms(start, now=now)
        default_end = max(self.info.end_ms or 0, last + 1)
        t1 = default_end if end is None else parse_time_ms(end, now=now)
        if t1 <= t0:
            raise TimeRangeError(f"start {start!r} is not before end {end!r}")
        return t0, t1

    def _aggregate(self, ids: list[int], t0: int, t1: int, step: int) -> pa.Table:
        res = TIER_MS.get(self.tier, 0)
        if step == -1:
            lo, hi = (t0 // res * res, -(-t1 // res) * res) if res else (t0, t1)
            width, origin = hi - lo, lo
        else:
            width, origin = step, 0
            lo, hi = t0 // step * step, -(-t1 // step) * step
        if not ids:
            return rollup.empty_partials()
        if res:
            rows = self._read(ids, lo, hi)
            partials = rollup.rollup_partials(rows, width=width, origin=origin, res=res)
        else:
            samples = self._with_prev(self._read(ids, lo - self._lookback, hi), ids, lo)
            counters = pa.array([s for s in ids if self.index.is_counter(s)], pa.int64())
            partials = rollup.raw_partials(
                samples,
                counters,
                width=width,
                origin=origin,
                since=lo,
                until=hi,
                lookback=self._lookback,
            )
        if step == -1:
            partials = partials.set_column(1, "ts", pa.array(np.full(partials.num_rows, t0)))
        return partials

    def _read(self, ids: list[int], t0: int, t1: int) -> pa.Table:
        """Rows of these series with ``t0 <= ts < t1``, as the store's raw/rollup tables."""
        value_cols = ["value"] if self.tier == "raw" else list(ROLLUP_COLUMNS)
        groups = sorted({g for s in ids for g in self._groups_of(s)})
        columns = ["series_id", "timestamp", *value_cols]
        if groups:
            table = self._file.read_row_groups(groups, columns=columns)
        else:
            table = pa.table({c: [] for c in columns})
        table = table.rename_columns(["series_id", "ts", *value_cols])
        if table.num_rows == 0:
            return _empty(self.tier)
        ts = table["ts"].cast(pa.int64())
        table = table.set_column(1, "ts", ts)
        mask = pc.and_(
            pc.is_in(table["series_id"], value_set=pa.array(ids, pa.int64())),
            pc.and_(pc.greater_equal(ts, t0), pc.less(ts, t1)),
        )
        return table.filter(mask)

    def _with_prev(self, samples: pa.Table, ids: list[int], lo: int) -> pa.Table:
        """Add each counter's pre-start sample where it serves as the lag of the first bucket."""
        prev = [
            (s, *self._prev[s])
            for s in ids
            if s in self._prev and lo - self._lookback <= self._prev[s][0] < lo
        ]
        if not prev:
            return samples
        extra = pa.table(
            [
                pa.array(c, t)
                for c, t in zip(zip(*prev, strict=True), SAMPLE_SCHEMA.types, strict=True)
            ],
            schema=SAMPLE_SCHEMA,
        )
        merged = pa.concat_tables([extra, samples.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)])
        return merged.sort_by([("series_id", "ascending"), ("ts", "ascending")])

    def _groups_of(self, series_id: int) -> range:
        first, n = self._rows[series_id]
        return range(first // self._group_rows, (first + n - 1) // self._group_rows + 1)

    # ------------------------------------------------------------------ introspection
    def series(
        self,
        selector: str | None = None,
        output: str = "pandas",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> Any:
        """The snapshot's series, optionally filtered: the vault's shape (series_id, metric,
        kind, one column per label), so code reading a vault reads a snapshot alike. A
        snapshot keeps no first/last-seen times: ``start_ms``/``end_ms`` narrow nothing."""
        from metricvault.store.introspect import series_frame

        return series_frame(self, selector, output, start_ms, end_ms)

    def sql(self, statement: str, output: str = "pandas") -> Any:
        """DuckDB SQL over the vault's views, so a query written against the vault runs here
        alike: ``raw`` or ``rollup_1m``/``rollup_1h`` (the tier the snapshot holds, the
        others empty, with the vault's columns), ``series``, ``experiments`` (one row: this
        snapshot's experiment), and ``snapshot`` (the file as written)."""
        con = duckdb.connect()
        con.execute(f"CREATE VIEW snapshot AS SELECT * FROM read_parquet('{_sql_path(self.path)}')")
        for tier in TIERS:
            view = "raw" if tier == "raw" else f"rollup_{tier}"
            if tier == self.tier:
                con.execute(f"CREATE VIEW {view} AS {_VIEW_SQL[tier == 'raw']}")
            else:
                con.register(f"{view}_src", empty_view(tier))
                con.execute(f"CREATE VIEW {view} AS SELECT * FROM {view}_src")
        con.register("series", self.index.to_table())
        con.register("experiments", experiments_table([self.experiment]))
        try:
            return convert(rollup.fetch_arrow(con, statement), output)
        except duckdb.Error as exc:
            raise InputError(f"SQL failed on snapshot {self.path.name}: {exc}") from exc
        finally:
            con.close()

    def stats(self, now: int | None = None) -> dict[str, Any]:
        i = self.info
        return {
            "snapshot": str(i.path),
            "experiment": i.experiment.id,
            "git_sha": i.experiment.git_sha,
            "tier": i.tier,
            "series": i.series,
            "rows": i.rows,
            "bytes": i.bytes,
            "bytes_per_row": i.bytes / i.rows if i.rows else None,
            "first_ms": i.first_ms,
            "last_ms": i.last_ms,
            "content_hash": i.content_hash,
        }

    # ------------------------------------------------------------------ not for snapshots
    def write(self, *args: Any, **kwargs: Any) -> int:
        raise ReadOnlyError(
            f"{self.path} is a frozen experiment snapshot and cannot be written to: write into "
            "a vault directory instead"
        )

    def maintain(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ReadOnlyError(f"{self.path} is a frozen snapshot: there is nothing to maintain")


# The vault's views (store/introspect.py) over the snapshot's rows: the same columns and types.
_KEYS = (
    "series_id, epoch_ms(timestamp) AS ts, make_timestamp(epoch_ms(timestamp) * 1000) AS timestamp"
)
_VIEW_SQL = {
    True: f"SELECT {_KEYS}, value FROM snapshot",
    False: f"SELECT {_KEYS}, count, sum, min, max, last, increase, sum / count AS mean "
    "FROM snapshot WHERE count > 0",
}


def _empty(tier: str) -> pa.Table:
    if tier == "raw":
        return SAMPLE_SCHEMA.empty_table()
    return rollup.empty_partials().select(["series_id", "ts", *ROLLUP_COLUMNS])


def _sql_path(path: Path) -> str:
    return str(path.resolve()).replace("'", "''")
