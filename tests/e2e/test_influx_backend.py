"""End-to-end: the InfluxDB 1.x backend against a real ``influxd`` (issue 6).

Covers ``metricvault influx setup`` (exact, idempotent, ``--dry-run``), the reversible mapping
(raw samples read back bit for bit, labels that need escaping included), the 1-minute rollups
``maintain`` computes with the continuous query's SELECT compared with the embedded store's on
the same simulator data, late data re-rolled by the next ``maintain``, archive export from both
backends, the experiment registry, clear errors, and the store's shared behaviour run against
both backends.

Timestamps are near now: InfluxDB refuses points older than the raw policy's 30 days.
"""

# ruff: noqa: F811  (the fixtures imported from influx_fixture are parameters here)
from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from metricvault.archive.snapshot import export_snapshot
from metricvault.archive.snapshot_format import content_hash
from metricvault.cli.influx import influx_app
from metricvault.config import Settings
from metricvault.errors import (
    ConfigError,
    ConflictError,
    InputError,
    LabelError,
    NotFoundError,
    StorageError,
    TimeRangeError,
    UnsupportedError,
    ValueRangeError,
)
from metricvault.model import Series
from metricvault.public import Vault
from metricvault.public_influx import InfluxVault
from metricvault.sim import ClusterSpec, generate
from metricvault.store.backends.influx_client import InfluxClient, parse_uri
from metricvault.store.backends.influxdb import setup, setup_statements

from .conftest import free_port
from .influx_fixture import (  # noqa: F401
    InfluxServer,
    influxd,
    influxd_auth,
    influxd_tls,
)

pytestmark = pytest.mark.e2e

HOUR_MS, MINUTE_MS = 3_600_000, 60_000
AGGS = ("mean", "min", "max", "count", "sum", "last", "increase")
EXACT = ("count", "min", "max", "last", "value")
SETTINGS = Settings()
# a sum or mean read from InfluxDB rollups is mean*count with InfluxDB's naive summation;
# the embedded store sums exactly (fsum): they agree to the last few bits
RTOL = 1e-12


def new_db() -> str:
    return f"mv_{uuid.uuid4().hex[:10]}"


def fresh_vault(server: InfluxServer) -> InfluxVault:
    uri = server.uri(new_db())
    setup(uri, SETTINGS)
    return InfluxVault.open(uri, SETTINGS)


def sim_spec() -> ClusterSpec:
    start = (int(time.time() * 1000) - 4 * HOUR_MS) // HOUR_MS * HOUR_MS
    return ClusterSpec(nodes=1, gpus_per_node=2, days=2 / 24, interval_s=15, start_ms=start)


def sim_table(spec: ClusterSpec) -> pa.Table:
    return pa.concat_tables(list(generate(spec)))


class Pair:
    """The same data in an embedded vault and in InfluxDB, both maintained."""

    def __init__(self, server: InfluxServer, directory: Path, data: pa.Table) -> None:
        self.embedded = Vault.open_local(str(directory), SETTINGS)
        self.influx = fresh_vault(server)
        self.data = data
        self.start = int(pc.min(data["timestamp"]).as_py()) // HOUR_MS * HOUR_MS
        self.end = self.start + 3 * HOUR_MS
        for vault in (self.embedded, self.influx):
            vault.write(data)
        self.maintain()

    def maintain(self) -> None:
        self.embedded.maintain(now_ms=int(time.time() * 1000))
        self.influx.maintain()

    def close(self) -> None:
        self.embedded.close()
        self.influx.close()


