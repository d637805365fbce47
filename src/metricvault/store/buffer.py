"""The durable ingest buffer: SQLite in WAL mode with ``synchronous=FULL``.

``append`` returns only after the batch (and any series it introduces) is committed and
fsynced, so an acknowledged write survives ``kill -9`` and power loss. Appends from concurrent
threads share commits (group commit, as the WALs of Prometheus and VictoriaMetrics do): while
one transaction is being fsynced the next appends queue up, and the first of them commits all
queued batches in one transaction with one fsync; each caller returns only after the commit
that holds its batch, and a failed commit fails every batch in it (none is stored).

Each buffer has a random id; the catalog records, per buffer id, the highest sequence number
already turned into Parquet files. A flush that crashed before its catalog commit is simply
redone, and one that crashed after it finds its batches at or below the watermark and deletes
them: exactly once.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from metricvault.errors import CorruptBatch, DiskFullError, StorageError
from metricvault.fsutil import write_atomically
from metricvault.model import SAMPLE_SCHEMA, SERIES_SCHEMA
from metricvault.store.layout import QUARANTINE_DIR

log = logging.getLogger("metricvault")
_FULL_BELOW_BYTES = 64 * 1024  # less free than a WAL file's first frames need
DISK_FULL_RETRY_S = 30  # freeing disk space takes a person or a cleanup job, not a moment

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    samples INTEGER NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS series (
    series_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    metric TEXT NOT NULL,
    labels TEXT NOT NULL,
    kind TEXT NOT NULL
);
"""


_SHRINK_FREE_PAGES = 2048  # 8 MiB of 4 KiB pages
# How stale the payload bytes counted in this process (``approx_bytes``) may get before they are
# counted again in the file: other processes may append to (CLI writes) or flush the same file.
DEPTH_RECOUNT_S = 1.0


@dataclass
class _Queued:
    """One append waiting for the group commit that will hold it."""

    samples: int
    payload: bytes
    series: list[tuple[int, str, str, str]]
    seq: int = 0
    error: BaseException | None = None
    done: bool = False


@dataclass(frozen=True)
class Pending:
    """What a flush takes out of the buffer: samples and new series up to ``max_seq``."""

    max_seq: int
    samples: pa.Table
    series: pa.Table


