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
counters across restarts. An exclusive ``flock`` on ``spool.lock`` keeps a second agent off the
same directory (two senders would deliver every entry twice and evict each other's entries).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from metricvault.fsutil import write_atomically

__all__ = ["Spool", "SpoolLockedError"]

log = logging.getLogger("metricvault.agent.spool")

_ENTRY = re.compile(r"(\d{16})-(\d+)\.rw")
_COUNTERS = "dropped.json"
_LOCK = "spool.lock"


class SpoolLockedError(RuntimeError):
    """Another process (or another open Spool) holds the spool directory."""


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
        self._dropped_requests, self._dropped_samples = self._load_counters()
        self._scan()
        self._next_seq = self._entries[-1].seq + 1 if self._entries else 1

    # ------------------------------------------------------------------ queue
    def append(self, body: bytes, samples: int = 0) -> int | None:
        """Queue ``body`` (holding ``samples`` samples); its sequence number, or None when the
        body alone is larger than ``max_bytes`` (then it is counted as dropped)."""
        with self._mutex:
            if len(body) > self.max_bytes:
                log.error(
                    "a request body of %d bytes is larger than the whole spool (%d bytes); "
                    "dropped %d samples: push smaller batches or raise the spool size",
                    len(body),
                    self.max_bytes,
                    samples,
                )
                self._count_dropped([_Entry(0, samples, len(body))])
                return None
            self._make_room(len(body))
            entry = _Entry(self._next_seq, samples, len(body))
            self._write(entry, body)
            self._next_seq += 1
            self._push(entry)
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
                    self._count_dropped([entry])
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
        """Requests deleted unsent to keep the spool within ``max_bytes`` (ever, persisted)."""
        return self._dropped_requests

    @property
    def dropped_samples(self) -> int:
        """Samples in those requests."""
        return self._dropped_samples

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
            self._count_dropped(evicted)

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

    def _count_dropped(self, entries: list[_Entry]) -> None:
        self._dropped_requests += len(entries)
        self._dropped_samples += sum(e.samples for e in entries)
        counters = {
            "dropped_requests": self._dropped_requests,
            "dropped_samples": self._dropped_samples,
        }
        write_atomically(self.directory / _COUNTERS, json.dumps(counters).encode())

    def _load_counters(self) -> tuple[int, int]:
        path = self.directory / _COUNTERS
        try:
            counters = json.loads(path.read_text())
            return int(counters["dropped_requests"]), int(counters["dropped_samples"])
        except FileNotFoundError:
            return 0, 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("spool counters %s unreadable (%s); counting from 0 again", path, exc)
            return 0, 0


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
