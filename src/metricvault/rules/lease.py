"""One rule evaluator per vault, by lease: every gateway worker (and every gateway) may try,
exactly one evaluates.

- On one machine: an exclusive ``flock`` on ``rules.lease`` in the vault's state directory,
  held while the evaluator lives and dropped by the kernel when its process dies (kill -9
  included), so another worker takes over at its next try.
- Across machines (an ``s3://`` vault, several gateways): time is cut into terms of
  ``term_ms``; holding term *k* is having created the object ``rules/lease/term-<k>`` with a
  conditional write (``If-None-Match: *``), which exactly one writer wins. The holder claims
  the next term during the last third of its own; the others only once the next term has
  begun (plus a grace), so the holder keeps it while it lives and a dead holder is replaced
  within a term. An evaluator stops evaluating when its term ends without the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from metricvault.store.layout import Location

__all__ = ["RULES_LEASE_FILE", "EvaluatorLease"]

RULES_LEASE_FILE = "rules.lease"
LEASE_DIR = "rules/lease"
DEFAULT_TERM_MS = 60_000


class EvaluatorLease:
    """``held(now_ms)``: whether this process may evaluate now (it tries to take or keep
    the lease as a side effect). ``release()`` gives it up."""

    def __init__(
        self,
        state_dir: Path,
        location: Location | None = None,
        term_ms: int = DEFAULT_TERM_MS,
        clock: Callable[[], float] = time.time,
        shared: bool | None = None,
    ) -> None:
        """``shared``: whether other machines may evaluate the same vault (term leases in
        ``location``); by default, when the vault is remote (``s3://``)."""
        self.path = Path(state_dir) / RULES_LEASE_FILE
        if shared is None:
            shared = location is not None and location.remote
        self.location = location if shared else None
        self.term_ms = term_ms
        self.clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._file: IO[str] | None = None
        self._terms: set[int] = set()

    def held(self, now_ms: int | None = None) -> bool:
        if not self._local():
            return False
        if self.location is None:
            return True
        now = int(self.clock() * 1000) if now_ms is None else now_ms
        return self._remote(now)

    def _local(self) -> bool:
        if self._file is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held open while the lease is held
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        f.seek(0)
        f.truncate()
        f.write(self.holder + "\n")
        f.flush()
        self._file = f
        return True

    def _remote(self, now: int) -> bool:
        term = now // self.term_ms
        into = now - term * self.term_ms
        if term not in self._terms and into >= self.term_ms // 10:
            self._claim(term)  # an open term: whoever creates it first holds it
        if term in self._terms and into >= 2 * self.term_ms // 3:
            self._claim(term + 1)  # the holder's head start on the next term
        return term in self._terms

    def _claim(self, term: int) -> None:
        if term in self._terms:
            return
        assert self.location is not None
        body = json.dumps({"holder": self.holder, "term": term, "term_ms": self.term_ms})
        path = self.location.path(LEASE_DIR, f"term-{term:012d}")
        if self.location.write_bytes_exclusive(path, body.encode()):
            self._terms.add(term)
            with contextlib.suppress(Exception):  # old terms are history; keep the prefix small
                self.location.delete(self.location.path(LEASE_DIR, f"term-{term - 3:012d}"))
        self._terms = {t for t in self._terms if t >= term - 1}

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        self._terms.clear()
