"""Real servers for end-to-end tests, started on 127.0.0.1.

``s3_server`` runs moto's S3 server as a separate process (``moto_server``, installed next to
this interpreter), so requests go over real HTTP exactly as they would to MinIO or AWS.

``gateway`` starts ``metricvault serve`` as a real subprocess (and can SIGKILL and restart it on
the same directory and port); ``prometheus`` starts Debian's ``prometheus`` binary with a
generated config that remote-writes into a gateway. Both are factories: each test starts what
it needs, and everything started is stopped (SIGTERM, then SIGKILL) at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# A process that dies is noticed at once; a loaded CI machine starts serve slowly.
READY_TIMEOUT_S = 120.0
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


# --------------------------------------------------------------------------- HTTP helpers
HTTP_TIMEOUT_S = 5.0


def http_get(url: str, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """GET on loopback; (status, body), also for 4xx/5xx answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_http_ok(url: str, proc: subprocess.Popen[bytes], log_path: Path, name: str) -> None:
    """Wait (bounded) until ``GET url`` answers 200; fail with the process's output if not."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"{name} exited with status {proc.returncode} before answering {url}; "
                f"its output:\n{_tail(log_path)}"
            )
        try:
            status, body = http_get(url, timeout=1)
            if status == 200:
                return
            last_error = f"HTTP {status}: {body[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = repr(exc)
        time.sleep(0.05)
    pytest.fail(
        f"{name} did not answer GET {url} with 200 within {READY_TIMEOUT_S:.0f} s "
        f"(last: {last_error}); its output:\n{_tail(log_path)}"
    )


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int | None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; the exit status after SIGTERM, or None
    when it had to be killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --------------------------------------------------------------------------- gateway
GATEWAY_DEFAULT_SETTINGS = ("flush_interval=1s", "gateway_maintain=false")


@dataclass
class GatewayProcess:
    """``metricvault serve`` as a subprocess on a fixed directory and port."""

    data_dir: Path
    port: int
    log_path: Path
    settings: tuple[str, ...] = GATEWAY_DEFAULT_SETTINGS
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "metricvault.cli", "serve", "--data", str(self.data_dir)]
        cmd += ["--listen", f"127.0.0.1:{self.port}"]
        for setting in self.settings:
            cmd += ["--set", setting]
        return cmd

    def start(self) -> None:
        """Start and wait until ``GET /-/ready`` is 200 (the output goes to ``log_path``)."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (restarts may overlap a load)."""
        assert not self.running, "gateway already running"
        self.starts += 1
        # A file, not a pipe: a full pipe would block the gateway. Appended: restarts keep
        # the output of earlier runs (what the gateway said before it was killed).
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                cwd=self.workdir(),
            )

    def workdir(self) -> Path:
        return self.data_dir.parent

    def wait_ready(self) -> None:
        assert self.proc is not None, "gateway not launched"
        wait_http_ok(f"{self.url}/-/ready", self.proc, self.log_path, "metricvault serve")

    def kill(self) -> None:
        """SIGKILL: no drain, no flush, exactly like a crash."""
        assert self.proc is not None and self.running, "gateway is not running"
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (drain and flush), then SIGKILL after ``timeout``; the exit status."""
        if self.proc is None:
            return None
        return stop_process(self.proc, timeout)

    def stop_gracefully(self) -> None:
        """SIGTERM and check it exits by itself with status 0 after draining and flushing."""
        status = self.stop()
        assert status == 0, (
            f"metricvault serve did not stop cleanly on SIGTERM (status {status}); its "
            f"output:\n{self.log_tail()}"
        )

    def restart(self) -> None:
        if self.running:
            self.stop()
        self.start()

    def log_tail(self, limit: int = 6000) -> str:
        return _tail(self.log_path, limit)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``gateway(data_dir=None, settings=())`` starts ``metricvault serve`` on a free
    loopback port and returns a :class:`GatewayProcess` (``settings`` are extra NAME=VALUE
    overrides after the defaults ``flush_interval=1s``, ``gateway_maintain=false``)."""
    started: list[GatewayProcess] = []

    def start(data_dir: Path | None = None, settings: tuple[str, ...] = ()) -> GatewayProcess:
        n = len(started)
        directory = data_dir or tmp_path / f"vault{n}"
        gw = GatewayProcess(
            data_dir=directory,
            port=free_port(),
            log_path=tmp_path / f"gateway{n}.log",
            settings=(*GATEWAY_DEFAULT_SETTINGS, *settings),
        )
        started.append(gw)
        gw.start()
        return gw

    yield start
    for gw in started:
        gw.stop(timeout=15)


