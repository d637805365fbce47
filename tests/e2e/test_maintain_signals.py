"""End-to-end: ``metricvault maintain --loop`` stopped by SIGTERM or SIGINT in the middle of a
round releases the claim it holds, so a second maintainer takes that work at once, long
before ``maintain_claim_ttl`` (an hour here) -- from any host, not only from this one, where a
dead process's claim is taken over anyway: the test checks the released lease itself.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from metricvault import Vault

from .conftest import _clean_env, stop_process

pytestmark = pytest.mark.e2e

T0 = 1_767_225_600_000  # 2026-01-01
DAYS, SERIES, STEP_MS = 3, 20, 10_000  # a day's rollup takes a second or more to do
NOW = "2026-01-04T12:00:00Z"  # retention keeps everything
WAIT_S = 120.0  # bound on every wait below (a loaded machine); the claim TTL is 1 h


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vault with DAYS days of raw samples not rolled up yet: a round of real work."""
    root = tmp_path_factory.mktemp("signals") / "vault"
    with Vault.open_local(str(root)) as vault:
        for day in range(DAYS):
            ts = np.arange(T0 + day * 86_400_000, T0 + (day + 1) * 86_400_000, STEP_MS)
            vault.write(
                pa.table(
                    {
                        "metric": pa.array(["gpu_util"] * (SERIES * len(ts))),
                        "host": pa.array([f"h{i}" for i in range(SERIES) for _ in ts]),
                        "timestamp": pa.array(np.tile(ts, SERIES)).cast(
                            pa.timestamp("ms", tz="UTC")
                        ),
                        "value": pa.array(np.random.default_rng(day).random(SERIES * len(ts))),
                    }
                )
            )
            vault.flush()
    return root


def maintainer(vault: Path, home: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "metricvault.cli", "maintain", "--loop", "--data", str(vault)]
    cmd += ["--now", NOW, "--set", f"state_dir={home / 'state'}"]
    cmd += ["--set", "maintain_claim_ttl=1h", "--set", "maintain_interval=1h"]
    home.mkdir()
    with open(home / "maintain.log", "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_clean_env(), cwd=home
        )


def newest_leases(vault: Path) -> dict[str, dict[str, object]]:
    """Each claim key's newest lease (the claim), as its JSON body."""
    out: dict[str, dict[str, object]] = {}
    for key_dir in {p.parent for p in (vault / "claims").rglob("g*.json")}:
        for lease in sorted(key_dir.glob("g*.json"), reverse=True):
            try:
                out[str(key_dir.relative_to(vault / "claims"))] = json.loads(lease.read_text())
                break
            except (OSError, ValueError):  # superseded and deleted while we looked
                continue
    return out


def pid_of(lease: dict[str, object]) -> int:
    return int(str(lease["owner"]).split(":")[1])


def wait_for(what: str, test: Callable[[], object], proc: subprocess.Popen[bytes]) -> object:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = test()
        if found:
            return found
        assert proc.poll() is None, f"the maintainer exited ({proc.returncode}) before {what}"
        time.sleep(0.01)
    raise AssertionError(f"not within {WAIT_S:.0f} s: {what}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_maintainer_releases_its_claim_and_the_next_takes_that_work_at_once(
    template: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    vault = tmp_path / "vault"
    shutil.copytree(template, vault)
    first = maintainer(vault, tmp_path / "first")
    second: subprocess.Popen[bytes] | None = None
    try:

        def held_by_first() -> list[str]:
            leases = newest_leases(vault)
            return [k for k, v in leases.items() if not v["released"] and pid_of(v) == first.pid]

        keys = wait_for("the first maintainer holds a claim", held_by_first, first)
        assert isinstance(keys, list)
        first.send_signal(sig)
        assert first.wait(timeout=WAIT_S) == 0, (tmp_path / "first" / "maintain.log").read_text()

        leases = newest_leases(vault)
        for key in keys:  # released by the stopped maintainer itself, not left to expire
            assert leases[key]["released"] and pid_of(leases[key]) == first.pid, leases[key]
        assert not [k for k, v in leases.items() if not v["released"]], leases

        second = maintainer(vault, tmp_path / "second")
        proc = second

        def taken_by_second() -> bool:
            lease = newest_leases(vault).get(keys[0])
            return lease is not None and pid_of(lease) == proc.pid

        wait_for(f"the second maintainer claims {keys[0]}", taken_by_second, second)
        assert stop_process(second, WAIT_S) == 0
        leases = newest_leases(vault)
        assert not [k for k, v in leases.items() if not v["released"]], leases
    finally:
        for started in (first, second):
            if started is not None:
                stop_process(started, 15)
