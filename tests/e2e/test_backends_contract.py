"""The shared behaviour suite (tests/backend_suite.py) over the backends that need a
real server: an InfluxDB 1.x database (a real ``influxd``) and a gateway URL (a real
``metricvault serve``). Each answers what it can exactly as the embedded vault does on the same
data, and refuses what it cannot with UnsupportedError naming itself, what it lacks, and where
to turn instead, before any work.
"""

# ruff: noqa: F811  (the fixtures imported from influx_fixture are parameters here)
from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import metricvault
from metricvault.config import Settings
from metricvault.errors import UnsupportedError
from metricvault.protocols import has
from metricvault.public import Vault
from metricvault.public_influx import InfluxVault
from metricvault.store.backends.influxdb import setup

from .. import backend_suite as suite
from .conftest import GatewayProcess
from .influx_fixture import InfluxServer, influxd  # noqa: F401

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def t0() -> int:
    return suite.recent_hour()  # InfluxDB refuses points older than its raw policy (30 days)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory, t0: int) -> Iterator[Vault]:
    """The reference: the embedded vault holding the suite's data."""
    vault = Vault.open_local(str(tmp_path_factory.mktemp("reference") / "v"))
    suite.fill(vault, t0)
    yield vault
    vault.close()


# --------------------------------------------------------------------------- InfluxDB
@pytest.fixture(scope="module")
def influx_uri(influxd: InfluxServer) -> str:
    uri = influxd.uri(f"mv_contract_{uuid.uuid4().hex[:8]}")
    setup(uri, Settings())
    return uri


@pytest.fixture(scope="module")
def influx(influx_uri: str, t0: int) -> Iterator[Any]:
    store = metricvault.open(influx_uri, need="read+write")
    assert isinstance(store, InfluxVault)
    suite.fill(store, t0)
    yield store
    store.close()


@pytest.mark.parametrize("step", suite.STEPS)
def test_influxdb_answers_a_query_as_the_embedded_vault(embedded, influx, t0, step):
    suite.check_query(embedded, influx, t0, step)


def test_influxdb_lists_the_same_series(embedded, influx):
    suite.check_series(embedded, influx)


def test_influxdb_stats_count_the_same_series(embedded, influx, t0):
    suite.check_stats(embedded, influx, t0)


def test_influxdb_places_history_by_step_alike(embedded, influx):
    suite.check_history(embedded, influx)


def test_influxdb_refuses_sql_saying_what_to_use_instead(influx, influx_uri):
    assert has(influx, "read") and has(influx, "serve") and not has(influx, "sql")
    with pytest.raises(UnsupportedError) as caught:
        metricvault.open(influx_uri, need="sql")
    message = str(caught.value)
    assert f"{influx.uri} is an InfluxDB database, which cannot do SQL views" in message
    assert "use query() or promql() (or InfluxQL directly against the database)" in message
    with pytest.raises(UnsupportedError) as caught:
        influx.sql("SELECT count(*) FROM series")
    message = " ".join(str(caught.value).split())
    assert "SQL views (raw, rollup_1m, rollup_1h, series, experiments) exist only" in message
    assert "run the same SQL on its snapshot" in message
    with pytest.raises(UnsupportedError, match="InfluxDB keeps no versions of its data"):
        influx.catalog_version()


@pytest.mark.parametrize("step", suite.STEPS)
def test_influxdb_answers_alike_from_its_rollups_after_maintain(embedded, influx, t0, step):
    # Both stores roll the hour up (InfluxDB with its continuous query's SELECT): steps of whole
    # minutes are then read from the 1-minute tier on both sides, raw samples stay as they were.
    embedded.maintain(now_ms=t0 + 3 * suite.HOUR_MS)
    influx.maintain()
    suite.check_query(embedded, influx, t0, step)
    for tier, rows in (("raw", suite.RAW_SAMPLES), ("1m", suite.MINUTE_ROWS)):
        assert influx.stats()["tiers"][tier]["rows"] == embedded.stats()["tiers"][tier]["rows"]
        assert embedded.stats()["tiers"][tier]["rows"] == rows


