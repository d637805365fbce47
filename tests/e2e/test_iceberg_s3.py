"""Iceberg tables with an s3:// warehouse (a real moto S3 server on loopback): the publisher
writes the tables' files through pyiceberg's S3 file IO with the vault's s3_* settings, and a
reader with the same settings scans the vault's rows back, once each."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.store import iceberg
from metricvault.store.vault import Vault
from tests.iceberg_data import DAY, T0, assert_same_rows, samples

pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.e2e]


def test_an_s3_warehouse_holds_the_tables(tmp_path: Path, s3_server, s3_bucket: str):
    settings = Settings(
        data=str(tmp_path / "vault"),
        retention_raw="forever",
        s3_endpoint=s3_server.endpoint,
        s3_access_key="testing",
        s3_secret_key="testing",
        iceberg_catalog=f"sqlite:///{tmp_path}/catalog.db",
        iceberg_warehouse=f"s3://{s3_bucket}/iceberg",
    )
    with Vault.open_local(settings.data, settings) as vault:
        vault.write(samples(T0, 3))
        vault.maintain(T0 + 3 * DAY)
        first = iceberg.publish(vault)
        assert all(r.added_files >= 1 for r in first)
        assert_same_rows(vault, settings)
    keys = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="iceberg/")["Contents"]
    names = [k["Key"] for k in keys]
    assert any("/raw/data/ts_day=2026-03-31/" in n for n in names), names
    assert any(n.endswith(".metadata.json") for n in names), names
