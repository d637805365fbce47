"""A real InfluxDB 1.6 server for end-to-end tests (Debian's ``influxdb`` package).

``influxd`` starts once per session on free 127.0.0.1 ports with its data in a temporary
directory, and is stopped by PID at the end. ``influxd_auth`` (with ``auth-enabled = true``
and one admin user) and ``influxd_tls`` (HTTPS with a self-signed certificate) are further
servers, started only by the tests that use them. All skip with a message saying how to
install the package when ``/usr/bin/influxd`` is missing.

Import the fixtures into a test module (pytest only collects ``conftest.py`` by that name)::

    from .influx_fixture import influxd  # noqa: F401
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import free_port, stop_process

INFLUXD = Path("/usr/bin/influxd")
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
ADMIN_USER, ADMIN_PASSWORD = "admin", "s3cret pass"

CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{root}/meta"

[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  index-version = "inmem"
  query-log-enabled = false

[monitor]
  store-enabled = false

[http]
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
  auth-enabled = {auth}
{https}
[continuous_queries]
  enabled = true
  run-interval = "1s"
  log-enabled = false
"""


@dataclass(frozen=True)
class InfluxServer:
    host: str
    port: int
    pid: int
    root: Path
    log_path: Path
    user: str = ""
    password: str = ""
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def cert(self) -> Path:
        return self.root / "cert.pem"

    def uri(self, database: str, with_credentials: bool = True) -> str:
        """``influxdb://[user:pass@]host:port/database``, as ``Vault.open`` takes it."""
        auth = ""
        if with_credentials and self.user:
            auth = f"{urllib.parse.quote(self.user)}:{urllib.parse.quote(self.password)}@"
        scheme = "influxdbs" if self.tls else "influxdb"
        return f"{scheme}://{auth}{self.host}:{self.port}/{database}"

    def query(self, statement: str, database: str = "") -> list[dict[str, Any]]:
        """Run InfluxQL directly (not through metricvault); the ``results`` of the answer."""
        params = {"q": statement, "epoch": "ms", **({"db": database} if database else {})}
        request = urllib.request.Request(
            f"{self.url}/query", data=urllib.parse.urlencode(params).encode(), method="POST"
        )
        if self.user:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context(cafile=str(self.cert)) if self.tls else None
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            reply = json.loads(resp.read())
        results: list[dict[str, Any]] = reply["results"]
        errors = [r["error"] for r in results if "error" in r]
        assert not errors, f"InfluxQL {statement!r} failed: {errors}"
        return results

    def rows(self, statement: str, database: str = "") -> list[dict[str, Any]]:
        """Every row of every series of the first result, as dicts (plus ``_name``)."""
        out = []
        for series in self.query(statement, database)[0].get("series", []):
            for values in series["values"]:
                row = dict(zip(series["columns"], values, strict=True))
                row["_name"] = series.get("name")
                out.append(row)
        return out

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"


def _wait_ping(server: InfluxServer, proc: subprocess.Popen[bytes]) -> None:
    """Bounded wait until ``GET /ping`` answers 204."""
    url, log_path = server.url, server.log_path
    context = ssl._create_unverified_context() if server.tls else None  # only to see it is up
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"influxd exited with status {proc.returncode} before answering {url}/ping; "
                f"its output:\n{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=1, context=context) as resp:
                if resp.status == 204:
                    return
                last = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.05)
    pytest.fail(f"influxd did not answer {url}/ping within {READY_TIMEOUT_S:.0f} s ({last})")


def _self_signed(root: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (openssl), to serve HTTPS."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


def _start(
    root: Path, auth: bool, tls: bool = False
) -> tuple[subprocess.Popen[bytes], InfluxServer]:
    if not INFLUXD.exists():
        pytest.skip(
            f"{INFLUXD} is missing: install InfluxDB 1.6 with `apt-get update && apt-get "
            "install -y influxdb influxdb-client` to run the InfluxDB backend tests"
        )
    http_port, rpc_port = free_port(), free_port()
    config = root / "influxdb.conf"
    https = ""
    if tls:
        cert, key = _self_signed(root)
        https = (
            f'  https-enabled = true\n  https-certificate = "{cert}"\n'
            f'  https-private-key = "{key}"\n'
        )
    config.write_text(
        CONFIG.format(
            root=root, http_port=http_port, rpc_port=rpc_port, auth=str(auth).lower(), https=https
        )
    )
    log_path = root / "influxd.log"
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would block influxd
        proc = subprocess.Popen(
            [str(INFLUXD), "-config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    server = InfluxServer("127.0.0.1", http_port, proc.pid, root, log_path, tls=tls)
    try:
        _wait_ping(server, proc)
    except BaseException:
        stop_process(proc, timeout=STOP_TIMEOUT_S)
        raise
    return proc, server


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxServer]:
    """InfluxDB 1.6 without authentication, for the whole session."""
    proc, server = _start(tmp_path_factory.mktemp("influxd"), auth=False)
    try:
        yield server
    finally:
        stop_process(proc, timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def influxd_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxServer]:
    """InfluxDB 1.6 with ``auth-enabled = true`` and the admin user ``ADMIN_USER``."""
    proc, server = _start(tmp_path_factory.mktemp("influxd-auth"), auth=True)
    try:
        # with auth enabled, InfluxDB accepts exactly one unauthenticated statement: the
        # creation of the first admin user
        server.query(
            f"CREATE USER {ADMIN_USER} WITH PASSWORD '{ADMIN_PASSWORD}' WITH ALL PRIVILEGES"
        )
        yield InfluxServer(
            server.host,
            server.port,
            server.pid,
            server.root,
            server.log_path,
            ADMIN_USER,
            ADMIN_PASSWORD,
        )
    finally:
        stop_process(proc, timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def influxd_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxServer]:
    """InfluxDB 1.6 serving HTTPS with a self-signed certificate (``server.cert``)."""
    proc, server = _start(tmp_path_factory.mktemp("influxd-tls"), auth=False, tls=True)
    try:
        yield server
    finally:
        stop_process(proc, timeout=STOP_TIMEOUT_S)
