"""First/last-seen times in the series index: what the Prometheus metadata endpoints
(``/api/v1/series``, ``/labels``, ``/label/<name>/values``) narrow ``start``/``end`` with.

A series is listed for a range that overlaps a UTC day between the day of its first and the
day of its last sample; series from files written before the times were kept count as always
present. Real Prometheus's answers on the same data: tests/e2e/test_prometheus_api.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import Settings
from metricvault.server.app import create_app
from metricvault.store import files as fmt
from metricvault.store.series_index import DAY_MS

DAY0 = 1_767_225_600_000 // DAY_MS  # 2026-01-01, a day number
HOSTS = {"old": (0, 2), "new": (10, 11), "always": (0, 11)}  # host -> first and last day


def _rows(host: str, days: tuple[int, int]) -> list[tuple[str, dict[str, str], int, float]]:
    """Samples every 6 h on each day of the span, and one at 23:59 on the last day."""
    first, last = days
    out = [
        ("node_up", {"host": host}, (DAY0 + day) * DAY_MS + h * 6 * 3_600_000, 1.0)
        for day in range(first, last + 1)
        for h in range(4)
    ]
    return [*out, ("node_up", {"host": host}, (DAY0 + last + 1) * DAY_MS - 60_000, 1.0)]


@pytest.fixture
def vault_dir(tmp_path: Path) -> str:
    path = str(tmp_path / "v")
    with Vault.open_local(path) as vault:
        for host, days in HOSTS.items():
            vault.write(_rows(host, days))
            vault.flush()
    return path


def _hosts(vault: Any, start_day: float | None, end_day: float | None) -> list[str]:
    start = None if start_day is None else round((DAY0 + start_day) * DAY_MS)
    end = None if end_day is None else round((DAY0 + end_day) * DAY_MS)
    table = vault.series("node_up", output="arrow", start_ms=start, end_ms=end)
    return sorted(table.column("host").to_pylist()) if "host" in table.column_names else []


RANGES = [  # (start day, end day) -> hosts listed
    ((None, None), ["always", "new", "old"]),
    ((0.5, 0.6), ["always", "old"]),  # inside the first day
    ((2.99, 3.5), ["always", "old"]),  # the last day of "old" counts to its end
    ((4.0, 9.0), ["always"]),
    ((10.0, None), ["always", "new"]),
    ((None, -0.001), []),  # before every sample
    ((12.0, 20.0), []),  # after every sample
    ((-5.0, 0.0), ["always", "old"]),  # the end is inclusive
]


@pytest.mark.parametrize(("span", "hosts"), RANGES)
def test_series_are_listed_for_the_days_they_have_samples(
    vault_dir: str, span: tuple[float | None, float | None], hosts: list[str]
) -> None:
    with Vault.open_local(vault_dir) as vault:  # reopened: the times come from the files
        assert _hosts(vault, *span) == hosts


def test_a_writer_sees_its_own_flushes_and_another_process_sees_them_to_the_day(
    vault_dir: str,
) -> None:
    with Vault.open_local(vault_dir) as writer, Vault.open_local(vault_dir) as reader:
        assert _hosts(reader, 13.0, 14.0) == []
        writer.write([("node_up", {"host": "new"}, (DAY0 + 13) * DAY_MS + 1000, 1.0)])
        assert _hosts(writer, 13.0, 14.0) == ["new"]
        reader.refresh()
        assert _hosts(reader, 13.0, 14.0) == ["new"]


def test_a_flush_rewrites_a_series_row_only_when_its_days_widen(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        base = DAY0 * DAY_MS
        for minute in range(5):  # the same day again and again: one row, when it was new
            vault.write([("node_up", {"host": "a"}, base + minute * 60_000, 1.0)])
            vault.flush()
        assert len(vault.catalog_version().series_files) == 1
        vault.write([("node_up", {"host": "a"}, base + DAY_MS, 1.0)])  # the next day
        vault.flush()
        files = vault.catalog_version().series_files
        assert [f.rows for f in files] == [1, 1]
        latest = fmt.read_table(files[-1].path, vault.location.fs)
        assert latest.column("first_ms").to_pylist() == [base]
        assert latest.column("last_ms").to_pylist() == [base + DAY_MS]


def test_series_from_files_without_times_are_always_listed(tmp_path: Path) -> None:
    path = str(tmp_path / "v")
    with Vault.open_local(path) as vault:
        vault.write(_rows("legacy", (0, 0)))
        vault.flush()
        series_file = vault.catalog_version().series_files[0].path
    table = pq.read_table(series_file)
    legacy = table.drop_columns(["first_ms", "last_ms"])  # as written before the times
    Path(series_file).write_bytes(fmt.write_plain_parquet(legacy))
    from metricvault.store.check import check

    with Vault.open_local(path) as vault:
        assert _hosts(vault, 100.0, 101.0) == ["legacy"]
        vault.write(_rows("fresh", (0, 0)))
        assert _hosts(vault, 100.0, 101.0) == ["legacy"]
        assert not check(vault.location).problems


@pytest.fixture
def client(vault_dir: str) -> Iterator[TestClient]:
    settings = Settings.load(env={}, gateway_maintain=False)
    vault = Vault.open_local(vault_dir, settings)
    with TestClient(create_app(vault, settings)) as test_client:
        yield test_client
    vault.close()


def _seconds(day: float) -> str:
    return f"{(DAY0 + day) * DAY_MS / 1000:.3f}"


@pytest.mark.parametrize(
    ("path", "params", "want"),
    [
        ("/api/v1/label/host/values", {}, ["always", "new", "old"]),
        ("/api/v1/label/host/values", {"start": _seconds(4), "end": _seconds(9)}, ["always"]),
        ("/api/v1/label/host/values", {"start": _seconds(10.5)}, ["always", "new"]),
        ("/api/v1/label/host/values", {"end": _seconds(1)}, ["always", "old"]),
        ("/api/v1/labels", {"start": _seconds(30), "end": _seconds(31)}, []),
        ("/api/v1/labels", {"start": _seconds(5), "end": _seconds(6)}, ["__name__", "host"]),
        ("/api/v1/label/host/values", {"start": _seconds(6), "end": _seconds(5)}, []),
    ],
)
def test_metadata_endpoints_honour_start_and_end(
    client: TestClient, path: str, params: dict[str, str], want: list[str]
) -> None:
    reply = client.get(path, params={**params, "match[]": "node_up"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["data"] == want and "warnings" not in body, body


def test_series_endpoint_honours_start_and_end(client: TestClient) -> None:
    reply = client.post(
        "/api/v1/series",
        data={"match[]": "node_up", "start": _seconds(10), "end": _seconds(10.5)},
    )
    assert reply.status_code == 200, reply.text
    hosts = sorted(s["host"] for s in reply.json()["data"])
    assert hosts == ["always", "new"]


def test_unknown_api_paths_answer_prometheus_shaped_json_404s(client: TestClient) -> None:
    for method, path in [
        ("GET", "/api/v1/nope"),
        ("POST", "/api/v1/query/extra"),
        ("DELETE", "/api/v1/admin/tsdb/delete_series"),
    ]:
        reply = client.request(method, path)
        assert reply.status_code == 404, (method, path, reply.text)
        body = reply.json()
        assert body["status"] == "error" and body["errorType"] == "not_found", body
        assert path in body["error"] and "/api/v1/query_range" in body["error"]
    # paths served by APIs mounted after the query API keep answering themselves
    assert client.post("/api/v1/read", content=b"").status_code != 404
    assert client.get("/api/v1/labels").status_code == 200


def test_an_empty_table_of_times_is_read() -> None:
    from metricvault.store.series_index import SeriesIndex

    index = SeriesIndex()
    empty = pa.table(
        {
            "series_id": pa.array([], pa.int64()),
            "metric": pa.array([], pa.string()),
            "labels": pa.array([], pa.string()),
            "kind": pa.array([], pa.string()),
            "first_ms": pa.array([], pa.int64()),
            "last_ms": pa.array([], pa.int64()),
        }
    )
    index.load_table(empty)
    assert len(index) == 0


def test_series_files_are_merged_into_one_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metricvault.store import vault as vault_module

    monkeypatch.setattr(vault_module, "SERIES_FILES_MAX", 4)
    path = str(tmp_path / "v")
    with Vault.open_local(path) as writer:
        for day in range(12):  # a new day each flush: a row for every host each time
            writer.write([("node_up", {"host": h}, (DAY0 + day) * DAY_MS, 1.0) for h in "ab"])
            writer.write([("node_up", {"host": f"only-{day}"}, (DAY0 + day) * DAY_MS, 1.0)])
            writer.flush()
            assert len(writer.catalog_version().series_files) <= 4
        assert len(writer.series(output="arrow")) == 2 + 12
    with Vault.open_local(path) as reader:
        assert len(reader.index) == 14
        assert _hosts(reader, 5.0, 5.5) == ["a", "b", "only-5"]
        assert _hosts(reader, 11.0, None) == ["a", "b", "only-11"]


def test_a_served_path_asked_with_another_method_is_405_not_404(client: TestClient) -> None:
    reply = client.request("DELETE", "/api/v1/query")
    assert reply.status_code == 405, reply.text
    assert reply.json()["status"] == "error" and "GET" in reply.headers["Allow"]
