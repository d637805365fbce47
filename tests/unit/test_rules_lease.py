"""One rule evaluator per vault: the lease is exclusive, passes on when its holder stops or
dies, and across machines is held term by term through conditional writes."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

from metricvault.config import Settings
from metricvault.rules.lease import EvaluatorLease
from metricvault.store.layout import open_location


def test_only_one_holder_at_a_time_and_the_lease_passes_on(tmp_path: Path):
    first, second = EvaluatorLease(tmp_path), EvaluatorLease(tmp_path)
    assert first.held()
    assert not second.held()
    assert first.held()  # the holder keeps it
    first.release()
    assert second.held()


def _hold_forever(state_dir: str, ready: multiprocessing.synchronize.Event) -> None:
    lease = EvaluatorLease(Path(state_dir))
    assert lease.held()
    ready.set()
    signal.pause()


def test_a_killed_holders_lease_is_taken_over(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_forever, args=(str(tmp_path), ready))
    holder.start()
    try:
        assert ready.wait(30)
        mine = EvaluatorLease(tmp_path)
        assert not mine.held()
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        assert mine.held()  # the kernel dropped the dead holder's lock
    finally:
        if holder.is_alive():
            holder.kill()


def _shared(tmp_path: Path, name: str, now: list[float]) -> EvaluatorLease:
    location = open_location(str(tmp_path / "vault"), Settings(data=str(tmp_path / "vault")))
    return EvaluatorLease(tmp_path / name, location, term_ms=60_000, clock=lambda: now[0],
                          shared=True)  # fmt: skip


def test_across_machines_one_gateway_holds_each_term(tmp_path: Path):
    now = [6_006.0]  # 10% into term 100
    a, b = _shared(tmp_path, "a", now), _shared(tmp_path, "b", now)
    assert a.held() and not b.held()
    now[0] = 6_045.0  # the holder claims the next term in the last third of its own
    assert a.held() and not b.held()
    now[0] = 6_070.0
    assert a.held() and not b.held()  # term 101: still the same holder
    # the holder stops (no more claims); the next term is free once it begins
    now[0] = 6_127.0
    assert b.held()
    assert not a.held()
