"""Count lines of a training log that match regexes, following the file like ``tail -F``.

``metricvault_log_matches_total{pattern, path}`` turns "CUDA error", "NaN loss" or "NCCL timeout"
lines into a counter that alerts and dashboards can use. The watcher:

* starts at the end of the file the first time (history is not counted), but resumes from the
  saved offset after a restart when the file is still the same inode, so lines written while the
  agent was down are counted exactly once;
* follows rotation (the path is renamed or deleted and a new file appears): it finishes the old
  file through its open handle, then reads the new file from its start; truncation in place
  restarts at offset 0; a file that does not exist yet is read from its start once it appears;
* counts a line only once its newline arrives.

Counts and offsets live in a :class:`~metricvault.collect.state.CounterState`, updated together.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from metricvault.collect.families import CounterMetricFamily, Metric
from metricvault.collect.sources import FastReading
from metricvault.collect.sources.host import validate_extra_labels
from metricvault.collect.state import CounterState

__all__ = ["CounterState", "LogWatcher", "parse_patterns"]

log = logging.getLogger(__name__)

FAMILY = "metricvault_log_matches"  # exposed as metricvault_log_matches_total
READ_CHUNK = 1 << 16
# A "line" that never ends (a binary file, a progress bar without newlines) must not grow memory
# without bound: past this size it is matched as it is and dropped.
MAX_LINE_BYTES = 1 << 20


def parse_patterns(specs: Iterable[str]) -> dict[str, str]:
    """``["cuda=CUDA error", "nan=\\bNaN\\b"]`` → ``{"cuda": "CUDA error", "nan": "\\bNaN\\b"}``.

    The name ends at the first ``=``; the regex is the rest, verbatim (it may contain ``=``).
    """
    patterns: dict[str, str] = {}
    for spec in specs:
        name, sep, regex = spec.partition("=")
        name = name.strip()
        if not sep or not name or not regex:
            raise ValueError(f"log pattern {spec!r}: expected NAME=REGEX, e.g. 'cuda=CUDA error'")
        if name in patterns:
            raise ValueError(f"log pattern name {name!r} is given twice")
        _compile(name, regex)
        patterns[name] = regex
    return patterns


def _compile(name: str, regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as exc:
        msg = f"log pattern {name!r}: invalid regular expression {regex!r}: {exc}"
        raise ValueError(msg) from exc


def counter_key(path: Path, pattern: str) -> str:
    """The CounterState key of one (path, pattern) count; JSON so no name can make two collide."""
    return "log_matches " + json.dumps([str(path), pattern])


class LogWatcher:
    """Tails ``path`` in a daemon thread (:meth:`start`/:meth:`stop`); a metric :class:`Source`."""

    name = "logwatch"

    def __init__(
        self,
        path: Path,
        patterns: Mapping[str, str],
        state: CounterState,
        poll_interval: float = 0.5,
        *,
        extra_labels: Mapping[str, str] | None = None,
    ) -> None:
        if not patterns:
            raise ValueError(f"log watcher for {path}: at least one NAME=REGEX pattern is needed")
        # Absolute, so the label and the saved offset do not depend on the working directory.
        self.path = Path(os.path.abspath(path))
        self.poll_interval = poll_interval
        self._regexes = {name: _compile(name, rx) for name, rx in patterns.items()}
        self._keys = {name: counter_key(self.path, name) for name in patterns}
        self._state = state
        self._extra = validate_extra_labels(extra_labels, reserved=("pattern", "path"))
        self._fh: BinaryIO | None = None
        self._inode = 0
        self._partial = b""
        self._discard_first = False  # started mid-line: the rest of that line is history
        self._positioned = False
        self._last_error = ""
        self._lock = threading.Lock()  # one poll at a time (thread, tests, stop)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ Source protocol
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            FAMILY,
            "Log lines that matched a pattern, since the agent's state was first created.",
            labels=["pattern", "path", *self._extra],
        )
        for name, key in self._keys.items():
            family.add_metric([name, str(self.path), *self._extra.values()], self._state.get(key))
        yield family

    def fast_readings(self) -> list[FastReading]:
        return []

    def close(self) -> None:
        self.stop()

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        """Decide the start position now (so lines written after ``start`` returns count), then
        poll every ``poll_interval`` seconds in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        with self._lock:
            if not self._positioned:
                self._position()
        self._thread = threading.Thread(
            target=self._run, name=f"metricvault-logwatch-{self.path.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, close the file and save the state (offsets included)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._close_file()
            self._positioned = False  # a later start() resumes from the recorded offset
        self._state.save()

    def _run(self) -> None:
        while True:
            self._poll_logged()
            if self._stop.wait(self.poll_interval):
                break
        self._poll_logged()  # lines written just before stop count now, not at the next start

    def _poll_logged(self) -> None:
        # The thread must survive anything (an NFS hiccup, a vanished directory); repeating the
        # same complaint every poll would flood the log, so only a new message is logged.
        try:
            self.poll()
            self._last_error = ""
        except Exception as exc:
            if str(exc) != self._last_error:
                log.warning("log watcher %s: %s", self.path, exc)
            self._last_error = str(exc)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> None:
        """Read whatever is new, follow truncation and rotation. Called by the thread."""
        with self._lock:
            if not self._positioned:
                self._position()
            if self._fh is None and not self._open_from_start():
                return
            self._drain()
            self._follow_truncation_or_rotation()
        self._state.save_if_due()

    def _position(self) -> None:
        """Where reading starts: the saved offset (same inode), else the end of the file."""
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across polls, closed in stop()
        except FileNotFoundError:
            self._positioned = True  # read from its start once it appears
            return
        st = os.fstat(fh.fileno())
        saved = self._state.get_offset(str(self.path))
        if saved is not None and saved[0] == st.st_ino:
            # Same file: resume. Shorter than the offset means it was truncated while we were
            # stopped, so everything in it was written since and is new.
            start = saved[1] if saved[1] <= st.st_size else 0
        else:
            start = st.st_size
            self._discard_first = start > 0 and _last_byte(fh, start) != b"\n"
        fh.seek(start)
        self._attach(fh, st.st_ino, start)
        self._positioned = True

    def _open_from_start(self) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across polls, closed in stop()
        except FileNotFoundError:
            return False
        self._attach(fh, os.fstat(fh.fileno()).st_ino, 0)
        return True

    def _attach(self, fh: BinaryIO, inode: int, offset: int) -> None:
        self._fh, self._inode, self._partial = fh, inode, b""
        self._state.record({}, {str(self.path): (inode, offset)})

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _follow_truncation_or_rotation(self) -> None:
        assert self._fh is not None
        if os.fstat(self._fh.fileno()).st_size < self._fh.tell():
            log.info("log %s was truncated: reading it again from the start", self.path)
            self._fh.seek(0)
            self._attach(self._fh, self._inode, 0)
            self._discard_first = False
            self._drain()
            return
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            return  # renamed away, successor not there yet: the writer may still use the old one
        if inode != self._inode:
            self._drain()  # what was written between the first drain and the rename
            self._count_and_record([self._partial], offset=None)  # the old file is finished
            self._partial = b""
            self._close_file()
            if self._open_from_start():
                self._drain()

    def _drain(self) -> None:
        assert self._fh is not None
        while chunk := self._fh.read(READ_CHUNK):
            data = self._partial + chunk
            lines = data.split(b"\n")
            self._partial = lines.pop()
            if len(self._partial) > MAX_LINE_BYTES:
                lines.append(self._partial)
                self._partial = b""
            if self._discard_first and lines:
                lines.pop(0)
                self._discard_first = False
            self._count_and_record(lines, offset=self._fh.tell() - len(self._partial))

    def _count_and_record(self, lines: list[bytes], offset: int | None) -> None:
        deltas: dict[str, float] = {}
        for raw in lines:
            if not raw:
                continue
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            for name, regex in self._regexes.items():
                if regex.search(line):
                    key = self._keys[name]
                    deltas[key] = deltas.get(key, 0.0) + 1.0
        offsets = {} if offset is None else {str(self.path): (self._inode, offset)}
        self._state.record(deltas, offsets)


def _last_byte(fh: BinaryIO, size: int) -> bytes:
    fh.seek(size - 1)
    return fh.read(1)