class IngestBuffer:
    """The buffer file is created by the first write, not on open: reading a vault (stats,
    query) must work where nothing can be written, e.g. on a full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._queue: list[_Queued] = []  # appends waiting for the next group commit
        self._queue_changed = threading.Condition(threading.Lock())
        self._committing = False  # a thread is committing a group (and others queue)
        self.commits = 0  # transactions (fsyncs) appends took: appends / commits = group size
        # payload bytes waiting to be flushed as last counted in the file, plus this process's
        # appends since (``approx_bytes``); None: count again
        self._bytes: int | None = None
        self._bytes_counted_at = 0.0
        self._conn: sqlite3.Connection | None = None
        self._id = ""
        self.read_only = False  # opened for reading only: nothing could be written there
        if path.exists():
            try:
                self._connect()
            except DiskFullError:
                self._connect_read_only()

    def _connect_read_only(self) -> None:
        """Opening a WAL database writes its -shm and -wal files, which a full disk refuses.
        ``immutable`` reads the main file without them: everything up to the last checkpoint
        (a clean close checkpoints all). Appends reconnect for writing (:meth:`append`)."""
        try:
            db = sqlite3.connect(f"file:{self.path}?immutable=1", uri=True, check_same_thread=False)
            row = db.execute("SELECT value FROM meta WHERE key='buffer_id'").fetchone()
        except sqlite3.Error as exc:
            raise self._storage_error(exc, "cannot open ingest buffer") from exc
        self._conn, self._id, self.read_only = db, str(row[0]) if row else "", True

    @property
    def _db(self) -> sqlite3.Connection:
        return self._conn if self._conn is not None else self._connect()

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            db.executescript(_SCHEMA)
            self._conn = db
            self._id = self._load_id()
        except sqlite3.Error as exc:
            self._conn = None
            raise self._storage_error(exc, "cannot open ingest buffer") from exc
        return db

    def _writable(self) -> sqlite3.Connection:
        if self.read_only and self._conn is not None:
            self._conn.close()
            self._conn, self.read_only = None, False
        return self._db

    def _absent(self) -> bool:
        """Nothing was ever written here: read as empty without creating the file."""
        return self._conn is None and not self.path.exists()

    @property
    def buffer_id(self) -> str:
        """This buffer's id in the catalog's watermarks; "" while the file does not exist
        (no watermark can name it yet, and asking must not create it)."""
        if self._absent():
            return ""
        self._db  # noqa: B018 (connects)
        return self._id

    def _load_id(self) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key='buffer_id'").fetchone()
        if row:
            return str(row[0])
        new_id = uuid.uuid4().hex
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('buffer_id', ?)", (new_id,))
        row = self._db.execute("SELECT value FROM meta WHERE key='buffer_id'").fetchone()
        return str(row[0])

    def append(self, samples: pa.Table, new_series: Iterable[tuple[int, str, str, str]]) -> int:
        """Durably store one batch; returns its sequence number once it is fsynced."""
        mine = _Queued(samples.num_rows, _to_ipc(samples), list(new_series))
        with self._queue_changed:
            self._queue.append(mine)
            while not mine.done:
                if self._committing:
                    self._queue_changed.wait()
                    continue
                group, self._queue, self._committing = self._queue, [], True
                self._queue_changed.release()
                try:
                    self._commit_group(group)
                finally:
                    self._queue_changed.acquire()
                    self._committing = False
                    self._queue_changed.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.seq

    def _commit_group(self, group: list[_Queued]) -> None:
        """One transaction (one fsync) for every batch of ``group``; all stored or none."""
        error: BaseException | None = None
        with self._lock:
            try:
                self._writable()
                self._db.execute("BEGIN IMMEDIATE")
                for queued in group:
                    cur = self._db.execute(
                        "INSERT INTO batches (samples, payload) VALUES (?, ?)",
                        (queued.samples, queued.payload),
                    )
                    queued.seq = int(cur.lastrowid or 0)
                    self._db.executemany(
                        "INSERT OR IGNORE INTO series VALUES (?, ?, ?, ?, ?)",
                        [
                            (sid, queued.seq, m, labels, kind)
                            for sid, m, labels, kind in queued.series
                        ],
                    )
                self._db.execute("COMMIT")
                self.commits += 1
                if self._bytes is not None:
                    self._bytes += sum(len(queued.payload) for queued in group)
            except sqlite3.Error as exc:
                self._rollback()
                error = self._storage_error(exc, "cannot append to ingest buffer")
            except BaseException as exc:  # the callers waiting on this commit must not hang
                self._rollback()
                error = exc
        for queued in group:
            queued.error, queued.done = error, True

    def _rollback(self) -> None:
        """Undo a failed append. On a full disk SQLite may already have rolled back by itself
        (and ROLLBACK then fails too): that second error must not hide the first."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                log.warning("ROLLBACK after a failed buffer append failed too", exc_info=True)

    def _storage_error(self, exc: sqlite3.Error, what: str) -> StorageError:
        full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc)
        if full or (isinstance(exc, sqlite3.OperationalError) and _disk_is_full(self.path)):
            free = shutil.disk_usage(self.path.parent).free
            return DiskFullError(
                f"the disk holding the ingest buffer {self.path} is full ({free} bytes free): "
                "nothing was stored. Free space on that disk (or point state_dir at a bigger "
                "one); writers should retry",
                retry_after_s=DISK_FULL_RETRY_S,
            )
        return StorageError(f"{what} {self.path}: {exc}")

    def approx_bytes(self) -> int:
        """Payload bytes waiting to be flushed, for the write path's backpressure check: the
        count in the file (:meth:`depth`) at most ``DEPTH_RECOUNT_S`` old, plus what this
        process appended since. Summing every batch's size on each write cost more than the
        rest of the append once thousands of batches waited."""
        now = time.monotonic()
        if self._bytes is None or now - self._bytes_counted_at > DEPTH_RECOUNT_S:
            self._bytes = self.depth()[1]
            self._bytes_counted_at = now
        return self._bytes

    def last_seq(self) -> int:
        if self._absent():
            return 0
        with self._lock:
            row = self._db.execute("SELECT coalesce(max(seq), 0) FROM batches").fetchone()
        return int(row[0])

    def pending(self, after_seq: int, max_samples: int, up_to: int | None = None) -> Pending | None:
        """Batches with ``after_seq < seq <= up_to`` (at least one, then up to ``max_samples``)."""
        if self._absent():
            return None
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, samples, payload FROM batches WHERE seq > ? AND seq <= ? ORDER BY seq",
                (after_seq, up_to if up_to is not None else 2**62),
            )
            tables: list[pa.Table] = []
            corrupt: list[tuple[int, object, str]] = []
            total, max_seq = 0, after_seq
            for seq, count, payload in rows:
                if tables and total + count > max_samples:
                    break
                try:
                    table = _from_ipc(payload)
                except CorruptBatch as exc:
                    corrupt.append((int(seq), payload, str(exc)))
                    continue
                tables.append(table)
                total += table.num_rows
                max_seq = int(seq)
            for seq, payload, reason in corrupt:
                self._quarantine(seq, payload, reason)
            if not tables:
                return None
            series = self._series_between(after_seq, max_seq)
        return Pending(
            max_seq=max_seq,
            samples=pa.concat_tables(tables),
            series=series,
        )

    def _quarantine(self, seq: int, payload: object, reason: str) -> None:
        """Move a batch that cannot be decoded out of the way, into a file of its own: one
        damaged row must not block every flush (and so every command and the gateway) behind
        it. Its bytes are kept for inspection; it counts in ``quarantined_batches``."""
        data = payload if isinstance(payload, bytes) else str(payload).encode()
        target = quarantine_dir(self.path.parent) / (
            f"{self.path.stem}-{self.buffer_id[:12]}-seq{seq:012d}.arrows"
        )
        target.parent.mkdir(exist_ok=True)
        try:
            write_atomically(target, data)
        except OSError as exc:
            raise StorageError(
                f"batch {seq} of ingest buffer {self.path} is corrupt ({reason}) and cannot be "
                f"moved to {target}: {exc}. Free space there; it is retried on the next flush"
            ) from exc
        self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))
        self._bytes = None
        log.error(
            "batch %d of ingest buffer %s is corrupt (%s, %d bytes): moved to %s and skipped; "
            "its samples are not in the vault",
            seq,
            self.path,
            reason,
            len(data),
            target,
        )

    def _series_between(self, lo: int, hi: int) -> pa.Table:
        rows = self._db.execute(
            "SELECT series_id, metric, labels, kind FROM series WHERE seq > ? AND seq <= ?",
            (lo, hi),
        ).fetchall()
        columns = [[row[i] for row in rows] for i in range(4)]
        return pa.table([pa.array(c) for c in columns], schema=SERIES_SCHEMA)

    def all_series(self) -> list[tuple[int, str, str, str]]:
        if self._absent():
            return []
        with self._lock:
            rows = self._db.execute("SELECT series_id, metric, labels, kind FROM series")
            return [(int(a), str(b), str(c), str(d)) for a, b, c, d in rows]

    def discard_through(self, seq: int) -> None:
        """Forget batches (and their series rows) that the catalog already holds."""
        if self._absent():
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM batches WHERE seq <= ?", (seq,))
            self._db.execute("DELETE FROM series WHERE seq <= ?", (seq,))
            self._db.execute("COMMIT")
            self._bytes = None
            self._shrink_if_empty()

    def _shrink_if_empty(self) -> None:
        """A SQLite file never shrinks by itself: after a big backfill has been flushed, give
        the space back. VACUUM of an empty buffer is quick; with batches present it is skipped.
        (``PRAGMA incremental_vacuum`` frees one page per step, and Python's sqlite3 steps once.)"""
        if self._db.execute("SELECT count(*) FROM batches").fetchone()[0]:
            return
        free_pages = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        if free_pages > _SHRINK_FREE_PAGES:
            self._db.execute("VACUUM")
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def depth(self) -> tuple[int, int]:
        """(samples, payload bytes) waiting to be flushed."""
        if self._absent():
            return 0, 0
        with self._lock:
            row = self._db.execute(
                "SELECT coalesce(sum(samples), 0), coalesce(sum(length(payload)), 0) FROM batches"
            ).fetchone()
        return int(row[0]), int(row[1])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