@pytest.mark.parametrize("expr", suite.PROMQL)
def test_promql_on_influxdb_answers_as_the_embedded_vault(embedded, influx, t0, expr):
    """rate, increase and every *_over_time used to raise UnsupportedError on InfluxDB (the
    engine found catalog_version there and called it); they read its raw samples now."""
    suite.check_promql(embedded, influx, t0, expr)
    assert influx.horizons().raw_start_ms > 0  # its raw retention policy's horizon


def test_promql_on_influxdb_through_the_vault_api(influx, t0):
    frame = influx.promql(f"increase({suite.COUNTER}[1h])", t0 + suite.HOUR_MS)
    assert frame["value"].tolist() and frame["value"].iloc[0] > 0


def test_archive_export_from_influxdb_runs_the_vault_sql_on_its_snapshot(
    embedded, influx, tmp_path
):
    from metricvault.archive.snapshot import export_snapshot

    info = export_snapshot(influx, suite.EXPERIMENT, tmp_path)
    with metricvault.open(str(info.path)) as snapshot:
        for statement in suite.SQL:
            suite.check_sql(embedded, snapshot, statement)


# --------------------------------------------------------------------------- gateway URL
@pytest.mark.parametrize(
    ("need", "what"),
    [
        ("read", "reading"),
        ("maintain", "maintenance"),
        ("sql", "SQL views"),
        ("serve", "serving a gateway"),
    ],
)
def test_a_gateway_url_refuses_what_it_cannot_do_before_any_request(need, what):
    # A listener of our own stands in for the gateway: a refusal must not even connect.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(UnsupportedError) as caught:
            metricvault.open(url + "/api/v1/write", need=need)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):  # nothing connected
            listener.accept()
    message = " ".join(str(caught.value).split())
    assert f"{url} is a gateway, which cannot do {what}" in message
    assert "it supports experiments, write" in message
    assert "open the vault the gateway stores into (its --data)" in message


def test_a_gateway_url_writes_into_its_vault_and_keeps_experiments(gateway, embedded, t0):
    gw: GatewayProcess = gateway()
    with metricvault.open(gw.url, need="write+experiments") as store:
        assert has(store, "write") and not has(store, "read")
        suite.fill(store, t0)
        record = store.experiments.get(suite.EXPERIMENT)
        assert (record.selector, record.start_ms, record.end_ms) == (
            suite.SELECTOR,
            t0,
            t0 + suite.HOUR_MS,
        )
        assert [e.id for e in store.experiments.list()] == [suite.EXPERIMENT]
        assert store.experiments.ids() == [suite.EXPERIMENT]
    gw.stop_gracefully()  # drains and flushes every worker's buffer into the vault
    # read back through the vault the gateway stores into: the same answers as the reference
    with Vault.open_local(str(gw.data_dir), create=False) as stored:
        assert stored.experiments.get(suite.EXPERIMENT) == record  # the gateway's record
        for step in suite.STEPS:
            suite.check_query(embedded, stored, t0, step)
        suite.check_series(embedded, stored)
        suite.check_stats(embedded, stored, t0)
        suite.check_history(embedded, stored)
        for expr in suite.PROMQL:  # what was written through the gateway reads alike
            suite.check_promql(embedded, stored, t0, expr)


def test_archive_export_through_a_real_gateway_is_refused_saying_to_use_its_vault(
    gateway, t0, tmp_path
):
    """It used to end in AttributeError: 'GatewayVault' object has no attribute
    'sample_reader'. Now it is refused before any request; the vault behind it exports."""
    import subprocess
    import sys

    def export(data: str) -> subprocess.CompletedProcess[str]:
        command = ["archive", "export", suite.EXPERIMENT, "--data", data]
        return subprocess.run(
            [sys.executable, "-m", "metricvault.cli", *command, "--output", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=120,
        )

    gw: GatewayProcess = gateway()
    with metricvault.open(gw.url, need="write+experiments") as store:
        suite.fill(store, t0)
    proc = export(gw.url)
    message = " ".join(proc.stderr.split())
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr, proc.stderr
    assert f"{gw.url} is a gateway, which cannot do archive export" in message
    assert "as --data instead of the gateway URL" in message
    assert not (tmp_path / "out").exists()
    gw.stop_gracefully()
    proc = export(str(gw.data_dir))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / f"{suite.EXPERIMENT}.parquet").exists()
