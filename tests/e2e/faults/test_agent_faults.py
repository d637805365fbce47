"""Issue 10: the agent must not lose data in its documented forms.

Each test runs the real ``metricvault agent`` command against a real ``metricvault serve``:
the bare-address form of ``--push``, bearer and basic auth into a gateway that requires them
(a wrong credential keeps the data spooled; the spool survives a restart with the right one),
and a spool on a tmpfs that fills up. Every output of the runs is searched for the secrets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metricvault import Vault
from metricvault.credentials import hash_secret

from ..conftest import GatewayProcess, free_port, parse_exposition, stop_process, wait_http_ok
from .disks import fill, tmpfs

pytestmark = pytest.mark.e2e

WAIT_S = 30.0
AGENT = str(Path(sys.executable).with_name("metricvault"))


@dataclass
class AuthGateway(GatewayProcess):
    """A gateway started with ``--config`` (auth tables cannot be given with --set)."""

    config: Path | None = None

    def command(self) -> list[str]:
        extra = ["--config", str(self.config)] if self.config else []
        return [*super().command(), *extra]


@pytest.fixture
def auth_gateway(tmp_path: Path) -> Iterator[Callable[[str], AuthGateway]]:
    """Factory: ``auth_gateway(toml)`` starts a gateway with that TOML config."""
    started: list[AuthGateway] = []

    def start(toml: str) -> AuthGateway:
        config = tmp_path / f"gateway{len(started)}.toml"
        config.write_text(toml)
        gw = AuthGateway(
            data_dir=tmp_path / f"authvault{len(started)}",
            port=free_port(),
            log_path=tmp_path / f"authgateway{len(started)}.log",
            config=config,
        )
        started.append(gw)
        gw.start()
        return gw

    yield start
    for gw in started:
        gw.stop(timeout=15)


class AgentRun:
    """One ``metricvault agent --push ...`` subprocess; every /metrics page it served is kept
    in ``pages`` (searched for secrets afterwards)."""

    def __init__(self, tmp_path: Path, name: str, push: list[str], state_dir: Path) -> None:
        self.port = free_port()
        runs = len(list(tmp_path.glob(f"{name}-*.log")))  # a restart keeps the old log
        self.log_path = tmp_path / f"{name}-{runs}.log"
        self.pages: list[str] = []
        command = [AGENT, "agent", "--simulate-gpus", "2", "--no-host", "--hostname", name]
        command += ["--listen", f"127.0.0.1:{self.port}", "--push-interval", "0.3"]
        command += ["--state-dir", str(state_dir), "--push", *push]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        wait_http_ok(f"http://127.0.0.1:{self.port}/metrics", self.proc, self.log_path, name)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            page = r.read().decode()
        self.pages.append(page)
        return parse_exposition(page)

    def wait(self, condition: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the agent died:\n{self.log_path.read_text()}"
            values = self.metrics()
            if condition(values):
                return values
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}; agent output:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        status = stop_process(self.proc)
        assert status == 0, f"agent exit status {status}:\n{self.log_path.read_text()}"

    def outputs(self) -> str:
        return self.log_path.read_text(errors="replace") + "".join(self.pages)


UNAUTHORIZED = 'metricvault_agent_push_config_error{code="401"}'


def sent(values: dict[str, float]) -> float:
    return values.get("metricvault_agent_push_sent_requests_total", 0.0)


def dropped(values: dict[str, float]) -> float:
    return sum(v for k, v in values.items() if k.startswith("metricvault_agent_push_dropped_"))


def assert_no_secret(secrets: list[str], *texts: str, state_dir: Path | None = None) -> None:
    blobs = list(texts)
    if state_dir is not None:
        blobs += [p.read_bytes().decode("latin-1") for p in state_dir.rglob("*") if p.is_file()]
    for secret in secrets:
        for blob in blobs:
            assert secret not in blob, f"the secret {secret!r} was written out:\n{blob[:3000]}"


def gpu_rows(data_dir: Path, hostname: str) -> list[int]:
    with Vault.open_local(str(data_dir)) as vault:
        rows = vault.query(f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{hostname}"}}', "-10m", "now")
    return sorted(round(t.timestamp() * 1000) for t in rows["timestamp"])


# --------------------------------------------------------------------------- tests
def test_bare_gateway_address_delivers(gateway, tmp_path: Path) -> None:
    gw = gateway()
    agent = AgentRun(tmp_path, "bare", [gw.url], tmp_path / "state")  # no /api/v1/write
    try:
        values = agent.wait(lambda v: sent(v) >= 3, "three requests stored")
        assert values.get("metricvault_agent_push_rejected_requests_total") == 0
        assert dropped(values) == 0
    finally:
        agent.stop()
    gw.stop()
    assert len(gpu_rows(gw.data_dir, "bare")) >= 6  # 2 GPUs x 3 pushes


def test_wrong_bearer_token_keeps_data_spooled_until_restarted_right(
    auth_gateway, tmp_path: Path
) -> None:
    right, wrong = "right-token-4f1c", "wrong-token-9a2e"
    gw = auth_gateway(f"[[auth_bearer_tokens]]\nsha256 = '{hash_secret(right)}'\n")
    token_file, state = tmp_path / "token", tmp_path / "state"
    token_file.write_text(wrong + "\n")
    push = [gw.url, "--push-bearer-token-file", str(token_file)]
    first = AgentRun(tmp_path, "tok", push, state)
    try:
        values = first.wait(  # both states asserted below, not the first of them
            lambda v: (
                v.get("metricvault_agent_push_spool_requests", 0) >= 3 and v.get(UNAUTHORIZED) == 1
            ),
            "three requests kept in the spool and the 401 reported",
        )
        assert dropped(values) == 0 and sent(values) == 0
    finally:
        first.stop()
    first_run_ended_ms = time.time_ns() // 1_000_000
    token_file.write_text(right + "\n")
    second = AgentRun(tmp_path, "tok", push, state)  # same spool, right token
    try:
        second.wait(
            lambda v: sent(v) >= 4 and v["metricvault_agent_push_spool_requests"] == 0,
            "the first run's spool delivered",
        )
    finally:
        second.stop()
    assert (
        "401" in first.log_path.read_text() and "Nothing is dropped" in first.log_path.read_text()
    )
    assert_no_secret([right, wrong], first.outputs(), second.outputs(), state_dir=state)
    gw.stop()
    stamps = gpu_rows(gw.data_dir, "tok")
    assert stamps[0] < first_run_ended_ms - 300  # what the first run spooled arrived


def test_basic_auth_from_url_userinfo_and_from_a_file(auth_gateway, tmp_path: Path) -> None:
    password = "s3cr3t:with@signs"
    user_hash = hash_secret(password)
    gw = auth_gateway(f"[[auth_basic_users]]\nuser = 'ops'\nsha256 = '{user_hash}'\n")
    in_url = f"http://ops:{password.replace(':', '%3A').replace('@', '%40')}@127.0.0.1:{gw.port}"
    secret_file = tmp_path / "basic"
    secret_file.write_text(f"ops:{password}\n")
    runs = [
        AgentRun(tmp_path, "url", [in_url], tmp_path / "s1"),
        AgentRun(
            tmp_path, "file", [gw.url, "--push-basic-auth-file", str(secret_file)], tmp_path / "s2"
        ),
        AgentRun(tmp_path, "bad", [f"http://ops:n0t-it@127.0.0.1:{gw.port}"], tmp_path / "s3"),
    ]
    try:
        for run in runs[:2]:
            run.wait(lambda v: sent(v) >= 2, f"{run.log_path.name}: two requests stored")
        refused = runs[2].wait(  # the 401 is counted before the spool grows: wait for both
            lambda v: (
                v.get(UNAUTHORIZED) == 1 and v.get("metricvault_agent_push_spool_requests", 0) >= 1
            ),
            "the wrong password reported and its request kept in the spool",
        )
        assert dropped(refused) == 0
    finally:
        for run in runs:
            run.stop()
    secrets = [password, "s3cr3t", "n0t-it", password.replace(":", "%3A").replace("@", "%40")]
    for n, run in enumerate(runs, start=1):
        assert_no_secret(secrets, run.outputs(), state_dir=tmp_path / f"s{n}")


# --------------------------------------------------------------------------- full disk
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted on a fresh directory."""
    with tmpfs(tmp_path / "tmpfs", "512k") as mount:
        yield mount