@pytest.fixture(scope="module")
def pair(influxd: InfluxServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    both = Pair(influxd, tmp_path_factory.mktemp("embedded"), sim_table(sim_spec()))
    yield both
    both.close()


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in frame.columns if c not in (*AGGS, "value")]
    return frame.sort_values(keys).reset_index(drop=True)


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same rows and labels; count/min/max/last/value bit for bit, sums and means to RTOL."""
    got, want = ordered(got), ordered(want)
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want) > 0
    for col in got.columns:
        a, b = got[col].to_numpy(), want[col].to_numpy()
        if col in EXACT:
            assert np.array_equal(a.astype(np.float64), b.astype(np.float64)), col
        elif col in AGGS:
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=RTOL, atol=1e-9, err_msg=col
            )
        else:
            assert (got[col].fillna("") == want[col].fillna("")).all(), col


# --------------------------------------------------------------------------- setup
def show(server: InfluxServer, db: str) -> tuple[list[Any], list[Any]]:
    policies = server.rows(f'SHOW RETENTION POLICIES ON "{db}"')
    cqs = [
        (s["name"], s["values"])
        for s in server.query("SHOW CONTINUOUS QUERIES")[0]["series"]
        if s["name"] == db
    ]
    return [(p["name"], p["duration"], p["default"]) for p in policies], cqs


def expected_cq(db: str) -> str:
    return (
        f"CREATE CONTINUOUS QUERY cq_metricvault_1m ON {db} BEGIN SELECT mean(*), min(*), "
        f"max(*), count(*), last(*) INTO {db}.rp_longterm_3y.:MEASUREMENT FROM "
        f"{db}.rp_raw_30d./.*/ GROUP BY time(1m), * END"
    )


def test_setup_creates_exactly_the_policies_and_query_and_is_idempotent(influxd):
    db = new_db()
    ran = setup(influxd.uri(db), SETTINGS)
    assert ran == setup_statements(db, SETTINGS)
    policies, cqs = show(influxd, db)
    assert sorted(policies) == [
        ("rp_longterm_3y", "26280h0m0s", False),
        ("rp_metricvault_meta", "0s", False),
        ("rp_raw_30d", "720h0m0s", True),
    ]
    assert cqs == [(db, [["cq_metricvault_1m", expected_cq(db)]])]
    assert setup(influxd.uri(db), SETTINGS) == []
    assert show(influxd, db) == (policies, cqs)


def test_setup_alters_a_changed_policy_and_recreates_a_changed_query(influxd):
    db = new_db()
    setup(influxd.uri(db), SETTINGS)
    wanted = show(influxd, db)
    influxd.query(f'ALTER RETENTION POLICY "rp_longterm_3y" ON "{db}" DURATION 100d')
    influxd.query(f'DROP CONTINUOUS QUERY "cq_metricvault_1m" ON "{db}"')
    influxd.query(
        f'CREATE CONTINUOUS QUERY "cq_metricvault_1m" ON "{db}" BEGIN SELECT mean(*) INTO '
        f'"{db}"."rp_longterm_3y".:MEASUREMENT FROM "{db}"."rp_raw_30d"./.*/ '
        "GROUP BY time(5m), * END"
    )
    ran = setup(influxd.uri(db), SETTINGS)
    assert ran == [
        f'ALTER RETENTION POLICY "rp_longterm_3y" ON "{db}" DURATION 1095d',
        f'DROP CONTINUOUS QUERY "cq_metricvault_1m" ON "{db}"',
        setup_statements(db, SETTINGS)[-1],
    ]
    assert show(influxd, db) == wanted


def test_dry_run_prints_the_statements_and_runs_nothing(influxd):
    db = new_db()
    result = CliRunner().invoke(influx_app, ["setup", "--url", influxd.uri(db), "--dry-run"])
    assert result.exit_code == 0, result.output
    for statement in setup_statements(db, SETTINGS):
        assert f"{statement};" in result.output
    assert "nothing was sent" in result.output
    assert db not in {r["name"] for r in influxd.rows("SHOW DATABASES")}
    ran = CliRunner().invoke(influx_app, ["setup", "--url", influxd.uri(db)])
    assert ran.exit_code == 0, ran.output
    assert setup_statements(db, SETTINGS)[0] in ran.output
    again = CliRunner().invoke(influx_app, ["setup", "--url", influxd.uri(db)])
    assert "already set up" in again.output


def test_setup_names_policies_after_the_tier_settings():
    statements = setup_statements("db", Settings(retention_raw="90d", retention_1m="forever"))
    assert statements[0].endswith('DURATION 90d REPLICATION 1 NAME "rp_raw_90d"')
    assert 'RETENTION POLICY "rp_longterm_forever" ON "db" DURATION INF' in statements[1]
    assert '"db"."rp_raw_90d"./.*/' in statements[-1]


# --------------------------------------------------------------------------- mapping
TRICKY_LABELS = [
    {"host": "node 01", "path": "a,b=c", "quote": 'say "hi"', "apos": "it's"},
    {"host": "zürich ☃", "path": "C:\\data\\x", "tab": "a\tb"},
    {"host": "node01"},
    {},
]
TRICKY_VALUES = [0.1, -0.0, 5e-324, 1e300, -1.7976931348623157e308, 1 / 3, 42.0, 1e-7]


def test_written_samples_read_back_bit_for_bit(influxd):
    t0 = (int(time.time() * 1000) - HOUR_MS) // 1000 * 1000
    rows = [
        ("probe_metric", labels, t0 + 1000 * i + j, value)
        for j, labels in enumerate(TRICKY_LABELS)
        for i, value in enumerate(TRICKY_VALUES)
    ]
    with fresh_vault(influxd) as vault:
        assert vault.write(rows) == len(rows)
        got = vault.query("probe_metric", t0 - 1, t0 + HOUR_MS, output="arrow")
        fresh = InfluxVault.open(vault.client.target.uri, SETTINGS)  # reads the mapping back
        ids = {Series.make("probe_metric", labels).series_id for labels in TRICKY_LABELS}
        assert {i.series_id for i in fresh.index.all()} == ids
        fresh.close()
    by_key = {(tuple(sorted(labels.items())), ts): value for _, labels, ts, value in rows}
    label_names = [c for c in got.column_names if c not in ("timestamp", "metric", "value")]
    assert len(got) == len(rows)
    got = got.set_column(0, "timestamp", got["timestamp"].cast(pa.int64()))
    for row in got.to_pylist():
        labels = tuple(sorted((k, row[k]) for k in label_names if row[k] is not None))
        want = by_key[(labels, row["timestamp"])]
        assert np.float64(row["value"]).tobytes() == np.float64(want).tobytes(), (labels, want)


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"note": "two\nlines"}, "newline"),
        ({"path": "ends with\\"}, "backslash"),
        ({"path": "a\\,b"}, "backslash"),
        ({"time": "x"}, "'time'"),
    ],
)
def test_labels_influxdb_cannot_hold_are_refused_before_writing(influxd, labels, why):
    t0 = int(time.time() * 1000) - MINUTE_MS
    with fresh_vault(influxd) as vault:
        with pytest.raises(LabelError, match=why):
            vault.write([("ok_metric", {}, t0, 1.0), ("bad_metric", labels, t0, 2.0)])
        assert vault.query("ok_metric or bad_metric", t0 - 1, t0 + 1).empty


# --------------------------------------------------------------------------- rollups
@pytest.mark.parametrize("step", ["1m", "5m", "1h", "all", "90s"])
@pytest.mark.parametrize("aligned", [True, False])
def test_downsampled_values_equal_the_embedded_stores(pair, step, aligned):
    # unaligned: the range's edges are served from raw samples, the middle from rollups
    start, end = (
        (pair.start, pair.end) if aligned else (pair.start + 7_777, pair.end - HOUR_MS - 12_345)
    )
    for selector in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mfu"):
        args = (selector, start, end, step, AGGS)
        assert_same(pair.influx.query(*args), pair.embedded.query(*args))


def test_maintain_stores_the_continuous_query_fields_and_increase(pair, influxd):
    db = pair.influx.client.target.database
    rows = influxd.rows(
        "SELECT * FROM rp_longterm_3y.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION GROUP BY *", db
    )
    assert rows, "maintain wrote no rollups"
    assert {
        "count_value",
        "mean_value",
        "min_value",
        "max_value",
        "last_value",
        "sum_value",
        "increase_value",
    } <= set(rows[0])
    stats = pair.influx.stats()
    assert stats["tiers"]["raw"]["rows"] == pair.data.num_rows
    assert stats["series"] == stats["tiers"]["raw"]["series"] == 36
    assert stats["rollup"]["pending_hours"] == 0


def test_late_data_is_recomputed_by_the_next_maintain(influxd, tmp_path):
    both = Pair(influxd, tmp_path / "embedded", sim_table(sim_spec()))
    minute = both.start + 30 * MINUTE_MS
    gpu0 = {"Hostname": "node01", "gpu": "0"}
    util = both.embedded.series('DCGM_FI_DEV_GPU_UTIL{gpu="0"}').iloc[0]
    energy = both.embedded.series('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"}').iloc[0]
    late = [
        ("DCGM_FI_DEV_GPU_UTIL", _labels(util), minute + 7_500, 1000.0),
        # just before the next minute: a counter "reset" that changes two minutes' increase
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _labels(energy), minute + 59_000, 1.0),
    ]
    db = both.influx.client.target.database
    stored = f"SELECT * FROM rp_longterm_3y.DCGM_FI_DEV_GPU_UTIL WHERE time = {minute}ms AND "
    stored += " AND ".join(f"\"{k}\" = '{v}'" for k, v in gpu0.items())
    before = influxd.rows(stored, db)
    try:
        for vault in (both.embedded, both.influx):
            vault.write(late)
        assert influxd.rows(stored, db) == before  # the continuous query never goes back
        assert both.influx.stats()["rollup"]["pending_hours"] == 1
        window = (minute - HOUR_MS, minute + HOUR_MS)
        for selector in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
            # before maintain the pending minutes are read from raw samples: still right
            args = (selector, *window, "1m", AGGS)
            assert_same(both.influx.query(*args), both.embedded.query(*args))
        both.maintain()
        after = influxd.rows(stored, db)
        assert after[0]["count_value"] == before[0]["count_value"] + 1
        assert after[0]["max_value"] == 1000.0
        assert both.influx.stats()["rollup"]["pending_hours"] == 0
        for selector in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
            for step in ("1m", "1h"):
                args = (selector, *window, step, AGGS)
                assert_same(both.influx.query(*args), both.embedded.query(*args))
        increase = influxd.rows(
            "SELECT increase_value FROM rp_longterm_3y.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION "
            f"WHERE time >= {minute}ms AND time <= {minute + MINUTE_MS}ms AND \"gpu\" = '0'",
            db,
        )
        want = both.embedded.query(
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"}',
            minute,
            minute + 2 * MINUTE_MS,
            "1m",
            ("increase",),
        )
        np.testing.assert_allclose([r["increase_value"] for r in increase], want["increase"])
    finally:
        both.close()


def test_queries_pick_the_policy_by_step_and_completeness(influxd):
    """A row planted in the long-term policy shows which policy answered."""
    t0 = _t0()
    with fresh_vault(influxd) as vault:
        vault.write([("load", {"h": "a"}, t0 + 10_000 * i, 1.0) for i in range(18)])
        vault.maintain()
        db = vault.client.target.database
        planted = "load,h=a count_value=99i,mean_value=1,min_value=1,max_value=1,last_value=1"
        vault.client.write(f"{planted} {t0}\n".encode(), "rp_longterm_3y")
        end = t0 + 3 * MINUTE_MS

        def counts(step: str) -> list[int]:
            frame = vault.query("load", t0, end, step=step, aggs=("count",))
            return frame["count"].tolist()

        assert counts("1m") == [99, 6, 6]  # whole minutes: rollups
        assert counts("3m") == [111]
        assert counts("30s") == [3] * 6  # not whole minutes: raw samples
        vault.write([("load", {"h": "a"}, t0 + MINUTE_MS + 5_000, 2.0)])  # late, not rolled up
        assert counts("1m") == [99, 7, 6]  # minute 0 still from rollups, the rest from raw
        assert influxd.rows('SELECT * FROM "rp_metricvault_meta"."metricvault.dirty"', db)
        vault.maintain()
        assert counts("1m") == [99, 7, 6]
        assert not influxd.rows('SELECT * FROM "rp_metricvault_meta"."metricvault.dirty"', db)


def _labels(series_row: pd.Series) -> dict[str, str]:
    skip = ("series_id", "metric", "kind")
    return {str(k): v for k, v in series_row.items() if k not in skip and isinstance(v, str)}


# --------------------------------------------------------------------------- archive
@pytest.mark.parametrize("tier", ["raw", "1m"])
def test_export_gives_the_same_rows_from_both_backends(pair, tmp_path, tier):
    fields = {"start": pair.start, "end": pair.start + 2 * HOUR_MS, "git_sha": "abc1234"}
    paths = []
    for name, vault in (("embedded", pair.embedded), ("influx", pair.influx)):
        exp_id = f"r3-{tier}"
        if exp_id not in vault.experiments:
            vault.experiments.create(exp_id, '{job="llama-70b-r3"}', **fields)
        info = export_snapshot(vault, exp_id, tmp_path / name, tier=tier)
        paths.append(info.path)
    a, b = (pq.read_table(p) for p in paths)
    assert a.num_rows == b.num_rows > 0
    assert a.schema == b.schema
    if tier == "raw":
        assert a.equals(b)
        assert content_hash(paths[0]) == content_hash(paths[1])
        return
    assert_same(
        b.drop_columns(["labels"]).to_pandas().rename(columns={"series_id": "sid"}),
        a.drop_columns(["labels"]).to_pandas().rename(columns={"series_id": "sid"}),
    )


# --------------------------------------------------------------------------- experiments
def test_experiment_registry_works_on_influxdb(influxd):
    with fresh_vault(influxd) as vault:
        reg = vault.experiments
        exp = reg.create("llama-r3", '{job="r3"}', start="2026-11-01T00:00:00Z", owner="ana")
        assert "llama-r3" in reg and "other" not in reg
        assert reg.get("llama-r3") == exp
        with pytest.raises(ConflictError, match="already exists"):
            reg.create("llama-r3", '{job="r3"}')
        reg.create("llama-r4", '{job="r4"}', start="2026-11-02T00:00:00Z", notes='a "quoted"\n')
        assert reg.ids() == ["llama-r3", "llama-r4"]
        assert [e.id for e in reg.list()] == ["llama-r3", "llama-r4"]
        updated = reg.update("llama-r3", tags=["paper"], params={"lr": 3e-4})
        assert reg.get("llama-r3") == updated and updated.tags == ("paper",)
        ended = reg.end("llama-r3", at="2026-11-03T00:00:00Z")
        assert ended.end_ms is not None and reg.get("llama-r3").end_ms == ended.end_ms
        assert reg.get("llama-r4").notes == 'a "quoted"\n'
        with pytest.raises(NotFoundError, match="did you mean llama-r4, llama-r3"):
            reg.get("llama-r5")
        with pytest.raises(InputError, match="looks like a path"):
            reg.get("../etc")
        with pytest.raises(InputError, match="cannot update"):
            reg.update("llama-r3", id="x")


# --------------------------------------------------------------------------- errors
@pytest.mark.timeout(120)  # bounded retries: it gives up, it does not hang
def test_unreachable_server_is_a_clear_storage_error():
    uri = f"influxdb://127.0.0.1:{free_port()}/gpu_metrics_db"
    with pytest.raises(StorageError, match=r"did not accept .* after 5 attempts.*influxd"):
        InfluxVault.open(uri, SETTINGS)


def test_unknown_database_and_missing_policies_say_to_run_setup(influxd):
    db = new_db()
    with pytest.raises(NotFoundError, match=f"database '{db}' does not exist.*influx setup"):
        InfluxVault.open(influxd.uri(db), SETTINGS)
    influxd.query(f'CREATE DATABASE "{db}"')
    with pytest.raises(NotFoundError, match=r"lacks the retention policies.*rp_raw_30d"):
        InfluxVault.open(influxd.uri(db), SETTINGS)
    client = InfluxClient(parse_uri(influxd.uri(new_db())))
    with pytest.raises(NotFoundError, match="does not exist"):
        client.write(b"m value=1 1\n", "rp_raw_30d")


def test_bad_credentials_are_a_config_error(influxd_auth):
    db = new_db()
    setup(influxd_auth.uri(db), SETTINGS)  # as the admin user
    with InfluxVault.open(influxd_auth.uri(db), SETTINGS) as vault:
        assert vault.write([("m", {}, int(time.time() * 1000), 1.0)]) == 1
    wrong = influxd_auth.uri(db).replace("s3cret", "wrong")
    with pytest.raises(ConfigError, match=r"refused .* user admin .*authorization failed"):
        InfluxVault.open(wrong, SETTINGS)
    anonymous = influxd_auth.uri(db, with_credentials=False)
    with pytest.raises(ConfigError, match="METRICVAULT_INFLUX_USER"):
        InfluxVault.open(anonymous, SETTINGS)


def test_credentials_come_from_the_environment(influxd_auth, monkeypatch):
    db = new_db()
    setup(influxd_auth.uri(db), SETTINGS)
    monkeypatch.setenv("METRICVAULT_INFLUX_USER", influxd_auth.user)
    monkeypatch.setenv("METRICVAULT_INFLUX_PASSWORD", influxd_auth.password)
    with InfluxVault.open(influxd_auth.uri(db, with_credentials=False), SETTINGS) as vault:
        assert vault.client.target.user == influxd_auth.user


def test_influxdbs_verifies_the_server_certificate(influxd_tls):
    db = new_db()
    trusted = f"{influxd_tls.uri(db)}?ca={influxd_tls.cert}"
    setup(trusted, SETTINGS)
    with InfluxVault.open(trusted, SETTINGS) as vault:
        assert vault.write([("m", {"a": "b"}, int(time.time() * 1000), 1.5)]) == 1
        assert vault.query("m", "-1h", "now")["value"].tolist() == [1.5]
    with pytest.raises(ConfigError, match=r"TLS verification .* failed.*\?ca="):
        InfluxVault.open(influxd_tls.uri(db), SETTINGS)


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("influxdb://127.0.0.1:8086", "exactly one database"),
        ("influxdb://127.0.0.1:8086/a/b", "exactly one database"),
        ("influxdb://u:secret@127.0.0.1:99999/db", "invalid port"),
        ("influxdb://127.0.0.1/db?tls=1", "unknown option"),
        ("http://127.0.0.1:8086/db", "not an InfluxDB URI"),
    ],
)
def test_bad_uris_are_config_errors_without_the_password(uri, error):
    with pytest.raises(ConfigError, match=error) as caught:
        parse_uri(uri, env={})
    assert "secret" not in str(caught.value)


def test_uri_parts_and_credentials_from_the_environment():
    env = {"METRICVAULT_INFLUX_USER": "env-user", "METRICVAULT_INFLUX_PASSWORD": "env-pw"}
    t = parse_uri("influxdbs://ana:p%40ss@db.example:9999/gpu_metrics_db?ca=/etc/ca.pem", env)
    assert (t.scheme, t.host, t.port, t.database) == ("https", "db.example", 9999, "gpu_metrics_db")
    assert (t.user, t.password, t.ca_file) == ("ana", "p@ss", "/etc/ca.pem")
    assert t.uri == "influxdbs://ana@db.example:9999/gpu_metrics_db"  # no password
    t = parse_uri("influxdb://localhost/gpu_metrics_db", env)
    assert (t.scheme, t.port, t.user, t.password) == ("http", 8086, "env-user", "env-pw")


def test_what_influxdb_cannot_do_says_so(influxd):
    with fresh_vault(influxd) as vault:
        with pytest.raises(UnsupportedError, match=r"SQL views \(raw, rollup_1m, .*\) exist only"):
            vault.sql("SELECT 1")
        old = int(time.time() * 1000) - 40 * 86_400_000
        with pytest.raises(ValueRangeError, match="rp_raw_30d"):
            vault.write([("m", {}, old, 1.0)])


def test_the_gateway_stores_into_influxdb(influxd, tmp_path, monkeypatch):
    from starlette.testclient import TestClient

    from metricvault.server.app import create_app

    monkeypatch.chdir(tmp_path)  # the gateway's lock files go to .metricvault-state/ here
    settings = Settings.load(env={}, gateway_maintain=False)
    t0_s = int(time.time()) - 600
    lines = "\n".join(
        f"gpu,host=node\\ 1,gpu={g} util={g * 10 + i}.5 {t0_s + i}"
        for g in range(2)
        for i in range(5)
    )
    with fresh_vault(influxd) as vault, TestClient(create_app(vault, settings)) as client:
        reply = client.post("/write?precision=s", content=lines.encode())
        assert reply.status_code == 204, reply.text
        assert client.get("/metrics").status_code == 200
        frame = vault.query('gpu_util{gpu="1"}', t0_s * 1000, (t0_s + 5) * 1000)
        assert frame["value"].tolist() == [10.5, 11.5, 12.5, 13.5, 14.5]
        assert frame["host"].unique().tolist() == ["node 1"]


def test_vault_open_dispatches_influxdb_uris(influxd):
    uri = influxd.uri(new_db())
    setup(uri, SETTINGS)
    # Any error opening the URI is a failure: only a missing influxd (the fixture) skips.
    vault = Vault.open(uri, SETTINGS)
    assert isinstance(vault, InfluxVault)
    vault.close()


# --------------------------------------------------------------------------- shared behaviour
@pytest.fixture(params=["embedded", "influxdb"])
def vault(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each behaviour test runs once per backend."""
    if request.param == "embedded":
        opened: Any = Vault.open(str(tmp_path / "vault"), SETTINGS)
    else:
        opened = fresh_vault(request.getfixturevalue("influxd"))
    yield opened
    opened.close()


