"""Real servers for end-to-end tests, started once per session on 127.0.0.1.

``s3_server`` runs moto's S3 server as a separate process (``moto_server``, installed next to
this interpreter), so requests go over real HTTP exactly as they would to MinIO or AWS.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

READY_TIMEOUT_S = 20.0
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Variables that would point boto3/pyarrow at a real account or change settings under test.
UNSET_ENV = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    port: int
    pid: int
    log_path: Path

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"moto_server exited with status {proc.returncode} before answering {url}; "
                f"its output:\n{_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
                last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = repr(exc)
        time.sleep(0.05)
    pytest.fail(
        f"moto_server did not answer GET {url} within {READY_TIMEOUT_S:.0f} s "
        f"(last error: {last_error}); its output:\n{_tail(log_path)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real moto S3 server on a free loopback port, with dummy credentials in the env."""
    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        pytest.fail(f"{binary} not found: install the test extras (pip install -e '.[test]')")
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        for name in [*UNSET_ENV, *(k for k in os.environ if k.startswith("METRICVAULT_"))]:
            mp.delenv(name, raising=False)
        port = free_port()
        # A file, not a pipe: moto logs every request and would block on a full pipe.
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(binary), "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            endpoint = f"http://127.0.0.1:{port}"
            _wait_ready(endpoint + "/", proc, log_path)
            yield S3Server(endpoint=endpoint, port=port, pid=proc.pid, log_path=log_path)
        finally:
            _stop(proc)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server; returns its name."""
    name = f"mv-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=name)
    return name
