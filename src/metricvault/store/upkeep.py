"""Maintenance rounds, one maintainer at a time per state directory: the one loop and lock
that ``metricvault maintain [--loop]`` and the gateway's maintainer share.

A round takes ``state/maintain.lock`` (an ``flock``), so the workers of one ``serve`` and a
``maintain --loop`` beside them never compact the same files at once; a maintainer that finds
the lock taken skips its round (a loop) or waits for it (a one-off ``maintain``). Maintainers
with other state directories (other machines) are kept apart per day by claims in the vault
itself (store/claims.py), not by this lock. Rounds are safe to kill at any moment: each step
commits atomically and the next round finishes it.

Stopping: ``run``'s ``stop`` event is also its claimant's ``stopping`` (store/claims.py), so
once it is set a round takes no more claims and skips the rest of its work, and whatever the
loop still holds when it ends is released. ``maintain --loop`` sets it on SIGTERM/SIGINT and
cuts the piece of work in progress short (``stop_on_signals``); serve's maintainer sets it when
the server shuts down and lets that piece finish. Either way the next maintainer, on any
host, takes the work at once instead of after ``maintain_claim_ttl``.
"""

from __future__ import annotations

import fcntl
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from metricvault.store.iceberg import publish_configured
from metricvault.store.iceberg import report as iceberg_report
from metricvault.store.layout import MAINTAIN_LOCK

if TYPE_CHECKING:
    from metricvault.store.claims import Claims

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
        interval, then one every interval; ``now_ms`` pins the time retention sees. A round
        in progress when ``stop`` is set claims nothing more; claims still held at the end
        (a round cut short by an exception, ``stop_on_signals``) are released."""
        claims = self._claims()
        if claims is not None:
            claims.stopping = stop
        try:
            if not first_now and stop.wait(self.interval_s):
                return
            while True:
                try:
                    self.round(now_ms)
                except Exception:
                    log.exception("maintenance failed; it is retried next round")
                if stop.wait(self.interval_s):
                    return
        finally:
            if claims is not None and (released := claims.release_all()):
                log.info("maintenance stopped: released %d claim(s)", released)

    def _claims(self) -> Claims | None:
        """The claimant maintenance uses for this vault (embedded vaults only)."""
        from metricvault.store.vault import Vault

        if not isinstance(self.vault, Vault):
            return None
        from metricvault.store.maintenance import claimant

        return claimant(self.vault)


class _Stopped(SystemExit):
    """Raised in the main thread by the first SIGTERM/SIGINT under ``stop_on_signals``."""


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` and end what the main thread is doing with
    :class:`_Stopped` (exit status 0, a SystemExit nothing catches), so
    ``with claims.hold(...)`` and ``MaintenanceLoop.run`` release their claims on the way
    out; a second signal while that unwinds is ignored.
    The previous handlers are restored afterwards."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            return  # already on the way out: let it finish releasing
        stop.set()
        log.info("%s: stopping maintenance", signal.Signals(signum).name)
        raise _Stopped(0)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
