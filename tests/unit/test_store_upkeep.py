"""The one maintenance loop and lock (store/upkeep.py) that ``maintain [--loop]`` and the
gateway's maintainer share: one maintainer at a time per state directory."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import metricvault
from metricvault.config import Settings
from metricvault.store.layout import MAINTAIN_LOCK
from metricvault.store.upkeep import MaintenanceLoop

T0 = 1_767_225_600_000


@pytest.fixture
def vault(tmp_path: Path) -> Any:
    store: Any = metricvault.open(str(tmp_path / "v"), Settings.load(env={}), create=True)
    store.write([("gpu_util", {"host": "n1"}, T0 + i * 5_000, float(i)) for i in range(100)])
    yield store
    store.close()


def test_a_round_maintains_and_reports(vault: Any) -> None:
    seen: list[dict[str, Any]] = []
    loop = MaintenanceLoop(vault, 60.0, on_report=lambda report, _s: seen.append(report))
    report = loop.round()
    assert report is not None and seen == [report]
    assert vault.buffered() == (0, 0)  # the round flushed the buffer


def test_a_round_is_skipped_while_another_maintainer_holds_the_lock(vault: Any) -> None:
    loop = MaintenanceLoop(vault, 60.0)
    with open(vault.state_dir / MAINTAIN_LOCK, "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert loop.round() is None
        assert vault.buffered()[0] == 100  # nothing was done
    assert loop.round() is not None


def test_a_one_off_round_waits_for_the_lock(vault: Any) -> None:
    """``metricvault maintain`` (no --loop) waits for a gateway's round instead of skipping."""
    loop = MaintenanceLoop(vault, 60.0)
    done = threading.Event()
    with open(vault.state_dir / MAINTAIN_LOCK, "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX)

        def wait_for_the_lock() -> None:
            loop.round(wait=True)
            done.set()

        waiter = threading.Thread(target=wait_for_the_lock)
        waiter.start()
        assert not done.wait(0.5)  # still waiting: the other maintainer holds the lock
    waiter.join(timeout=60)
    assert done.is_set()


class _FailsOnce:
    def __init__(self, vault: Any) -> None:
        self.vault, self.calls = vault, 0
        self.state_dir = vault.state_dir

    def maintain(self, now_ms: int | None = None, progress: Any = None) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            raise OSError("disk briefly unavailable")
        report: dict[str, Any] = self.vault.maintain(now_ms, progress)
        return report


def test_the_loop_survives_a_failed_round_and_stops_when_told(vault: Any) -> None:
    flaky = _FailsOnce(vault)
    stop = threading.Event()
    reports: list[dict[str, Any]] = []

    def on_report(report: dict[str, Any], _seconds: float) -> None:
        reports.append(report)
        stop.set()

    loop = MaintenanceLoop(flaky, 0.01, on_report=on_report)
    runner = threading.Thread(target=loop.run, args=(stop,))
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive()
    assert flaky.calls == 2 and len(reports) == 1  # the failure was retried next round


def test_maintain_on_the_command_line_waits_for_a_gateway_round(tmp_path: Path) -> None:
    """``metricvault maintain`` waits, as documented, for the lock a gateway's round holds."""
    data = tmp_path / "v"
    store: Any = metricvault.open(str(data), Settings.load(env={}), create=True)
    state_dir = store.state_dir
    store.close()
    with open(state_dir / MAINTAIN_LOCK, "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-m", "metricvault.cli", "maintain", "-d", str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)  # blocked on the lock, not finished
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip()
