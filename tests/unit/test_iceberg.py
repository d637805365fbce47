"""The tiers published as Iceberg tables (SQLite catalog): the tables hold exactly the rows of
the vault's SQL views, decoded; a second publish adds nothing; compaction, late data and
retention replace rows instead of doubling them; `maintain` publishes when configured; bad
settings are refused before anything is written."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from metricvault.cli.main import app
from metricvault.config import Settings
from metricvault.errors import ConfigError, InputError, StorageError
from metricvault.store import iceberg
from metricvault.store.upkeep import MaintenanceLoop
from metricvault.store.vault import Vault
from tests.iceberg_data import (
    DAY,
    ENERGY,
    HOUR,
    T0,
    UTIL,
    VIEWS,
    assert_same_rows,
    gpu_labels,
    samples,
    table_frame,
)

pytest.importorskip("pyiceberg")

NOW = T0 + 3 * DAY


def settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        data=str(tmp_path / "vault"),
        retention_raw="forever",
        iceberg_catalog=f"sqlite:///{tmp_path}/ice/catalog.db",
        **extra,
    )


@pytest.fixture
def vault(tmp_path: Path):
    s = settings(tmp_path)
    with Vault.open_local(s.data, s) as v:
        v.write(samples(T0, 18))
        v.maintain(NOW)
        yield v


def test_tables_hold_the_sql_views_rows_decoded_with_labels(vault: Vault, tmp_path: Path):
    results = iceberg.publish(vault)
    assert [r.table for r in results] == ["raw", "rollup_1m", "rollup_1h"]
    assert_same_rows(vault, vault.settings)
    raw = table_frame(vault.settings, "raw")
    row = raw[(raw["metric"] == UTIL) & (raw["UUID"] == "GPU-1-0")].iloc[0]
    assert dict(row["labels"]) == gpu_labels(1, 0)
    assert (row["Hostname"], row["gpu"], row["team"], row["kind"]) == ("node1", "0", "nlp", "gauge")
    assert row["ts"].tz is not None and str(row["ts"].tz) == "UTC"
    hours = table_frame(vault.settings, "1h")
    energy = hours[hours["metric"] == ENERGY]
    assert set(energy["kind"]) == {"counter"}
    assert (energy["increase"] > 0).all()
    assert math.isclose(
        float(energy["mean"].iloc[0]), energy["sum"].iloc[0] / energy["count"].iloc[0]
    )


def test_tables_are_partitioned_by_utc_day(vault: Vault):
    iceberg.publish(vault)
    table = iceberg.open_catalog(vault.settings).load_table("metricvault.raw")
    assert [f.name for f in table.spec().fields] == ["ts_day"]
    paths = {t.file.file_path for t in table.scan().plan_files()}
    days = {p.split("ts_day=")[1].split("/")[0] for p in paths}
    assert days == {"2026-03-31", "2026-04-01"}


def test_a_second_publish_adds_nothing(vault: Vault):
    first = iceberg.publish(vault)
    again = iceberg.publish(vault)
    assert all(r.added_files == r.removed_files == r.rows_added == 0 for r in again)
    assert [r.snapshot_id for r in again] == [r.snapshot_id for r in first]
    assert_same_rows(vault, vault.settings)


def test_compaction_late_data_and_retention_replace_rows_instead_of_doubling(tmp_path: Path):
    s = settings(tmp_path, compact_min_files=2)
    with Vault.open_local(s.data, s) as vault:
        vault.write(samples(T0, 6))
        vault.flush()
        iceberg.publish(vault)
        vault.write(samples(T0 + 6 * HOUR, 6))  # a second raw file on the same day
        vault.write(samples(T0 + 2 * HOUR + 30_000, 1))  # late: hour 2 is rolled up again
        vault.maintain(NOW)  # compacts raw, recomputes rollups
        published = iceberg.publish(vault)
        assert sum(r.removed_files for r in published) > 0
        assert_same_rows(vault, s)
        # retention drops the first day's raw files: the table drops their rows too
        dropped = Settings(**{**s.__dict__, "retention_raw": "1d"})
        with Vault.open_local(s.data, dropped) as short:
            short.maintain(T0 + 2 * DAY + HOUR)
            iceberg.publish(short)
            assert_same_rows(short, dropped)
            assert len(table_frame(dropped, "raw")) == len(short.sql("SELECT * FROM raw"))


def test_snapshot_summary_records_the_published_vault_files(vault: Vault):
    iceberg.publish(vault)
    catalog = iceberg.open_catalog(vault.settings)
    for tier, name in VIEWS.items():
        table = catalog.load_table(f"metricvault.{name}")
        held, owner = iceberg.published_ids(table)
        assert held == {f.file_id for f in vault.catalog_version().tier_files(tier)}
        assert owner == vault.catalog_version().vault_id
        assert set(table.scan().to_pandas()["vault_file_id"]) == held


def test_maintain_publishes_when_a_catalog_is_configured(tmp_path: Path):
    s = settings(tmp_path)
    with Vault.open_local(s.data, s) as vault:
        vault.write(samples(T0, 3))
        report = MaintenanceLoop(vault, 60).round(NOW, wait=True)
        assert report is not None
        assert report["iceberg"]["raw"]["added_files"] == 1
        assert report["iceberg"]["rollup_1h"]["files"] >= 1
        assert_same_rows(vault, s)
    plain = Settings(data=str(tmp_path / "plain"))
    with Vault.open_local(plain.data, plain) as vault:
        vault.write(samples(T0, 1))
        report = MaintenanceLoop(vault, 60).round(NOW, wait=True)
        assert report is not None and "iceberg" not in report


def test_a_table_of_another_vault_is_refused(tmp_path: Path):
    s = settings(tmp_path)
    with Vault.open_local(s.data, s) as vault:
        vault.write(samples(T0, 1))
        vault.flush()
        iceberg.publish(vault, tiers=["raw"])
    other = Settings(**{**s.__dict__, "data": str(tmp_path / "other")})
    with Vault.open_local(other.data, other) as vault:
        vault.write(samples(T0, 1))
        vault.flush()
        with pytest.raises(Exception, match=r"published from vault .* give each vault its own"):
            iceberg.publish(vault, tiers=["raw"])


def test_file_id_sets_round_trip_as_ranges():
    cases = [set(), {1}, {1, 2, 3}, {1, 3, 4, 5, 9}, set(range(10, 5000)) | {7}]
    for ids in cases:
        assert iceberg.decode_ids(iceberg.encode_ids(ids)) == ids
    assert iceberg.encode_ids({1, 3, 4, 5, 9}) == "1,3-5,9"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"iceberg_catalog": "mysql://x/y"}, "not a SQLAlchemy URI of SQLite or PostgreSQL"),
        ({"iceberg_catalog": "sqlite://"}, "names no database file"),
        ({"iceberg_catalog": "postgresql+psycopg://u@h/db"}, "iceberg_warehouse is empty"),
        ({"iceberg_namespace": "a.b"}, "must be one identifier"),
        ({"iceberg_namespace": ""}, "must be one identifier"),
    ],
)
def test_bad_iceberg_settings_are_refused(values: dict[str, Any], words: str):
    with pytest.raises(ConfigError, match=words):
        Settings(**values)


def test_cli_publish_prints_a_row_per_table_and_refuses_bad_input(tmp_path: Path):
    s = settings(tmp_path)
    with Vault.open_local(s.data, s) as vault:
        vault.write(samples(T0, 2))
    runner = CliRunner()
    base = ["iceberg", "publish", "--data", s.data, "--set", f"iceberg_catalog={s.iceberg_catalog}"]
    done = runner.invoke(app, [*base, "-f", "csv"])
    assert done.exit_code == 0, done.output
    lines = done.output.strip().splitlines()
    assert lines[0].startswith("table,added_files,removed_files,rows_added,files,snapshot_id")
    assert lines[1].startswith("metricvault.raw,1,0,")
    bad = runner.invoke(app, [*base, "--tier", "5m"])
    assert isinstance(bad.exception, InputError) and "not a tier" in str(bad.exception)
    unset = runner.invoke(app, ["iceberg", "publish", "--data", s.data])
    assert isinstance(unset.exception, InputError)
    assert "iceberg_catalog is not set" in str(unset.exception)


def test_publish_has_a_manual_page_and_is_listed():
    runner = CliRunner()
    listed = runner.invoke(app, ["--help"])
    assert listed.exit_code == 0 and "iceberg" in listed.output
    page = runner.invoke(app, ["iceberg", "publish", "--help"], terminal_width=200)
    assert page.exit_code == 0
    for words in ("iceberg_catalog", "iceberg_warehouse", "--tier", "--data", "never doubled"):
        assert words in page.output, words


def test_an_unreachable_catalog_is_a_storage_error_without_the_password(tmp_path: Path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"postgresql+psycopg://mv:hunter2@127.0.0.1:{port}/iceberg"
    bad = Settings(iceberg_catalog=uri, iceberg_warehouse=str(tmp_path / "wh"))
    with pytest.raises(StorageError, match="cannot open the Iceberg catalog") as caught:
        iceberg.open_catalog(bad)
    assert "hunter2" not in str(caught.value)


def test_a_publisher_racing_another_to_create_the_namespace_takes_the_one_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg's SQL catalog tests for a namespace, then inserts its rows: a publisher
    between the two gets the database's unique-key error (a real one here: the namespace is
    made, then the test answers "not there yet" as the racing publisher saw it)."""
    settings = Settings(
        iceberg_catalog=f"sqlite:///{tmp_path}/catalog.db",
        iceberg_warehouse=str(tmp_path / "warehouse"),
    )
    catalog = iceberg.open_catalog(settings)
    catalog.create_namespace("raced")
    real, asked = catalog.namespace_exists, []

    def racing(namespace: str) -> bool:  # the first test says "not there"; later ones look
        asked.append(namespace)
        return len(asked) > 1 and bool(real(namespace))

    monkeypatch.setattr(catalog, "namespace_exists", racing)
    table = iceberg._table(catalog, "raced", "raw")
    assert table.name() == ("raced", "raw") and len(asked) >= 2
