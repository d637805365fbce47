"""Storage fidelity (issue 13): NaN samples and Prometheus staleness markers are stored.

NaN and ±Inf are values; a staleness marker (the NaN with bits ``0x7ff0000000000002``) is a
marker, kept bit-exact through buffer, flush, compaction and reads. Rollups count only finite
samples; raw ``query`` hides markers unless asked (``stale_markers=True``), which the PromQL
source does.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pandas as pd
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import Settings
from metricvault.model import STALE_NAN_BITS
from metricvault.promql.source import is_stale
from metricvault.selector import Matcher
from metricvault.server.app import create_app
from metricvault.store import maintenance
from tests.unit.test_remote_write import decode_v1, v1_body

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
H = 3_600_000
D = 86_400_000
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]  # a payload NaN
RW1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def bits(values: object) -> list[int]:
    return [int(b) for b in np.asarray(values, dtype=np.float64).view(np.uint64)]


def odd_values(n: int = 120) -> list[float]:
    """Finite values with NaN, ±Inf and stale markers mixed in (5 s apart)."""
    out = [float(i % 17) * 0.5 for i in range(n)]
    out[7], out[30], out[31], out[64] = math.nan, math.inf, -math.inf, ODD_NAN
    out[50] = out[90] = out[119] = STALE
    return out


def test_nan_inf_and_stale_markers_survive_write_flush_compaction_read(tmp_path):
    values = odd_values()
    rows = [("g", {"k": "a"}, T0 + i * 5000, v) for i, v in enumerate(values)]
    with Vault.open_local(str(tmp_path / "v"), compact_small_file_bytes=10**9) as v:
        for chunk in range(0, len(rows), 40):  # several small files to compact
            v.write(rows[chunk : chunk + 40])
            v.flush()
        assert len(v.snapshot().tier_files("raw")) == 3
        got = v.query("g", T0, T0 + D, output="arrow", stale_markers=True)
        assert bits(got["value"]) == bits(values)
        maintenance.compact(v, now=T0 + 2 * D)
        assert len(v.snapshot().tier_files("raw")) == 1
        got = v.query("g", T0, T0 + D, output="arrow", stale_markers=True)
        assert bits(got["value"]) == bits(values)
        assert got["timestamp"].cast("int64").to_pylist() == [r[2] for r in rows]
    with Vault.open_local(str(tmp_path / "v")) as again:  # from the files alone
        got = again.query("g", T0, T0 + D, output="arrow", stale_markers=True)
        assert bits(got["value"]) == bits(values)


def test_raw_query_hides_stale_markers_unless_asked(tmp_path):
    values = odd_values()
    rows: list[tuple[str, dict[str, str], int, float]] = [
        ("g", {}, T0 + i * 5000, v) for i, v in enumerate(values)
    ]
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(rows)
        shown = v.query("g", T0, T0 + D, output="arrow")
        want = [x for x in values if not is_stale(np.array([x]))[0]]
        assert bits(shown["value"]) == bits(want)  # ordinary NaN and ±Inf are values
        frame = v.query("g", T0, T0 + D)
        assert len(frame) == len(values) - 3
        assert frame["value"].isna().sum() == 2
        [series] = v.select([Matcher("__name__", "=", "g")], T0, T0 + D)
        assert bits(series.values) == bits(values)
        assert int(is_stale(series.values).sum()) == 3


def _same_aggregates(a: Vault, b: Vault, metric: str, step: str) -> None:
    aggs = ("count", "sum", "min", "max", "last", "mean", "increase")
    got, want = (v.query(metric, T0, T0 + 3 * H, step=step, aggs=aggs) for v in (a, b))
    assert len(got) > 0
    pd.testing.assert_frame_equal(got, want, check_exact=True)


@pytest.mark.parametrize("metric", ["g", "c_total"])
def test_rollups_of_nan_and_markers_equal_rollups_of_finite_samples(tmp_path, metric):
    n = 2000  # a little under 3 hours at 5 s
    values = [float(i // 3) if metric == "c_total" else float(i % 23) for i in range(n)]
    for i in range(0, n, 37):
        values[i] = math.nan
    for i in range(5, n, 101):
        values[i] = STALE
    for i in range(11, n, 211):
        values[i] = math.inf
    values[40:52] = [STALE] * 12  # a whole minute of markers: no row, not a zero row
    all_rows: list[tuple[str, dict[str, str], int, float]] = [
        (metric, {}, T0 + i * 5000, x) for i, x in enumerate(values)
    ]
    finite_rows = [r for r in all_rows if math.isfinite(r[3])]
    with (
        Vault.open_local(str(tmp_path / "all")) as everything,
        Vault.open_local(str(tmp_path / "finite")) as finite,
    ):
        everything.write(all_rows)
        finite.write(finite_rows)
        for step in ("1m", "1h", "all"):  # from raw samples
            _same_aggregates(everything, finite, metric, step)
        everything.maintain(now_ms=T0 + 40 * D)
        finite.maintain(now_ms=T0 + 40 * D)
        for step in ("1m", "1h"):  # from the stored rollups
            _same_aggregates(everything, finite, metric, step)
        counts = everything.sql("SELECT sum(count) AS n FROM rollup_1m")["n"].tolist()
        assert counts == [len(finite_rows)]


@pytest.fixture
def client_and_vault(tmp_path):
    settings = Settings.load(env={}, gateway_maintain=False)
    vault = Vault.open_local(str(tmp_path / "gw"), settings)
    client = TestClient(create_app(vault, settings))
    client.__enter__()
    yield client, vault
    client.__exit__(None, None, None)
    vault.close()


def test_gateway_stores_stale_markers_and_nan_from_remote_write(client_and_vault):
    client, vault = client_and_vault
    values = [1.5, STALE, math.nan, math.inf, -math.inf, 2.5, STALE]
    body = v1_body(([("__name__", "x")], [(val, T0 + i) for i, val in enumerate(values)]))
    decoded = decode_v1(body)
    assert (decoded.samples, decoded.stale_markers, decoded.non_finite) == (7, 2, 3)
    assert bits(decoded.table["value"]) == bits(values)
    r = client.post("/api/v1/write", content=body, headers=RW1)
    assert r.status_code == 204, r.text
    got = vault.query("x", T0, T0 + 10, output="arrow", stale_markers=True)
    assert bits(got["value"]) == bits(values)
    assert vault.query("x", T0, T0 + 10, output="arrow").num_rows == 5
    page = client.get("/metrics").text
    assert 'metricvault_samples_stored_total{protocol="remote_write"} 7.0' in page
    assert 'reason="stale_marker"' not in page and 'reason="non_finite"' not in page


def test_vault_write_still_refuses_bad_timestamps_with_nan(tmp_path):
    from metricvault.errors import ValueRangeError

    with Vault.open_local(str(tmp_path / "v")) as v, pytest.raises(ValueRangeError):
        v.write([("m", {}, 1_000, math.nan)])
