"""Hostile ingest (issue 10): series that collide through control characters, and requests sized
to keep a gateway worker busy (many series, many label names, long bodies).

The gateway runs in-process (Starlette's TestClient) over a real vault on disk; attack bodies are
built with the project's own remote-write encoder. Every refusal is checked for its status, its
message (which limit, how big, which setting) and for storing nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.collect.push import encode_write_request
from metricvault.config import Settings
from metricvault.errors import LabelError
from metricvault.ingest.app import create_app

RW1 = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
T0 = 1_767_225_600_000


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    opened: list[tuple[TestClient, Vault]] = []

    def start(**overrides: Any) -> tuple[TestClient, Vault]:
        settings = Settings.load(env={}, gateway_maintain=False, **overrides)
        vault = Vault.open(str(tmp_path / f"vault{len(opened)}"), settings)
        client = TestClient(create_app(vault, settings))
        client.__enter__()
        opened.append((client, vault))
        return client, vault

    yield start
    for client, vault in opened:
        client.__exit__(None, None, None)
        vault.close()


def stored_series(vault: Vault) -> list[tuple[str, dict[str, str]]]:
    """Every series the vault knows (acknowledged writes add theirs before the 2xx)."""
    return sorted((info.metric, info.labels) for info in vault.index.all())


def stored_rows(vault: Vault) -> int:
    """Samples in the durable ingest buffer: every acknowledged sample lands there first."""
    return int(vault.buffer.depth()[0])


# --------------------------------------------------------------------------- NUL collision


def test_issue10_nul_label_value_does_not_collide_through_the_series_cache(tmp_path):
    """The series cache joined values with NUL-based separators: a value holding them was read
    as the next column, so the second series was stored as the first."""
    vault = Vault.open(str(tmp_path / "v"), Settings.load(env={}))
    try:
        first = pa.table(
            {
                "metric": ["gpu_util"],
                "timestamp": [T0],
                "value": [1.0],
                "gpu": ["0"],
                "mig": pa.array([None], pa.string()),
            }
        )
        vault.write(first)
        forged = pa.table(
            {
                "metric": ["gpu_util"],
                "timestamp": [T0],
                "value": [2.0],
                "gpu": ["0"],
                "mig": ["\x00\x1e"],
            }
        )
        with pytest.raises(LabelError, match=r"label 'mig' contains the control character"):
            vault.write(forged)
        assert stored_series(vault) == [("gpu_util", {"gpu": "0"})]
        assert stored_rows(vault) == 1
    finally:
        vault.close()


@pytest.mark.parametrize("value", ["\x00\x1e", "\x00\x1f", "0\x00\x1f0", "\x1e"])
def test_issue10_control_characters_refused_on_every_gateway_request(gateway, value):
    client, vault = gateway()
    plain = encode_write_request([("gpu_util", {"gpu": "0"}, T0, 1.0)])
    assert client.post("/api/v1/write", content=plain, headers=RW1).status_code == 204
    for _ in range(2):  # the second time the series cache has seen gpu_util{gpu="0"}
        body = encode_write_request([("gpu_util", {"gpu": "0", "mig": value}, T0, 2.0)])
        refused = client.post("/api/v1/write", content=body, headers=RW1)
        assert refused.status_code == 400, refused.text
        assert 'gpu_util{gpu="0",mig=' in refused.text
        assert "label 'mig' contains the control character" in refused.text
    assert stored_series(vault) == [("gpu_util", {"gpu": "0"})]
    assert stored_rows(vault) == 1


def test_issue10_control_characters_refused_in_line_protocol(gateway):
    client, vault = gateway()
    refused = client.post(
        "/write", content=f"gpu,mig=a\x1fb util=1 {T0}".encode(), params={"precision": "ms"}
    )
    assert refused.status_code == 400, refused.text
    assert "mig" in refused.text and "control character U+001F" in refused.text
    assert stored_rows(vault) == 0