def _t0() -> int:
    return (int(time.time() * 1000) - 2 * HOUR_MS) // HOUR_MS * HOUR_MS


def test_behaviour_write_then_query_raw(vault):
    t0 = _t0()
    rows = [
        ("gpu_util", {"gpu": str(g)}, t0 + 5000 * i, float(i + g))
        for g in range(2)
        for i in range(10)
    ]
    assert vault.write(rows) == 20
    frame = vault.query('gpu_util{gpu="1"}', t0, t0 + HOUR_MS)
    assert list(frame.columns) == ["timestamp", "metric", "gpu", "value"]
    assert frame["value"].tolist() == [float(i + 1) for i in range(10)]
    assert vault.query("gpu_util", t0 + 5000, t0 + 10_000)["value"].tolist() == [1.0, 2.0]
    assert vault.query('gpu_util{gpu="9"}', t0, t0 + HOUR_MS).empty


def test_behaviour_step_aggregates_and_counters(vault):
    t0 = _t0()
    vault.write(
        [("tokens_total", {"job": "a"}, t0 + 10_000 * i, v) for i, v in enumerate([5, 7, 2, 4])]
    )
    vault.write([("temp", {"job": "a"}, t0 + 10_000 * i, float(i)) for i in range(12)])
    vault.maintain()
    frame = vault.query("tokens_total", t0, t0 + HOUR_MS, step="1h", aggs=AGGS)
    assert frame[["count", "min", "max", "last", "increase"]].iloc[0].tolist() == [4, 2, 7, 4, 6]
    per_minute = vault.query("temp", t0, t0 + 2 * MINUTE_MS, step="1m", aggs=("mean", "count"))
    assert per_minute["mean"].tolist() == [2.5, 8.5]
    assert per_minute["count"].tolist() == [6, 6]