def _to_ipc(table: pa.Table) -> bytes:
    """The batch as an lz4-compressed Arrow IPC stream, compressed on the calling thread:
    Arrow's default hands each column to its thread pool, and on a busy machine the request
    then waited for pool threads to be scheduled (milliseconds, for ~0.05 ms of work).
    Uncompressed, the payload is three times the size for the same CPU (docs/benchmarks.md)."""
    sink = pa.BufferOutputStream()
    if not table.schema.equals(SAMPLE_SCHEMA):
        table = table.cast(SAMPLE_SCHEMA)
    with ipc.new_stream(sink, SAMPLE_SCHEMA, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


_IPC_OPTIONS = ipc.IpcWriteOptions(compression="lz4", use_threads=False)
# Read back on the calling thread too: a flush reads one stream per request batch, and Arrow's
# pool hop per column cost more than the decompression (half the CPU, a third of the wall).
_IPC_READ = ipc.IpcReadOptions(use_threads=False)


def _disk_is_full(path: Path) -> bool:
    """SQLite reports some writes on a full disk as a plain "disk I/O error" (creating the
    -shm file of a WAL database, for one)."""
    try:
        return shutil.disk_usage(path.parent).free < _FULL_BELOW_BYTES
    except OSError:
        return False


def _from_ipc(payload: object) -> pa.Table:
    if not isinstance(payload, bytes):
        raise CorruptBatch(f"payload is {type(payload).__name__}, not bytes")
    try:
        table = ipc.open_stream(pa.py_buffer(payload), options=_IPC_READ).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptBatch(f"not an Arrow IPC stream: {exc}") from exc
    if not table.schema.equals(SAMPLE_SCHEMA):
        raise CorruptBatch(f"schema {table.schema} is not the sample schema")
    return table


def quarantine_dir(state_dir: Path) -> Path:
    return state_dir / QUARANTINE_DIR


def quarantined_batches(state_dir: Path) -> int:
    """Corrupt batches moved out of the buffers (files under ``<state>/quarantine``); the count
    falls back to 0 once someone has looked at them and deleted the files."""
    found = quarantine_dir(state_dir)
    return sum(1 for p in found.glob("*.arrows")) if found.is_dir() else 0
