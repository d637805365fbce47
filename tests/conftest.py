"""Shared test setup: a vault's settings must come from the test, never from the environment."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

ENV_PREFIX = "METRICVAULT_"

# Property tests: the ``ci`` profile (the default, what ``make test`` runs) gives a test that
# sets no max_examples hypothesis's own 100 examples; ``HYPOTHESIS_PROFILE=thorough`` gives it
# 3000 (before a release, after changing a decoder or the store), and the store oracle
# (test_oracle.py, a whole vault per example) 250 workloads instead of 12.
PROFILE_EXAMPLES = {"ci": 100, "thorough": 3000}
for _name, _examples in PROFILE_EXAMPLES.items():
    settings.register_profile(_name, max_examples=_examples)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _compiled_code_loaded() -> None:
    """The numba-compiled modules loaded before any test, as a server loads them at start.

    Loaded on a background thread (as ``metricvault serve`` does) they would compile while
    later tests run, and numba's compiler enters and leaves ``warnings.catch_warnings()``,
    which is not thread-safe: a test's ``pytest.warns`` in the main thread then records
    nothing. Loaded here, once per test process, no compiler runs beside a test."""
    from metricvault import compiled
    from metricvault.ingest.protocols.remote_write_known import start_compiling
    from metricvault.promql import tiers

    start_compiling(wait=True)
    compiled.start(tiers.KERNEL, wait=True)


@pytest.fixture(autouse=True, scope="session")
def _no_metricvault_env() -> Iterator[None]:
    """``Settings.load`` reads ``METRICVAULT_*``; a developer's shell must not change results.

    Session-scoped (not ``monkeypatch``) so hypothesis tests may use it without a health-check
    complaint about function-scoped fixtures.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    yield
    os.environ.update(saved)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training API finds no GPU name: results must not depend on the test machine's GPU.
    Use it module-wide with ``pytestmark = pytest.mark.usefixtures("no_nvml")``."""
    from metricvault.collect import training

    monkeypatch.setattr(training, "detect_gpu_name", lambda: None)


@pytest.fixture
def self_signed_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, valid one day (TLS tests; needs openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key