def test_full_disk_under_the_spool_drops_the_oldest_and_recovers(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    gw = GatewayProcess(data_dir=tmp_path / "vault", port=free_port(), log_path=tmp_path / "gw.log")
    agent = AgentRun(tmp_path, "full", [gw.url], small_tmpfs / "state")  # gateway not up yet
    try:
        agent.wait(lambda v: v["metricvault_agent_push_spool_requests"] >= 5, "five spooled")
        filler = fill(small_tmpfs)
        key = 'metricvault_agent_push_dropped_requests_total{reason="disk_full"}'
        agent.wait(  # two counters, two moments: wait for both
            lambda v: (
                v.get(key, 0) >= 3
                and v.get("metricvault_agent_spool_dropped_requests_total", 0) >= 3
            ),
            "drops counted under disk_full and by the spool",
        )
        filler.unlink()
        space_back_ms = time.time_ns() // 1_000_000
        gw.start()
        agent.wait(
            lambda v: v["metricvault_agent_push_spool_requests"] == 0 and sent(v) >= 5,
            "the spool delivered once space and the gateway are back",
        )
    finally:
        agent.stop()
        gw.stop()
    assert "disk full" in agent.log_path.read_text()
    stamps = gpu_rows(gw.data_dir, "full")
    assert stamps and stamps[-1] > space_back_ms  # new samples arrive after the recovery


def test_spool_on_a_full_disk_drops_the_oldest_counts_and_recovers(
    small_tmpfs: Path,
) -> None:
    from metricvault.collect.spool import Spool

    body = os.urandom(3000)  # incompressible, like a real body: one 4 KiB page each
    with Spool(small_tmpfs / "spool", 1 << 20) as spool:
        for _ in range(10):
            spool.append(body, 7)
        filler = fill(small_tmpfs)
        assert spool.append(body, 7) is not None  # room made by deleting the oldest
        assert spool.peek() is not None and spool.peek()[0] > 1  # type: ignore[index]
        drops = spool.drops()["disk_full"]
        assert drops[0] >= 1 and drops[1] == 7 * drops[0]
        assert spool.count == 10 - drops[0] + 1
        while spool.count:  # the sender delivers everything; the disk stays full
            spool.ack(spool.peek()[0])  # type: ignore[index]
        second = fill(small_tmpfs, "filler2")  # what the acks freed
        assert spool.append(body, 7) is None  # nothing left to delete: this one is dropped
        assert spool.drops()["disk_full"][1] == drops[1] + 7
        filler.unlink()
        second.unlink()
        seq = spool.append(body, 7)
        assert seq is not None and spool.peek() == (seq, body)  # space back: works again
        total = spool.dropped_requests
    with Spool(small_tmpfs / "spool", 1 << 20) as reopened:  # the counts were saved
        assert reopened.dropped_requests == total and reopened.count == 1
