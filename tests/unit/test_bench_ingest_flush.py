"""bench/ingest_flush.py at a tiny size, so the benchmark cannot rot: every timed sample is
stored and flushed, and the figures it prints are there."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import ingest_flush  # noqa: E402


@pytest.mark.parametrize("decoder", ["compiled", "numpy"])
def test_tiny_run_stores_and_flushes_every_timed_sample(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    decoder: str,
) -> None:
    from metricvault.ingest.protocols import remote_write_known

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its payloads and vault
    monkeypatch.setattr(remote_write_known, "USE_COMPILED", True)  # restored: the bench sets it
    argv = ["--requests", "12", "--warmup", "4", "--profile", "3", "--decoder", decoder]
    assert ingest_flush.main(argv) == 0
    out = capsys.readouterr().out
    assert f"decoder: {decoder};" in out
    found = re.search(r"requests timed: 8, samples ([\d,]+), flushed ([\d,]+)", out)
    assert found is not None, out
    assert found.group(1) == found.group(2) == "16,000"
    assert re.search(r"flush: \d+ ms CPU \(\d+ ns/sample\)", out)
    assert "ncalls" in out  # the flush's profile
