"""The push client's spool: a bounded on-disk FIFO of encoded remote-write request bodies.

Format: one file per request, ``<seq:016d>-<samples>.rw``, holding the body exactly as it is
sent (snappy-compressed protobuf). Files, not SQLite, because:

- a body is an opaque blob that is written once, read once and deleted: no queries, no updates;
- ``tmp + fsync + rename`` makes every entry appear whole or not at all, with no journal to
  recover after a crash, and deleting the oldest entry frees its disk space at once (SQLite
  keeps freed pages until a VACUUM, so a bounded spool would not stay bounded on disk);
- the agent and the sender thread never wait on a database lock, and an operator can see (and
  move, or delete) what is queued with ``ls``.

The sequence number orders the entries (zero-padded, so names sort like numbers); the sample
count in the name lets the spool count what it drops without reading a body. Leftover
``*.tmp*`` files (a crash mid-append) are deleted on open. ``dropped.json`` keeps the dropped
counters, by reason, across restarts.

A full disk (ENOSPC, EDQUOT) is not fatal: an append that cannot be written deletes the oldest
entry and tries again (the same rule as a full spool, counted as ``disk_full``), and when no
entry is left to delete, the new body itself is dropped and counted. Appends work again as soon
as space comes back. An exclusive ``flock`` on ``spool.lock`` keeps a second agent off the
same directory (two senders would deliver every entry twice and evict each other's entries).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from metricvault.errors import SpoolLockedError
from metricvault.fsutil import write_atomically

__all__ = ["SPOOL_DROP_REASONS", "Spool"]

log = logging.getLogger("metricvault.agent.spool")

_ENTRY = re.compile(r"(\d{16})-(\d+)\.rw")
_COUNTERS = "dropped.json"
_LOCK = "spool.lock"
SPOOL_FULL, DISK_FULL, TOO_LARGE = "spool_full", "disk_full", "larger_than_spool"
UNREADABLE, WRITE_ERROR = "unreadable", "write_error"
# Why the spool drops an entry (the reason label of metricvault_agent_push_dropped_*).
SPOOL_DROP_REASONS = (SPOOL_FULL, DISK_FULL, TOO_LARGE, UNREADABLE, WRITE_ERROR)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class _Entry:
    seq: int
    samples: int
    size: int

    @property
    def name(self) -> str:
        return f"{self.seq:016d}-{self.samples}.rw"


class Spool:
    """A FIFO of request bodies in ``directory``, at most ``max_bytes`` of bodies in all.

    Thread-safe: one thread may append while another peeks and acks. When an append would pass
    ``max_bytes``, the oldest entries are deleted (the newest data is worth more to a monitoring
    system than the oldest) and counted in ``dropped_requests`` / ``dropped_samples``.
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock_directory(self.directory)
        self._mutex = threading.Lock()
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._samples = 0
        self._drops = self._load_counters()  # reason -> [requests, samples]
        self._counters_dirty = False  # a save failed (full disk): retried at the next drop
        self._disk_full = False  # the last append needed space it did not find
        self._disk_warned_at = -math.inf  # monotonic time of the last disk-full warning
        self._scan()
        self._next_seq = self._entries[-1].seq + 1 if self._entries else 1

    # ------------------------------------------------------------------ queue
    def append(self, body: bytes, samples: int = 0) -> int | None:
        """Queue ``body`` (holding ``samples`` samples); its sequence number, or None when it
        was dropped (counted): larger than ``max_bytes`` alone, no disk space even with the
        spool emptied, or another write error. Never raises OSError."""
        with self._mutex:
            if len(body) > self.max_bytes:
                log.error(
                    "a request body of %d bytes is larger than the whole spool (%d bytes); "
                    "dropped %d samples: push smaller batches or raise the spool size",
                    len(body),
                    self.max_bytes,
                    samples,
                )
                self._count_dropped([_Entry(0, samples, len(body))], TOO_LARGE)
                return None
            self._make_room(len(body))
            entry = _Entry(self._next_seq, samples, len(body))
            if not self._write_making_space(entry, body):
                return None
            self._next_seq += 1
            self._push(entry)
            if self._counters_dirty:  # the disk had no room for them: it has now
                self._save_counters()
            return entry.seq

    def peek(self) -> tuple[int, bytes] | None:
        """The oldest entry, (seq, body), without removing it; None when the spool is empty."""
        with self._mutex:
            while self._entries:
                entry = self._entries[0]
                try:
                    return entry.seq, (self.directory / entry.name).read_bytes()
                except OSError as exc:  # deleted or unreadable behind our back: skip it
                    log.error("spool entry %s cannot be read (%s); dropped", entry.name, exc)
                    self._pop()
                    self._count_dropped([entry], UNREADABLE)
            return None

    def ack(self, seq: int) -> int:
        """Remove entry ``seq`` (delivered, or refused for good); its sample count, or 0 when
        it is no longer there (evicted while it was being sent)."""
        with self._mutex:
            if not self._entries or self._entries[0].seq != seq:
                return self._remove_inner(seq)
            entry = self._pop()
            _unlink(self.directory / entry.name)
            return entry.samples

    def close(self) -> None:
        """Release the directory lock (the entries stay for the next open)."""
        with self._mutex:
            if self._counters_dirty:
                self._save_counters()
            if not self._lock_file.closed:
                self._lock_file.close()  # closing drops the flock

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sizes and counters
    @property
    def count(self) -> int:
        """Requests queued."""
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of request bodies queued."""
        return self._bytes

    @property
    def samples(self) -> int:
        """Samples in the queued requests."""
        return self._samples

    @property
    def dropped_requests(self) -> int:
        """Requests dropped unsent, for every reason (ever, persisted)."""
        with self._mutex:
            return sum(r for r, _ in self._drops.values())

    @property
    def dropped_samples(self) -> int:
        """Samples in those requests."""
        with self._mutex:
            return sum(n for _, n in self._drops.values())

    def drops(self) -> dict[str, tuple[int, int]]:
        """(requests, samples) dropped by reason (see ``SPOOL_DROP_REASONS``)."""
        with self._mutex:
            return {reason: (r, n) for reason, (r, n) in self._drops.items()}

    # ------------------------------------------------------------------ internals
    def _scan(self) -> None:
        found: list[_Entry] = []
        for path in self.directory.iterdir():
            match = _ENTRY.fullmatch(path.name)
            if match:
                found.append(_Entry(int(match[1]), int(match[2]), path.stat().st_size))
            elif ".tmp" in path.name:  # an append cut short by a crash: never queued
                _unlink(path)
        for entry in sorted(found, key=lambda e: e.seq):
            self._push(entry)

    def _make_room(self, size: int) -> None:
        evicted: list[_Entry] = []
        while self._entries and self._bytes + size > self.max_bytes:
            entry = self._pop()
            _unlink(self.directory / entry.name)
            evicted.append(entry)
        if evicted:
            log.warning(
                "spool full (%d bytes): dropped the %d oldest requests (%d samples) unsent",
                self.max_bytes,
                len(evicted),
                sum(e.samples for e in evicted),
            )
            self._count_dropped(evicted, SPOOL_FULL)

    def _write_making_space(self, entry: _Entry, body: bytes) -> bool:
        """Write ``entry``, deleting the oldest entries while the disk is full; False when it
        was dropped instead (counted and logged)."""
        evicted: list[_Entry] = []
        while True:
            try:
                self._write(entry, body)
                break
            except OSError as exc:
                if exc.errno not in _NO_SPACE:
                    log.error(
                        "cannot write spool entry %s in %s (%s); dropped %d samples",
                        entry.name,
                        self.directory,
                        exc,
                        entry.samples,
                    )
                    self._count_dropped([entry], WRITE_ERROR)
                    return False
                if not self._entries:
                    self._disk_full_drop(entry, evicted)
                    return False
                oldest = self._pop()
                _unlink(self.directory / oldest.name)
                evicted.append(oldest)
        if evicted:
            self._count_dropped(evicted, DISK_FULL)
            log.log(
                self._disk_full_level(),
                "disk full under the spool %s: dropped the %d oldest requests (%d samples) to "
                "write the newest; free space there or lower --spool-max-bytes",
                self.directory,
                len(evicted),
                sum(e.samples for e in evicted),
            )
        elif self._disk_full:
            log.info("the spool %s has disk space again", self.directory)
        self._disk_full = bool(evicted)
        return True

    def _disk_full_drop(self, entry: _Entry, evicted: list[_Entry]) -> None:
        self._count_dropped([*evicted, entry], DISK_FULL)
        level = logging.ERROR if self._disk_full_level() == logging.WARNING else logging.DEBUG
        log.log(
            level,
            "disk full under the spool %s: even with the spool emptied (%d requests deleted) a "
            "request of %d bytes (%d samples) cannot be written; dropped. Free space on that "
            "file system: the agent recovers by itself",
            self.directory,
            len(evicted),
            entry.size,
            entry.samples,
        )
        self._disk_full = True

    def _disk_full_level(self) -> int:
        """WARNING at most once a minute while the disk stays (nearly) full, else DEBUG: a
        disk that frees one entry's space per eviction would otherwise log every append."""
        now = time.monotonic()
        if now - self._disk_warned_at < DISK_FULL_LOG_EVERY_S:
            return logging.DEBUG
        self._disk_warned_at = now
        return logging.WARNING

    def _write(self, entry: _Entry, body: bytes) -> None:
        """Write-then-rename, fsynced, so an entry on disk is always whole (a failure, e.g. a
        full disk, reaches the caller and leaves no half entry)."""
        write_atomically(self.directory / entry.name, body)

    def _push(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._bytes += entry.size
        self._samples += entry.samples

    def _pop(self) -> _Entry:
        entry = self._entries.popleft()
        self._bytes -= entry.size
        self._samples -= entry.samples
        return entry

    def _remove_inner(self, seq: int) -> int:
        for entry in self._entries:
            if entry.seq == seq:  # only when acks come out of order: not the sender's way
                self._entries.remove(entry)
                self._bytes -= entry.size
                self._samples -= entry.samples
                _unlink(self.directory / entry.name)
                return entry.samples
        return 0

    def _count_dropped(self, entries: list[_Entry], reason: str) -> None:
        counts = self._drops.setdefault(reason, [0, 0])
        counts[0] += len(entries)
        counts[1] += sum(e.samples for e in entries)
        self._save_counters()

    def _save_counters(self) -> None:
        doc = {
            "dropped_requests": sum(r for r, _ in self._drops.values()),
            "dropped_samples": sum(n for _, n in self._drops.values()),
            "reasons": self._drops,
        }
        try:
            write_atomically(self.directory / _COUNTERS, json.dumps(doc).encode())
        except OSError as exc:  # a full disk: the counts stay in memory, saved at the next drop
            if not self._counters_dirty:
                log.warning("cannot save the spool's drop counters (%s); retrying later", exc)
            self._counters_dirty = True
            return
        self._counters_dirty = False

    def _load_counters(self) -> dict[str, list[int]]:
        path = self.directory / _COUNTERS
        try:
            doc = json.loads(path.read_text())
            if "reasons" not in doc:  # written before drops had reasons: all were spool_full
                return {SPOOL_FULL: [int(doc["dropped_requests"]), int(doc["dropped_samples"])]}
            return {str(k): [int(r), int(n)] for k, (r, n) in doc["reasons"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("spool counters %s unreadable (%s); counting from 0 again", path, exc)
            return {}


def _lock_directory(directory: Path) -> TextIO:
    lock_file = open(directory / _LOCK, "a+")  # noqa: SIM115 - held while the spool is open
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise SpoolLockedError(
            f"the spool {directory} is in use by another agent (or another open Spool): give "
            f"each agent a spool directory of its own"
        ) from None
    return lock_file


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