def test_behaviour_kinds_series_and_unions(vault):
    t0 = _t0()
    vault.write(
        [("energy", {"gpu": "0"}, t0 + 1000 * i, v) for i, v in enumerate([1, 3, 1])],
        kinds={"energy": "counter"},
    )
    vault.write([("util", {"gpu": "0", "team": "x"}, t0, 1.0)])
    series = vault.series()
    assert series["metric"].tolist() == ["energy", "util"]
    assert series["kind"].tolist() == ["counter", "gauge"]
    assert vault.series("util")["team"].tolist() == ["x"]
    both = vault.query('energy or util{team="x"}', t0, t0 + MINUTE_MS)
    assert len(both) == 4
    increase = vault.query("energy", t0, t0 + MINUTE_MS, step="1m", aggs=("increase",))
    assert increase["increase"].tolist() == [3.0]  # +2, then a reset counting 1


def test_behaviour_experiments_and_errors(vault):
    exp = vault.experiments.create("run-1", '{job="a"}', start="-1d", end="now")
    assert vault.experiments.get("run-1") == exp
    assert vault.experiments.ids() == ["run-1"]
    with pytest.raises(ConflictError):
        vault.experiments.create("run-1", '{job="a"}')
    with pytest.raises(NotFoundError, match="no experiment 'run-2'"):
        vault.experiments.get("run-2")
    with pytest.raises(TimeRangeError):
        vault.query("x", "now", "-1h")
    with pytest.raises(InputError):
        vault.query("x", "-1h", "now", step="1m", aggs=("median",))


