"""`metricvault serve` over HTTPS with tls_cert/tls_key, and bearer auth on top (real process)."""

from __future__ import annotations

import hashlib
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from metricvault import Vault

from .conftest import _clean_env, free_port, stop_process

pytestmark = pytest.mark.e2e
T0 = 1_767_225_600_000


def _request(
    url: str, context: ssl.SSLContext | None, data: bytes | None = None, token: str | None = None
) -> int:
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=context, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_https_with_bearer_token_and_tenant(
    tmp_path: Path, self_signed_cert: tuple[Path, Path]
) -> None:
    cert, key = self_signed_cert
    digest = hashlib.sha256(b"t0ken").hexdigest()
    config = tmp_path / "mv.toml"
    config.write_text(
        f'tls_cert = "{cert}"\ntls_key = "{key}"\ngateway_maintain = false\n'
        f'[[auth_bearer_tokens]]\nsha256 = "{digest}"\ntenant = "lab"\n'
    )
    port, data = free_port(), tmp_path / "vault"
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "metricvault.cli",
            "serve",
            "--data",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--config",
            str(config),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_clean_env(),
    )
    context = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if _request(f"{base}/-/ready", context) == 200:
                    break
            except (urllib.error.URLError, ConnectionError, ssl.SSLError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "serve.log"
            ).read_text()
            time.sleep(0.2)
        line = f"m,tenant=forged v=1.5 {T0}".encode()
        assert _request(f"{base}/write?precision=ms", context, line) == 401
        assert _request(f"{base}/write?precision=ms", context, line, token="t0ken") == 204
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            _request(f"http://127.0.0.1:{port}/-/ready", None)
    finally:
        assert stop_process(proc, 30) == 0
        log.close()
    with Vault.open_local(str(data)) as vault:
        got = vault.query("m_v", T0, T0 + 1)
    assert got["value"].tolist() == [1.5] and got["tenant"].tolist() == ["lab"]
