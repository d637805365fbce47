"""Hostile ingest (issue 10): series that collide through control characters, and requests sized
to keep a gateway worker busy (many series, many label names, long bodies).

The gateway runs in-process (Starlette's TestClient) over a real vault on disk; attack bodies are
built with the project's own remote-write encoder. Every refusal is checked for its status, its
message (which limit, how big, which setting) and for storing nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import Settings
from metricvault.errors import LabelError
from metricvault.server.app import create_app
from metricvault.wire.remote_write import encode_write_request

RW1 = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
T0 = 1_767_225_600_000


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    opened: list[tuple[TestClient, Vault]] = []

    def start(**overrides: Any) -> tuple[TestClient, Vault]:
        settings = Settings.load(env={}, gateway_maintain=False, **overrides)
        vault = Vault.open_local(str(tmp_path / f"vault{len(opened)}"), settings)
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
    series = sorted((info.metric, info.labels_json, info.labels) for info in vault.index.all())
    return [(metric, labels) for metric, _, labels in series]


def stored_rows(vault: Vault) -> int:
    """Samples in the durable ingest buffer: every acknowledged sample lands there first."""
    return int(vault.buffer.depth()[0])


# --------------------------------------------------------------------------- NUL collision


def test_nul_label_value_does_not_collide_through_the_series_cache(tmp_path):
    """The series cache joined values with NUL-based separators: a value holding them was read
    as the next column, so the second series was stored as the first."""
    vault = Vault.open_local(str(tmp_path / "v"), Settings.load(env={}))
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
def test_control_characters_refused_on_every_gateway_request(gateway, value):
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


def test_control_characters_refused_in_line_protocol(gateway):
    client, vault = gateway()
    refused = client.post(
        "/write", content=f"gpu,mig=a\x1fb util=1 {T0}".encode(), params={"precision": "ms"}
    )
    assert refused.status_code == 400, refused.text
    assert "mig" in refused.text and "control character U+001F" in refused.text
    assert stored_rows(vault) == 0


# --------------------------------------------------------------------------- request limits


def wide_series(series: int, names_each: int) -> list[Any]:
    """``series`` series, each with ``names_each`` label names no other series uses."""
    return [
        ("gpu_util", {f"l{i}_{j}": "x" for j in range(names_each)}, T0, 1.0) for i in range(series)
    ]


def wide_lines(lines: int, names_each: int) -> bytes:
    rows = []
    for i in range(lines):
        tags = ",".join(f"t{i}_{j}=x" for j in range(names_each))
        rows.append(f"gpu,{tags} util=1 {T0}")
    return "\n".join(rows).encode()


def test_1000_series_with_33_own_label_names_refused_413(gateway):
    client, vault = gateway()  # the default limits
    body = encode_write_request(wide_series(1000, 33))
    refused = client.post("/api/v1/write", content=body, headers=RW1)
    assert refused.status_code == 413, refused.text
    assert "33,000 distinct label names" in refused.text
    assert "limit of 1,000 per request (max_label_names_per_request)" in refused.text
    assert stored_rows(vault) == 0 and stored_series(vault) == []


def test_line_protocol_with_too_many_tag_keys_refused_413(gateway):
    client, vault = gateway(max_label_names_per_request=50)
    refused = client.post("/write", content=wide_lines(30, 2), params={"precision": "ms"})
    assert refused.status_code == 413, refused.text
    assert "51 distinct label names" in refused.text
    assert "max_label_names_per_request" in refused.text
    assert stored_rows(vault) == 0


def test_too_many_series_per_request_refused_413(gateway):
    client, vault = gateway(max_series_per_request=100)
    body = encode_write_request([("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(101)])
    refused = client.post("/api/v1/write", content=body, headers=RW1)
    assert refused.status_code == 413, refused.text
    assert "101 time series, over the limit of 100" in refused.text
    assert "max_series_per_request" in refused.text
    lines = "\n".join(f"gpu,gpu={i} util=1,mem=2 {T0}" for i in range(51)).encode()
    refused = client.post("/write", content=lines, params={"precision": "ms"})
    assert refused.status_code == 413, refused.text  # 51 points x 2 fields = 102 series
    assert "more than 100 series" in refused.text and "max_series_per_request" in refused.text
    assert stored_rows(vault) == 0 and stored_series(vault) == []


def test_default_series_limit_refuses_100000_series(gateway):
    client, vault = gateway()
    body = encode_write_request([("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(100_000)])
    refused = client.post("/api/v1/write", content=body, headers=RW1)
    assert refused.status_code == 413, refused.text
    assert "over the limit of 20,000" in refused.text
    assert stored_rows(vault) == 0


def test_new_series_per_minute_answers_429_with_retry_after(gateway):
    client, vault = gateway(max_new_series_per_minute=10)
    first = encode_write_request([("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(8)])
    assert client.post("/api/v1/write", content=first, headers=RW1).status_code == 204
    more = encode_write_request([("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(8, 11)])
    refused = client.post("/api/v1/write", content=more, headers=RW1)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "would create 3 new series, with 8 created in the last minute" in refused.text
    assert "max_new_series_per_minute" in refused.text
    assert stored_rows(vault) == 8 and len(stored_series(vault)) == 8


def test_more_new_series_than_a_minute_allows_is_413_not_429(gateway):
    """Retrying such a request can never succeed, so Retry-After would loop a sender forever."""
    client, vault = gateway(max_new_series_per_minute=10)
    body = encode_write_request([("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(11)])
    refused = client.post("/api/v1/write", content=body, headers=RW1)
    assert refused.status_code == 413, refused.text
    assert "11 new series" in refused.text and "max_new_series_per_minute" in refused.text
    assert stored_rows(vault) == 0


def test_decode_time_budget_refuses_a_long_body_413(gateway):
    # 1 ms of CPU cannot decode 40,000 lines (it takes tens of ms at best): a budget test
    # whose direction does not depend on the machine's speed.
    client, vault = gateway(decode_time_budget="1ms")
    lines = "\n".join(f"gpu,gpu={i % 8} util={i} {T0 + i}" for i in range(40_000)).encode()
    refused = client.post("/write", content=lines, params={"precision": "ms"})
    assert refused.status_code == 413, refused.text
    assert "over the budget of 0.001 s per request (decode_time_budget)" in refused.text
    assert stored_rows(vault) == 0
    normal = encode_write_request([("gpu_util", {"gpu": "0"}, T0, 1.0)])
    default, default_vault = gateway()  # the default 2 s budget: a normal request goes in
    assert default.post("/api/v1/write", content=normal, headers=RW1).status_code == 204
    assert stored_rows(default_vault) == 1


def test_resolving_a_wide_sparse_table_visits_only_present_cells():
    """Vault.write of series with label names each of their own (a table of mostly null
    columns): resolving them converted every cell to a Python object, series x names (500 x
    10,000: 60 MB traced at peak; 1,000 x 33,000: 387 MB); now only the present cells are
    (7 MB). A memory bound on the algorithm, not a timing."""
    import tracemalloc

    from metricvault.store.normalize import normalize

    series, names_each = 500, 20
    columns: dict[str, Any] = {
        "metric": ["gpu_util"] * series,
        "timestamp": [T0] * series,
        "value": [1.0] * series,
    }
    absent_but_one = pa.array(["x", None])
    for i in range(series):  # row i alone holds its 20 labels
        picks = np.ones(series, dtype=np.int64)
        picks[i] = 0
        cell = absent_but_one.take(pa.array(picks))
        for j in range(names_each):
            columns[f"l{i}_{j}"] = cell
    table = pa.table(columns)
    tracemalloc.start()
    try:
        batch = normalize(table)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(batch.series) == series
    assert all(len(json.loads(labels)) == names_each for _, _, labels, _ in batch.series)
    assert peak < 24 * 1024**2, f"normalize traced {peak / 1024**2:.0f} MB at peak"