# --------------------------------------------------------------------------- prometheus
PROMETHEUS_QUEUE_CONFIG = {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "2s"}


@dataclass
class PrometheusServer:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=30)
        reply = json.loads(body)
        if status != 200 or reply.get("status") != "success":
            pytest.fail(f"Prometheus /api/v1/{path}?{query}: HTTP {status}: {body[:500]!r}")
        return reply["data"]

    def self_metrics(self) -> dict[str, float]:
        """Prometheus's own /metrics as ``{'name{labels}': value}``."""
        _, body = http_get(f"{self.url}/metrics")
        return parse_exposition(body.decode())

    def remote_storage_report(self) -> str:
        """The ``prometheus_remote_storage_*`` lines, for failure messages."""
        lines = [
            f"{k} {v}"
            for k, v in sorted(self.self_metrics().items())
            if k.startswith("prometheus_remote_storage_")
        ]
        return "\n".join(lines)

    def stop(self) -> int | None:
        return stop_process(self.proc, timeout=20)

    def log_tail(self, limit: int = 6000) -> str:
        return _tail(self.log_path, limit)


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text format to ``{'name{labels}': value}`` (comments skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if "{" in line:
            end = line.rindex("}") + 1
            key, rest = line[:end], line[end:]
        else:
            key, _, rest = line.partition(" ")
        values[key.strip()] = float(rest.split()[0])
    return values


def metric_sum(values: dict[str, float], name: str) -> float:
    """The sum of every series of metric ``name`` in a :func:`parse_exposition` result."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``prometheus(remote_write_url, {job: [host:port, ...]}, self_job=None,
    external_labels=None)`` starts Debian's ``prometheus`` scraping every second (itself too,
    as job ``self_job`` if given) and remote-writing to ``remote_write_url``. Skips the test
    when the binary is missing (``make test`` installs it)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install -y prometheus")
    started: list[PrometheusServer] = []

    def start(
        remote_write_url: str,
        jobs: dict[str, list[str]],
        self_job: str | None = None,
        external_labels: dict[str, str] | None = None,
    ) -> PrometheusServer:
        directory = tmp_path / f"prometheus{len(started)}"
        directory.mkdir()
        port = free_port()
        if self_job:
            jobs = {**jobs, self_job: [f"127.0.0.1:{port}"]}
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
                **({"external_labels": external_labels} if external_labels else {}),
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
            "remote_write": [
                {
                    "url": remote_write_url,
                    "remote_timeout": "5s",
                    "queue_config": PROMETHEUS_QUEUE_CONFIG,
                    "metadata_config": {"send": True, "send_interval": "5s"},
                }
            ],
        }
        config_path = directory / "prometheus.yml"
        config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        promtool = shutil.which("promtool")
        if promtool:
            check = subprocess.run(
                [promtool, "check", "config", str(config_path)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert check.returncode == 0, (
                f"promtool rejects the config:\n{check.stdout}{check.stderr}"
            )
        log_path = directory / "prometheus.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                    # On shutdown Prometheus waits this long to flush remote_write (default
                    # 1m): teardown, often after the gateway has stopped, must not wait it.
                    "--storage.remote.flush-deadline=1s",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
            )
        server = PrometheusServer(f"http://127.0.0.1:{port}", port, proc, log_path, config_path)
        started.append(server)
        wait_http_ok(f"{server.url}/-/ready", proc, log_path, "prometheus")
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (tests/e2e/postgres_fixture.py): ``.uri``
    is the SQLAlchemy URI of an empty database ``iceberg``."""
    from tests.e2e.postgres_fixture import running_postgres

    with running_postgres(tmp_path_factory.mktemp("postgres")) as server:
        yield server
