"""``Vault``: the public face of the store — write, query, SQL, maintenance, statistics."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricvault.config import Settings
from metricvault.durations import (
    DAY_MS,
    HOUR_MS,
    TimeLike,
    day_closed,
    day_of,
    ms_to_datetime,
    now_ms,
    parse_duration_ms,
)
from metricvault.errors import (
    BackpressureError,
    InputError,
    StorageError,
    TimeRangeError,
)
from metricvault.model import (
    KINDS,
    KindChange,
    KindUpdate,
    SeriesRows,
    admissible_write_kinds,
    explicit_metrics,
    kind_from_name,
    metadata_kind_update,
    validate_metric_name,
)
from metricvault.protocols import (
    BucketSelection,
    Horizons,
    SelectHints,
    SeriesSamples,
    bucket_columns,
)
from metricvault.selector import Matcher, Selector, SelectorUnion, parse_selectors
from metricvault.store import files as fmt
from metricvault.store import layout, selecting
from metricvault.store import query as q
from metricvault.store.buffer import IngestBuffer
from metricvault.store.catalog import Catalog, Change, DataFile, SeriesFile, Snapshot
from metricvault.store.checked_series import CheckedKeys
from metricvault.store.layout import Location, open_location
from metricvault.store.normalize import from_resolved, normalize
from metricvault.store.reader import FileCache, Reader, read_error
from metricvault.store.reading import SeriesArrays, check_horizon, run_query, select_series
from metricvault.store.series_index import (
    SERIES_FILES_COMPACT,
    SERIES_FILES_MAX,
    SeriesIndex,
    read_shards,
    series_spans,
    sharded_file,
)

if TYPE_CHECKING:
    from metricvault.store.experiments import Experiments
    from metricvault.store.maintenance import ProgressCallback

log = logging.getLogger("metricvault")


# seconds a write may go on checking against the catalog's snapshot in memory before
# reading the catalog again: how soon another process's retention reaches this one's writes
HORIZON_RECHECK_S = 1.0


class Vault:
    """A metric store on local disk or S3: the store itself. Users open it with
    ``metricvault.open(...)`` or ``metricvault.Vault.open(...)``, whose class adds the
    conveniences that live above the store (``history``, ``promql``, ``maintain(progress=True)``).

    >>> vault = Vault.open("./metricvault-data")
    >>> vault.write(frame)                       # durable when it returns
    >>> vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-7d", "now", step="1h",
    ...             aggs=("mean", "max"))
    """

    def __init__(
        self, location: Location, settings: Settings, buffer_name: str = layout.BUFFER_NAME
    ) -> None:
        self.settings = settings
        self.location = location
        self.catalog = Catalog(location)
        self.buffer = IngestBuffer(layout.buffer_file(location.state_dir, buffer_name))
        self.index = SeriesIndex(self._read_series_file)
        self.reader = Reader(location, FileCache(settings.cache_bytes))
        self._commit_lock = threading.RLock()  # catalog commits (flush, maintenance)
        self._write_lock = threading.Lock()  # buffer appends and the series index
        self._lock_file = open(location.state_dir / layout.VAULT_LOCK, "a+")  # noqa: SIM115
        self._lookback = parse_duration_ms(settings.counter_lookback)
        self._horizon_read_at = float("-inf")  # monotonic time of min_writable_ms' last read
        self._flusher: threading.Thread | None = None
        self._checked = CheckedKeys()  # series rows checked against the index (write path)
        self._flush_wanted = threading.Event()
        self._closed = threading.Event()
        self.last_flush_error: str | None = None  # shown by stats()
        self._pending_kinds: dict[str, str] = {}  # metadata to commit with the next flush
        self._pending_kind_changes: list[KindChange] = []  # ... and why (Snapshot.kind_changes)
        self._explicit_kinds: frozenset[str] = frozenset()  # set by an operator: metadata won't
        self._kind_changes_seen = -1  # len(snapshot.kind_changes) the index has the kinds of
        self._refused_logged: set[tuple[str, str]] = set()
        self._upgrade_catalog()
        self._load_series()
        self._pending_samples = self.buffer.depth()[0]

    # ------------------------------------------------------------------ opening
    capabilities = frozenset(
        {
            "read",
            "write",
            "maintain",
            "experiments",
            "sql",
            "serve",
            "export",
            "series_times",
            "catalog",
        }
    )
    backend_name = "embedded vault"

    @classmethod
    def open_local(
        cls,
        uri: str | None = None,
        settings: Settings | None = None,
        *,
        create: bool = True,
        buffer_name: str = "buffer",
        **overrides: Any,
    ) -> Self:
        """The embedded vault at a directory or ``s3://bucket/prefix`` (no other backend)."""
        settings = (settings or Settings.load()).with_overrides(**overrides)
        return cls(
            open_location(uri or settings.data, settings, create=create), settings, buffer_name
        )

    # ------------------------------------------------------------------ the store boundary
    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def state_dir(self) -> Path:
        return self.location.state_dir

    def buffered(self) -> tuple[int, int]:
        """Samples and bytes in this process's ingest buffer, not yet in data files."""
        return self.buffer.depth()

    def series_count(self) -> int:
        return len(self.index)

    def _upgrade_catalog(self) -> None:
        """Rewrite a format-1 catalog (absolute paths) with relative ones, once, on open."""
        from metricvault.errors import StorageError

        snap = self.catalog.current()
        if snap.version and not snap.vault_id:
            try:
                with self.writer_lock():
                    self.catalog.upgrade()
            except StorageError as exc:  # e.g. another process upgraded it first
                log.warning("catalog not upgraded on open (%s); the next commit does it", exc)

    def _load_series(self) -> None:
        self._load_new_series_files(self.catalog.current())
        self.index.load(self.buffer.all_series())

    def _load_new_series_files(self, snap: Snapshot) -> None:
        """Series that other writers (processes, buffers) registered and flushed: the index
        learns the files and reads each shard when it is first needed (series_index.py)."""
        self._load_kinds(snap)
        self.index.sync((sf.path, sf.shards) for sf in snap.series_files)

    def _read_series_file(
        self, path: str, shards: tuple[int, ...] | None, columns: list[str] | None
    ) -> pa.Table:
        try:
            with self.location.fs.open_input_file(path) as handle:
                return read_shards(pq.ParquetFile(handle, **fmt.VERIFY), shards, columns)
        except (OSError, pa.ArrowException) as exc:
            raise read_error(path, "series file", exc) from exc

    def _load_kinds(self, snap: Snapshot) -> None:
        """The metric kinds of ``snap`` (another process's ``kind set`` included), with the
        ones this process has applied but not committed yet on top."""
        with self._write_lock:
            self.index.set_metric_kinds(snap.metric_kinds)
            self.index.set_metric_kinds(self._pending_kinds)
            self._explicit_kinds = explicit_metrics(snap.kind_changes)
            self._kind_changes_seen = len(snap.kind_changes)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the background flusher and flush what is buffered."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._flush_wanted.set()
        if self._flusher:
            self._flusher.join()
        if not self.buffer.read_only:  # opened read-only on a full disk: nothing to flush to
            self.flush()
        self.buffer.close()
        self._lock_file.close()

    # ------------------------------------------------------------------ writing
    def write(
        self,
        data: Any,
        kinds: Mapping[str, str] | None = None,
        *,
        admit_new_series: Callable[[int], None] | None = None,
    ) -> int:
        """Store samples durably; returns how many. See :mod:`metricvault.store.normalize`.

        ``kinds`` maps metric names to ``"gauge"``/``"counter"`` where names do not tell.
        ``admit_new_series(n)`` is called with the number of series this write would create
        and may raise to refuse it (the gateway's cardinality limit). Nothing is written if any
        sample is invalid or the write is refused.
        """
        _refuse_unwritable(data)
        if kinds:  # for the series this write creates; a known kind stands (model.py)
            kinds = admissible_write_kinds(kinds, self._known_kinds(kinds))
        return self._write_batch(normalize(data, kinds), admit_new_series)

    def write_resolved(
        self,
        series_ids: Any,
        timestamps: Any,
        values: Any,
        series: list[tuple[int, str, str, str]],
        *,
        admit_new_series: Callable[[int], None] | None = None,
    ) -> int:
        """Store samples whose series a decoder already resolved (the gateway's fast path for
        series it has seen): per row its series id, and the distinct series as (series_id,
        metric, labels_json, kind). The same checks and durability as :meth:`write`."""
        batch = from_resolved(series_ids, timestamps, values, series)
        keys = series.keys if isinstance(series, SeriesRows) else None
        return self._write_batch(batch, admit_new_series, keys)

    def _write_batch(
        self,
        batch: Any,
        admit_new_series: Callable[[int], None] | None,
        keys: Any = None,
    ) -> int:
        """``keys``: the batch's SeriesRows keys; when this vault checked all of them before,
        no series is new and none can collide (checked_series.py), so neither is looked for."""
        if batch.samples.num_rows == 0:
            return 0
        self._check_horizon(batch.samples)
        self._check_backpressure()
        checked = keys is not None and self._checked.all_checked(keys)
        new = [] if checked else self.index.unknown(batch.series)
        if new and admit_new_series is not None:
            admit_new_series(len(new))
        if not checked:  # SeriesCollisionError if an id means another series
            self.index.check_known(batch.series)
        # Outside the write lock: concurrent appends share one commit and fsync (group
        # commit in the buffer); a series two of them introduce is stored once either way.
        self.buffer.append(batch.samples, new)
        with self._write_lock:
            for sid, metric, labels, kind in new:
                self.index.add(sid, metric, labels, kind)
            self._pending_samples += batch.samples.num_rows
            wake = self._pending_samples >= self.settings.flush_max_samples
        if keys is not None and not checked:
            self._checked.remember(keys)
        if wake:
            self._wake_flusher()
        return int(batch.samples.num_rows)

    def set_metric_kinds(self, kinds: Mapping[str, str]) -> KindUpdate:
        """Apply metric types from exposition metadata (remote_write, OTLP) by the rules of
        :func:`metricvault.model.metadata_kind_update`: ``unknown`` says nothing, and metadata
        never downgrades a counter nor changes a kind an operator set. An applied change
        decides how the metric's series roll up and are read from now on (rollup rows written
        before keep their columns); it is recorded in the catalog with the next flush. Refused
        changes are returned (the gateway counts them) and logged once per metric."""
        # Only metrics with stored series: metadata names families too (an OpenMetrics
        # counter `foo` of samples `foo_total`), and Prometheus re-sends it every minute, so
        # a metric whose series arrive later gets its kind from the next metadata.
        stored = {m: k for m, k in kinds.items() if self.index.has_series_of(m)}
        update = metadata_kind_update(
            stored, self._known_kinds(stored), self._explicit_kinds, now_ms()
        )
        for change in update.refused:
            if (change.metric, change.new) not in self._refused_logged:
                self._refused_logged.add((change.metric, change.new))
                log.warning(
                    "metadata says %s is a %s; it stays a %s (metadata never downgrades a "
                    "counter nor overrides `metricvault kind set`; set it with `metricvault "
                    "kind set %s %s` if the metric really changed)",
                    change.metric, change.new, change.old, change.metric, change.new,
                )  # fmt: skip
        if update.applied:
            with self._write_lock:
                for change in update.applied:
                    self._pending_kinds[change.metric] = change.new
                self._pending_kind_changes.extend(update.applied)
                self.index.set_metric_kinds({c.metric: c.new for c in update.applied})
            for change in update.applied:
                log.info("%s is a %s from now on (metadata; was %s)", *_shown(change))
        return update

    def _known_kinds(self, metrics: Iterable[str]) -> dict[str, str]:
        known = {}
        for metric in metrics:
            kind = self.index.kind_of_metric(metric)
            if kind is not None:
                known[metric] = kind
        return known

    def set_kind(self, metric: str, kind: str, source: str = "explicit") -> KindChange | None:
        """Set a metric's kind as an operator (``metricvault kind set``): it applies to every
        read and rollup from now on, metadata never changes it afterwards, and the change is
        committed (and recorded in ``Snapshot.kind_changes``) before this returns. Rollup rows
        written before keep their columns. None when the kind was already set so."""
        validate_metric_name(metric)
        if kind not in KINDS:
            raise InputError(
                f"kind {kind!r} for {metric} is not one of {', '.join(KINDS)}: say "
                f"`metricvault kind set {metric} counter` or `... gauge`"
            )
        with self.writer_lock():
            snap = self.catalog.current()
            old = snap.metric_kinds.get(metric) or self._stored_kind(metric)
            if old == kind and metric in explicit_metrics(snap.kind_changes):
                return None
            change = KindChange(metric, old, kind, now_ms(), source)
            self.catalog.commit(Change(metric_kinds={metric: kind}, kind_changes=[change]))
            with self._write_lock:
                self._pending_kinds.pop(metric, None)
                self._pending_kind_changes = [
                    c for c in self._pending_kind_changes if c.metric != metric
                ]
            self._load_kinds(self.catalog.current())
        return change

    def _stored_kind(self, metric: str) -> str:
        """The kind a metric's series were written with (the first one's), else its name's."""
        ids = self.index.match(_metric_selector(metric))
        return self.index.get(ids[0]).kind if ids else kind_from_name(metric)

    def kind_changes(self) -> tuple[KindChange, ...]:
        """Every recorded change of a metric's kind, oldest first (``metricvault kind list``)."""
        return self.catalog.current().kind_changes

    def min_writable_ms(self) -> int:
        """The oldest timestamp a write may carry.

        Once retention has dropped raw data before ``raw_horizon``, a late sample there (or
        within one counter lookback after it) could not be deduplicated or rolled up exactly,
        so it is refused rather than folded into the rollups approximately.

        The catalog's snapshot in memory answers (no I/O per write): it is this process's
        newest, replaced by each of its commits (its own retention is seen at once) and each
        of its reads. The catalog itself is read at most every ``HORIZON_RECHECK_S``, so
        another process's retention is seen within that; a sample it accepted meanwhile
        below the new horizon is kept in raw and not rolled up, as the flush says.
        """
        snap = self.catalog.cached()
        now = monotonic()
        if snap is None or now - self._horizon_read_at >= HORIZON_RECHECK_S:
            snap = self.catalog.current()
            self._horizon_read_at = now
        return self._min_writable(snap)

    def _min_writable(self, snap: Snapshot) -> int:
        if not snap.raw_horizon_ms:
            return 0
        return -(-(snap.raw_horizon_ms + self._lookback) // HOUR_MS) * HOUR_MS

    def check_writable(self, samples: pa.Table) -> None:
        """Raise what :meth:`write` would for these (normalized) samples' times, writing
        nothing: ``metricvault import`` checks a whole file before its first write."""
        self._check_horizon(samples)

    def _check_horizon(self, samples: pa.Table) -> None:
        check_horizon(
            samples,
            self.min_writable_ms(),
            f"raw data before that was dropped by retention (retention_raw="
            f"{self.settings.retention_raw}), so it can no longer be deduplicated or rolled up "
            "exactly. Nothing was written; drop samples that old, or raise retention_raw "
            "before they expire",
        )

    def _check_backpressure(self) -> None:
        if not self._pending_samples:
            return
        size = self.buffer.approx_bytes()  # counted in the file about once a second
        if size > self.settings.buffer_max_bytes:
            size = self.buffer.depth()[1]  # a refusal is decided on the exact count
        if size > self.settings.buffer_max_bytes:
            raise BackpressureError(
                f"ingest buffer holds {size} bytes, over buffer_max_bytes="
                f"{self.settings.buffer_max_bytes}: flushing is behind; retry shortly or raise "
                "the limit",
                retry_after_s=5,
            )

    def _wake_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="metricvault-flusher", daemon=True
            )
            self._flusher.start()
        self._flush_wanted.set()

    def _flush_loop(self) -> None:
        while not self._closed.is_set():
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._closed.is_set():
                return
            try:
                self.flush()
                self.last_flush_error = None
            except Exception as exc:  # writes stay durable in the buffer; retried next time
                log.exception("background flush failed; buffered samples are kept")
                self.last_flush_error = f"{type(exc).__name__}: {exc}"

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Serialise catalog commits with other threads and processes using this vault
        (inside, this thread reads the newest catalog version even where it is pinned)."""
        with self._commit_lock, self.catalog.unpinned():
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def flush(self) -> int:
        """Turn buffered samples into Parquet files, exactly once; returns samples flushed.

        Flushes what was buffered when it started, so it ends even under steady ingest."""
        total = 0
        with self.writer_lock():
            up_to = self.buffer.last_seq()
            while True:
                snap = self.catalog.current()
                done = snap.buffers.get(self.buffer.buffer_id, 0)
                self.buffer.discard_through(done)
                pending = self.buffer.pending(done, self.settings.flush_max_samples, up_to)
                if pending is None:
                    self._commit_kinds()
                    break
                self._commit_flush(snap, pending)
                self.buffer.discard_through(pending.max_seq)
                total += pending.samples.num_rows
            depth = self.buffer.depth()[0]  # writes may have arrived meanwhile
        with self._write_lock:
            self._pending_samples = depth
        return total

    def flush_other_buffers(self) -> int:
        """Flush the buffer files of other writers (e.g. gateway workers that have stopped).
        Safe while they run: flushes of one buffer are serialised by the writer lock and
        exactly-once by its watermark, whichever process does them."""
        total = 0
        for path in layout.buffer_files(self.location.state_dir):
            if path == self.buffer.path:
                continue
            other = Vault(self.location, self.settings, path.stem)
            try:
                total += other.flush()
                empty = other.buffer.depth()[0] == 0
            finally:
                other.buffer.close()
                other._lock_file.close()
            if empty and _owner_gone(path.stem):
                for leftover in path.parent.glob(path.name + "*"):
                    leftover.unlink(missing_ok=True)
        return total

    def _commit_kinds(self) -> None:
        with self._write_lock:
            kinds, self._pending_kinds = self._pending_kinds, {}
            changes, self._pending_kind_changes = self._pending_kind_changes, []
        if kinds:
            # an operator may have set some meanwhile (kind set, in another process)
            pinned = explicit_metrics(self.catalog.current().kind_changes)
            kinds = {m: k for m, k in kinds.items() if m not in pinned}
            changes = [c for c in changes if c.metric not in pinned]
        if kinds:
            self.catalog.commit(Change(metric_kinds=kinds, kind_changes=changes))

    def _commit_flush(self, snap: Snapshot, pending: Any) -> None:
        samples = fmt.sort_dedup(pending.samples)  # batches come in sequence order
        change = Change(buffers={self.buffer.buffer_id: pending.max_seq}, based_on=snap)
        file_id = snap.next_file_id
        day_no = pc.divide(samples["ts"], DAY_MS).to_numpy()
        days = _distinct(day_no)
        now = now_ms()
        for day in days:
            part = samples if len(days) == 1 else samples.filter(pa.array(day_no == day))
            level = self._flush_level(int(day), now)
            change.add.append(self.write_data_file(part, "raw", int(day), file_id, level))
            file_id += 1
        # new series, and known ones whose first/last-seen day moved (series_index.py)
        ids, first, last = series_spans(samples["series_id"].to_numpy(), samples["ts"].to_numpy())
        self.index.sync((sf.path, sf.shards) for sf in snap.series_files)
        self.index.need_series(ids.tolist())  # what the files say of these series' spans
        save = self.index.spans_to_save(ids, first, last)
        if pending.series.num_rows or save.any():
            # maintenance merges series files (compact_series_files); where none runs, past
            # SERIES_FILES_MAX this flush's file holds every series and replaces them all
            merge = len(snap.series_files) >= SERIES_FILES_MAX
            if merge:
                self.index.need_all()
                change.remove_series = {sf.path for sf in snap.series_files}
            rows = self.index.flush_rows(
                ids[save], first[save], last[save], pending.series, everything=merge
            )
            path = self.location.new_series_path(file_id, self.catalog.owner())
            data, shards = sharded_file(rows)
            self.location.write_file(path, data)
            change.add_series.append(SeriesFile(path, rows.num_rows, len(data), shards))
            file_id += 1
            save |= np.isin(ids, rows["series_id"].to_numpy())
        change.file_ids_used = file_id - snap.next_file_id
        change.dirty_add = self._dirty_hours_to_roll_up(samples["ts"].to_numpy(), snap)
        self.catalog.commit(change)
        self.index.observe(ids, first, last, save)

    def compact_series_files(self) -> int:
        """Merge the series files into one (layout 2, sharded) once there are
        ``SERIES_FILES_COMPACT`` of them, or any written before shards; returns the files
        merged (0: nothing to do). The caller holds the ``series`` claim (maintenance). Only
        series files are replaced, so a flush committed meanwhile rebases onto it; another
        maintainer's merge of the same files makes this one's commit a conflict."""
        with self.writer_lock():
            snap = self.catalog.current()
            files = snap.series_files
            old_layout = any(sf.shards is None for sf in files)
            if len(files) < SERIES_FILES_COMPACT and not (old_layout and files):
                return 0
            self.index.sync((sf.path, sf.shards) for sf in files)
            self.index.need_all()
            rows = self.index.file_rows()
            path = self.location.new_series_path(snap.next_file_id, self.catalog.owner())
            data, shards = sharded_file(rows)
            self.location.write_file(path, data)
            change = Change(
                add_series=[SeriesFile(path, rows.num_rows, len(data), shards)],
                remove_series={sf.path for sf in files},
                file_ids_used=1,
                based_on=snap,
            )
            self.catalog.commit(change)
            self.index.sync((sf.path, sf.shards) for sf in self.catalog.current().series_files)
        return len(files)

    def _dirty_hours_to_roll_up(self, ts: np.ndarray, snap: Snapshot) -> set[int]:
        """Hours to re-roll for these samples, except those whose raw data (or counter
        lookback) retention already dropped: re-rolling them would overwrite complete rollups
        with partial ones. Such samples can only reach a flush when another writer accepted
        them before retention ran; they are kept in raw, and said so loudly."""
        hours = dirty_hours(ts, self._lookback)
        bound = self._min_writable(snap)
        late = int((ts < bound).sum()) if bound else 0
        if late:
            log.warning(
                "%d sample(s) older than %s arrived after retention dropped raw data there; "
                "they are stored in raw but not rolled up (rollups there are final)",
                late,
                ms_to_datetime(bound),
            )
        return {h for h in hours if h * HOUR_MS >= bound}

    def _flush_level(self, day_no: int, now: int) -> int:
        """A flush into a day still receiving data is written at the fast level: compaction
        merges the day's files at ``fmt.ZSTD_LEVEL`` once it is closed. A closed day (backfill,
        late data, an import) may get no other file to merge with, so it is written at
        ``fmt.ZSTD_LEVEL`` at once (``durations.day_closed``, as maintenance decides it)."""
        return fmt.ZSTD_LEVEL if day_closed(day_no, self._lookback, now) else fmt.FLUSH_ZSTD_LEVEL

    def write_data_file(
        self, table: pa.Table, tier: str, day_no: int, file_id: int, zstd: int = fmt.ZSTD_LEVEL
    ) -> DataFile:
        """Encode ``table`` (sorted by series_id, ts) as one Parquet file of ``tier``/day (a
        flush's at ``fmt.FLUSH_ZSTD_LEVEL``: compaction rewrites them at ``fmt.ZSTD_LEVEL``)."""
        day = day_of(day_no * DAY_MS)
        path = self.location.new_data_path(tier, day, file_id, self.catalog.owner())
        cols = fmt.RAW_FLOATS if tier == "raw" else fmt.ROLLUP_FLOATS
        data = fmt.write_parquet(table, cols, zstd_level=zstd)
        self.location.write_file(path, data)
        ts = table["ts"]
        return DataFile(
            path=path,
            tier=tier,
            day=day,
            rows=table.num_rows,
            bytes=len(data),
            min_ts=int(pc.min(ts).as_py()),
            max_ts=int(pc.max(ts).as_py()),
            file_id=file_id,
        )

    # ------------------------------------------------------------------ reading
    @property
    def experiments(self) -> Experiments:
        """The experiment registry: ``vault.experiments.create("r3", '{job="r3"}')``."""
        from metricvault.store.experiments import Experiments

        return Experiments(self.location)

    def catalog_version(self) -> Snapshot:
        """The current catalog version: the immutable list of files that make up the vault
        now (``.version``, ``.files``, ``.dirty_hours``). Not an experiment snapshot file
        (``metricvault archive export``): those are opened with ``Vault.open("x.parquet")``."""
        return self.catalog.current()

    def pinned(self) -> AbstractContextManager[Snapshot]:
        """``with vault.pinned():`` the reads on this thread see one catalog version, the one
        current on entry, moved on only by this process's own commits (its flushes: what it
        acknowledged stays readable): the query API evaluates each query in one
        (``Catalog.pinned``)."""
        return self.catalog.pinned()

    def snapshot(self) -> Snapshot:
        """The old name of :meth:`catalog_version`: documented API (docs/storage-format.md)."""
        return self.catalog_version()

    def refresh(self) -> None:
        """Pick up series that other processes registered (queries do this by themselves)."""
        self._load_new_series_files(self.catalog.current())

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
        """Samples or per-step aggregates for the series matching a PromQL selector.

        Returns the long shape: ``timestamp`` (UTC), ``metric``, one column per label name,
        then ``value`` (``step=None``: raw samples in ``[start, end)``) or one column per
        aggregate in ``aggs`` (``mean, min, max, count, sum, last, increase``). ``step`` is a
        duration (``"1m"``, ``"1h"``, ``"1d"``) — buckets are aligned to multiples of it — or
        ``"all"`` for one bucket over the whole range. ``start``/``end`` take datetimes, ISO
        strings, epoch ms, ``"now"`` and relative forms like ``"-30d"``.

        NaN and ±Inf samples are values. Prometheus staleness markers are stored but left out
        of raw samples unless ``stale_markers=True`` (what the PromQL engine reads); aggregates
        count finite samples only.
        """
        return run_query(
            selector, start, end, step, aggs, output, self._query_reader, stale_markers
        )

    def select_series(
        self,
        selector: str | Selector | SelectorUnion | Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        *,
        stale_markers: bool = True,
    ) -> list[SeriesArrays]:
        """The raw samples in ``[start_ms, end_ms)`` (epoch ms, half-open like ``query``) of
        each series the selector (PromQL text, a parsed selector, or matchers) matches, as
        ``(labels, ts, values)``: ``labels`` with ``__name__``, ``ts`` int64 ms ascending,
        ``values`` float64 holding NaN samples and (``stale_markers``) Prometheus staleness
        markers bit for bit. The same samples as ``query(..., output="arrow")`` without the
        long shape; what :meth:`select` (the PromQL engine's read) returns."""
        if isinstance(selector, str):
            sel: Selector | SelectorUnion = parse_selectors(selector)
        elif isinstance(selector, (Selector, SelectorUnion)):
            sel = selector
        else:
            sel = Selector(tuple(selector))
        if end_ms <= start_ms:
            raise TimeRangeError(f"start {start_ms} is not before end {end_ms}")
        reader = self._query_reader(sel)
        return select_series(reader, sel, int(start_ms), int(end_ms), stale_markers)

    def _query_reader(self, _selector: Any) -> q.ContextReader:
        self.flush_for_read()
        return q.ContextReader(self._context())

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        """About how many raw samples one row of ``tier`` summarises over ``[start_ms,
        end_ms)``, from the catalog's row counts (None: no rows of that tier there). Below
        about 2 (a scrape interval as long as the bucket) the tier reads no fewer rows than raw."""
        snap = self.catalog_version()

        def rows(name: str) -> float:
            total = 0.0
            for f in snap.tier_files(name):
                overlap = min(end_ms, f.max_ts + 1) - max(start_ms, f.min_ts)
                if overlap > 0:
                    total += f.rows * overlap / max(f.max_ts + 1 - f.min_ts, 1)
            return total

        tier_rows = rows(tier)
        return rows("raw") / tier_rows if tier_rows else None

    def buckets(
        self,
        selector: str | Selector,
        start_ms: int,
        end_ms: int,
        width_ms: int,
        inner: tuple[int, int] | None = None,
        inner_width_ms: int = 0,
        sketches: bool = True,
        columns: Sequence[str] | None = None,
    ) -> q.Buckets:
        """Per-series summaries of ``width_ms`` buckets over ``[start_ms, end_ms)`` from the
        coarsest tiers that hold them exactly (raw where rollups are not done yet): what the
        PromQL engine answers ``rate``/``*_over_time`` from (``select_buckets``); with
        ``columns`` (and no ``sketches``) only those summary columns are read and kept."""
        self.flush_for_read()
        ctx = self._context()
        sel = parse_selectors(selector) if isinstance(selector, str) else selector
        ids = ctx.index.match(sel)
        return q.buckets(
            ctx, ids, start_ms, end_ms, width_ms, inner, inner_width_ms, sketches, columns
        )

    # ------------------------------------------------------------------ the read seam
    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        """The samples in ``[start_ms, end_ms]`` (both ends included) of the series the
        matchers select, staleness markers included (:class:`metricvault.protocols.
        SampleSource`, what the PromQL engine reads); for an instant selector (``hints``)
        only the samples it can take (``selecting.instant_times``)."""
        reader = self._query_reader(None)
        return selecting.select_samples(reader, matchers, start_ms, end_ms, hints)

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        """Rollup rows that answer ``hints`` from the tier the planner chooses
        (``store.query.plan_buckets``), or None: read raw samples."""
        horizons = self.horizons()
        choice = q.plan_buckets(hints, horizons, self.samples_per_row)
        if choice is None:
            return None
        start, end = q.bucket_span(hints, choice, horizons.counter_lookback_ms)
        sel = Selector(tuple(matchers))
        if choice.finite_raw:  # a NaN or staleness marker may be the answer: rows keep neither
            self.flush_for_read()
            ctx = self._context()
            if not q.raw_all_finite(ctx, ctx.index.match(sel), start, end):
                return None
        # only quantile_over_time reads the rows' sketches (two thirds of a 1m row's bytes),
        # and each function only some of the other columns
        sketches = hints.func == "quantile_over_time"
        columns = bucket_columns(hints.func)
        found = self.buckets(
            sel, start, end, choice.res, choice.inner, choice.inner_res, sketches, columns
        )
        return selecting.to_selection(found, choice, columns)

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        """Raw samples; before the raw horizon each minute's first and last sample from the
        1m rollups (real samples at their times; docs/promql.md, "remote_read")."""
        sel = Selector(tuple(matchers))
        minute = q.BucketChoice(selecting.MINUTE_MS, False, 0)
        return selecting.kept_samples(
            lambda lo, hi: self.select(matchers, lo, hi),
            lambda lo, hi: selecting.to_selection(
                self.buckets(sel, lo, hi, selecting.MINUTE_MS), minute
            ),
            self.horizons().raw_start_ms,
            start_ms,
            end_ms,
        )

    def horizons(self) -> Horizons:
        snap = self.catalog_version()
        return Horizons(snap.raw_horizon_ms or 0, snap.rollup_watermark_ms(), self._lookback)

    def flush_for_read(self) -> None:
        """Reads flush first, so they see every write so far. Where nothing can be written (a
        full disk) they answer from the data files alone, and say what that leaves out."""
        if not self._pending_samples:
            return
        try:
            if not self.buffer.read_only:
                self.flush()
                return
            reason = "the disk holding the ingest buffer is full"
        except (OSError, StorageError) as exc:
            reason = str(exc)
        log.warning(
            "this answer leaves out %d buffered sample(s), which cannot be flushed now (%s); "
            "they stay in the buffer and are flushed once that works again",
            self._pending_samples,
            reason,
        )

    def sample_reader(self, use_cache: bool = False) -> q.ContextReader:
        """What readers outside the query API (snapshot export) read through; buffered samples
        are flushed first, so they see everything written so far. One-pass scans leave the
        decoded-data cache alone (``use_cache=False``): it would only grow memory."""
        self.flush_for_read()
        return q.ContextReader(replace(self._context(), use_cache=use_cache))

    def _context(self) -> q.QueryContext:
        snap = self.catalog.current()
        if not self.index.tracks(sf.path for sf in snap.series_files):
            self._load_new_series_files(snap)
        elif len(snap.kind_changes) != self._kind_changes_seen:
            self._load_kinds(snap)
        return q.QueryContext(snap, self.reader, self.index, self._lookback)

    def series(
        self,
        selector: str | None = None,
        output: str = "pandas",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> Any:
        """The series table (id, metric, labels as columns, kind), optionally filtered by a
        selector and to the series with samples on a UTC day overlapping ``[start_ms,
        end_ms]`` (the series index's first/last-seen times, to the day; series from files
        older than those times count as always present)."""
        from metricvault.store.introspect import series_frame

        if start_ms is not None or end_ms is not None:
            self.flush_for_read()  # buffered series get their times
        self._context()  # picks up series other writers registered
        return series_frame(self, selector, output, start_ms, end_ms)

    def sql(self, statement: str, output: str = "pandas") -> Any:
        """Run DuckDB SQL over views ``raw``, ``rollup_1m``, ``rollup_1h``, ``series`` and
        ``experiments``."""
        from metricvault.store.introspect import run_sql

        self._context()
        return run_sql(self, statement, output)

    def stats(self, now: int | None = None) -> dict[str, Any]:
        """Series count, rows/bytes/coverage per tier, bytes per sample, rollup lag, buffer."""
        from metricvault.store.introspect import stats

        return stats(self, now)

    # ------------------------------------------------------------------ maintenance
    def maintain(
        self, now_ms: int | None = None, progress: bool | ProgressCallback = False
    ) -> dict[str, Any]:
        """Flush, compact, roll up, apply retention and expire snapshots. Idempotent.

        ``progress``: a ``ProgressCallback`` (``progress(step, done, total)``); True (a bar
        on the terminal) is drawn by ``metricvault.Vault``, above the store."""
        from metricvault.store.maintenance import maintain

        if progress is True:
            raise InputError(
                "maintain(progress=True) draws a terminal bar, which the store leaves to the "
                "public class: open the vault with metricvault.open(...) or "
                "metricvault.Vault.open(...), or pass a callback progress(step, done, total)"
            )
        return maintain(self, now_ms, progress or None)


def _owner_gone(buffer_name: str) -> bool:
    """A worker buffer ``buffer-worker-<pid>`` whose process no longer exists."""
    pid = layout.worker_pid(buffer_name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def dirty_hours(ts: np.ndarray, lookback_ms: int) -> set[int]:
    """Hours whose rollups change when samples at ``ts`` arrive (their own, and the hours
    within ``lookback`` after them, where a counter's next sample may now have a new prev)."""
    hours = _distinct(ts // HOUR_MS)
    reach = -(-lookback_ms // HOUR_MS)
    spread = np.unique(np.concatenate([hours + k for k in range(reach + 1)]))
    return {int(h) for h in spread}


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of integers over a short range (the days or hours of a flush), counted:
    a flush's million timestamps span a few hours, and a hash or sort of them cost ~50 ms."""
    if len(values) == 0:
        return np.unique(values)
    low, high = int(values.min()), int(values.max())
    if high - low > 1 << 16:
        return np.unique(values)
    return np.flatnonzero(np.bincount(values - low)) + low


def _refuse_unwritable(data: Any) -> None:
    """A clear InputError for what write cannot take (a Series, a string, a number, a dict),
    before normalize meets it as an AttributeError or a confusing tuple-unpacking message."""
    kind = type(data)
    name = f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    if kind.__name__ == "Series" and kind.__module__.startswith(("pandas", "polars")):
        hint = "a Series holds one column: pass a DataFrame with columns metric, timestamp, value"
    elif data is None or isinstance(data, (str, bytes, dict, int, float)):
        hint = "pass an Arrow table, a pandas/polars DataFrame or a list of tuples"
    else:
        return
    raise InputError(
        f"write cannot take {name}: it takes the long shape (metric, timestamp, value, label "
        f"columns) as an Arrow table or pandas/polars DataFrame, or (metric, labels_dict, "
        f"ts_ms, value) tuples; {hint}"
    )


def _metric_selector(metric: str) -> Selector:
    return Selector((Matcher("__name__", "=", metric),))


def _shown(change: KindChange) -> tuple[str, str, str]:
    return change.metric, change.new, change.old
