"""Maintenance rounds, one maintainer at a time per state directory: the one loop and lock
that ``metricvault maintain [--loop]`` and the gateway's maintainer share.

A round takes ``state/maintain.lock`` (an ``flock``), so the workers of one ``serve`` and a
``maintain --loop`` beside them never compact the same files at once; a maintainer that finds
the lock taken skips its round (a loop) or waits for it (a one-off ``maintain``). Maintainers
with other state directories (other machines) are kept apart per day by claims in the vault
itself (store/claims.py), not by this lock. Rounds are safe to kill at any moment: each step
commits atomically and the next round finishes it.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from metricvault.store.iceberg import publish_configured
from metricvault.store.iceberg import report as iceberg_report
from metricvault.store.layout import MAINTAIN_LOCK

log = logging.getLogger("metricvault.maintain")

Report = dict[str, Any]


class Maintainable(Protocol):
    @property
    def state_dir(self) -> Path: ...

    def maintain(self, now_ms: int | None = None, progress: Any = None) -> Report: ...


class MaintenanceLoop:
    """``vault.maintain`` every ``interval_s`` seconds under ``maintain.lock``.

    ``on_report`` sees each round's report and its seconds; a failed round is logged and
    retried next round (what it did not commit is redone then). ``steps`` run after the
    round's commits, still under its lock, each given the report to add to (the CLI's online
    anomaly scoring: under the lock, two maintainers never score the same samples at once)."""

    def __init__(
        self,
        vault: Maintainable,
        interval_s: float,
        on_report: Callable[[Report, float], None] | None = None,
        steps: Sequence[Callable[[Report], None]] = (),
    ) -> None:
        self.vault = vault
        self.interval_s = interval_s
        self.on_report = on_report
        self.steps = tuple(steps)
        self.lock_path = vault.state_dir / MAINTAIN_LOCK

    def round(
        self, now_ms: int | None = None, progress: Any = None, wait: bool = False
    ) -> Report | None:
        """One maintenance round under the lock; None when another maintainer holds it and
        ``wait`` is false."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lock_file:
            flags = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
            try:
                fcntl.flock(lock_file, flags)
            except BlockingIOError:
                return None  # another maintainer has this round
            started = time.monotonic()
            try:
                report = self.vault.maintain(now_ms, progress)
                # after the round's commits, under its lock: the tables get what it made
                published = publish_configured(self.vault)
                if published is not None:
                    report["iceberg"] = iceberg_report(published)
                for step in self.steps:
                    step(report)
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        if self.on_report is not None:
            self.on_report(report, time.monotonic() - started)
        return report

    def run(self, stop: threading.Event, first_now: bool = True, now_ms: int | None = None) -> None:
        """Rounds until ``stop`` is set: the first at once (``first_now``) or after one
        interval, then one every interval; ``now_ms`` pins the time retention sees."""
        if not first_now and stop.wait(self.interval_s):
            return
        while True:
            try:
                self.round(now_ms)
            except Exception:
                log.exception("maintenance failed; it is retried next round")
            if stop.wait(self.interval_s):
                return
