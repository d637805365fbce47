"""Counters the agent itself owns, kept across restarts.

A restarted agent must not reset ``metricvault_log_matches_total`` or the push client's drop
counters to zero (``increase()`` copes with resets, but a restart in the middle of a window
would still lose what the old process counted and never exported), nor re-count a log it
already read. So such counters, and the log watcher's read offsets, live in one small JSON
file::

    {"counters": {"<key>": <value>, ...}, "offsets": {"<key>": [<inode>, <offset>], ...}}

Counters and offsets change together under one lock (:meth:`CounterState.record`) and are
written together, so a crash loses at most ``save_interval`` seconds of both, consistently:
the lines after the saved offset are read again and counted exactly once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metricvault.fsutil import write_atomically

log = logging.getLogger(__name__)


class CounterState:
    """Monotonic counters and file offsets under string keys, persisted to ``path``.

    Writes are atomic (temporary file, fsync, ``os.replace``) and happen at most every
    ``save_interval`` seconds from :meth:`add`/:meth:`record`/:meth:`save_if_due`, and whenever
    :meth:`save` is called (at stop). A missing or corrupt file starts every counter at zero;
    it never raises.
    """

    def __init__(self, path: Path, save_interval: float = 5.0) -> None:
        self.path = Path(path)
        self.save_interval = save_interval
        self._lock = threading.Lock()
        # Serialises whole saves, so an older snapshot never overwrites a newer one on disk.
        self._save_lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._offsets: dict[str, tuple[int, int]] = {}
        self._dirty = False
        self._last_save = time.monotonic()
        self._load()

    # ------------------------------------------------------------------ reading
    def get(self, key: str) -> float:
        with self._lock:
            return self._counters.get(key, 0.0)

    def counters(self) -> dict[str, float]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._counters)

    def get_offset(self, key: str) -> tuple[int, int] | None:
        """The saved ``(inode, offset)`` for ``key``, or None."""
        with self._lock:
            return self._offsets.get(key)

    # ------------------------------------------------------------------ writing
    def add(self, key: str, n: float = 1.0) -> None:
        self.record({key: n})

    def record(
        self,
        deltas: Mapping[str, float],
        offsets: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        """Add ``deltas`` to counters and set ``offsets``, atomically with respect to saves."""
        for key, n in deltas.items():
            if n < 0:
                raise ValueError(f"counter {key!r}: cannot add {n} (counters only increase)")
        with self._lock:
            for key, n in deltas.items():
                self._counters[key] = self._counters.get(key, 0.0) + n
            for key, (inode, offset) in (offsets or {}).items():
                self._offsets[key] = (int(inode), int(offset))
            self._dirty = True
        self.save_if_due()

    def save_if_due(self) -> None:
        """Save when there are changes and ``save_interval`` has passed since the last save."""
        if self._dirty and time.monotonic() - self._last_save >= self.save_interval:
            self.save()

    def save(self) -> None:
        """Write the file now (if anything changed). Failures are logged, never raised."""
        with self._save_lock:
            with self._lock:
                if not self._dirty:
                    return
                doc = {
                    "counters": dict(self._counters),
                    "offsets": {k: list(v) for k, v in self._offsets.items()},
                }
                self._dirty = False
                self._last_save = time.monotonic()
            try:
                write_atomically(self.path, json.dumps(doc, sort_keys=True).encode())
            except OSError as exc:
                # Retried at the next save: the counters stay in memory meanwhile.
                self._dirty = True
                log.warning("cannot save counter state %s: %s", self.path, exc)

    # ------------------------------------------------------------------ loading
    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            log.info("no counter state at %s yet: counters start at zero", self.path)
            return
        except OSError as exc:
            log.warning("cannot read counter state %s (%s): counters start at zero", self.path, exc)
            return
        try:
            self._counters, self._offsets = _parse(json.loads(raw))
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            log.warning("corrupt counter state %s (%s): counters start at zero", self.path, exc)
            self._counters, self._offsets = {}, {}


def _parse(doc: Any) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
    """Validate the whole document before using any of it: half a state is worse than none."""
    if not isinstance(doc, dict):
        raise TypeError("not a JSON object")
    counters = doc.get("counters", {})
    offsets = doc.get("offsets", {})
    if not isinstance(counters, dict) or not isinstance(offsets, dict):
        raise TypeError("'counters' and 'offsets' must be objects")
    parsed_counters: dict[str, float] = {}
    for key, value in counters.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"counter {key!r} has invalid value {value!r}")
        parsed_counters[str(key)] = float(value)
    parsed_offsets: dict[str, tuple[int, int]] = {}
    for key, value in offsets.items():
        if not (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            raise ValueError(f"offset {key!r} is not [inode, offset]: {value!r}")
        parsed_offsets[str(key)] = (value[0], value[1])
    return parsed_counters, parsed_offsets