def test_metricvault_serve_stores_into_influxdb(influxd, tmp_path):
    """`metricvault serve --data influxdb://...` (two workers, the default) takes remote_write
    and the samples land in InfluxDB, read back through the same API."""
    import subprocess
    import sys

    from metricvault.wire.remote_write import encode_write_request

    from .conftest import free_port, stop_process, wait_http_ok

    uri = influxd.uri(new_db())
    setup(uri, SETTINGS)
    port = free_port()
    log_path = tmp_path / "serve.log"
    command = [
        sys.executable, "-m", "metricvault.cli", "serve", "--data", uri,
        "--listen", f"127.0.0.1:{port}", "--set", "gateway_maintain=false",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    t0 = (int(time.time()) - 300) * 1000
    samples = [
        ("gpu_power", {"gpu": str(g), "Hostname": "node01"}, t0 + i * 5000, 100.0 + g + i / 4)
        for g in range(2)
        for i in range(30)
    ]
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/-/ready", proc, log_path, "metricvault serve")
        for first in range(0, len(samples), 10):  # several requests: both workers serve some
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/write",
                data=encode_write_request(samples[first : first + 10]),
                headers={
                    "Content-Encoding": "snappy",
                    "Content-Type": "application/x-protobuf",
                    "X-Prometheus-Remote-Write-Version": "0.1.0",
                },
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 204
    finally:
        stop_process(proc)
    with InfluxVault.open(uri) as vault:
        frame = vault.query('gpu_power{gpu="1"}', t0, t0 + 30 * 5000)
        assert frame["value"].tolist() == [101.0 + i / 4 for i in range(30)]
        assert len(vault.series("gpu_power")) == 2
