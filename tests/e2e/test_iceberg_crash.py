"""Publishing is exactly once per vault file: a publisher SIGKILLed right after an Iceberg
commit, or at random moments, leaves a table whose recorded file ids match its rows, and the
next publish completes it without a duplicate row; publishers racing on one PostgreSQL catalog
(a real server on loopback) end with each vault file's rows once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.store import iceberg
from metricvault.store.vault import Vault
from tests.iceberg_data import DAY, HOUR, T0, VIEWS, assert_same_rows, samples

pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.e2e]
NOW = T0 + 3 * DAY
SMALL_COMMITS = 3_000  # rows per Iceberg commit: a publish of this vault takes several

PUBLISHER = """
import json, os, signal, sys
from metricvault.config import Settings
from metricvault.store import iceberg
from metricvault.store.vault import Vault

settings = Settings(**json.loads(sys.argv[1]))
iceberg.ROWS_PER_COMMIT = int(sys.argv[2])
if sys.argv[3] == "die-after-first-commit":
    commit = iceberg._publish_step

    def step(*args):
        done = commit(*args)
        if done is not None:  # committed: die before anything else happens
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    iceberg._publish_step = step
with Vault.open_local(settings.data, settings) as vault:
    iceberg.publish(vault)
"""


def make_vault(tmp_path: Path, catalog: str, namespace: str = "metricvault") -> Settings:
    settings = Settings(
        data=str(tmp_path / "vault"),
        retention_raw="forever",
        compact_min_files=1000,
        iceberg_catalog=catalog,
        iceberg_warehouse=str(tmp_path / "warehouse"),
        iceberg_namespace=namespace,
    )
    with Vault.open_local(settings.data, settings) as vault:
        for i in range(3):  # three raw files, and rollup files for each
            vault.write(samples(T0 + 4 * i * HOUR, 4))
            vault.maintain(NOW)
    return settings


def publisher(tmp_path: Path, settings: Settings, mode: str = "") -> subprocess.Popen[bytes]:
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    values = {k: getattr(settings, k) for k in ("data", "retention_raw", "compact_min_files")}
    values |= {k: getattr(settings, k) for k in settings.__dict__ if k.startswith("iceberg_")}
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(values), str(SMALL_COMMITS), mode],
        stderr=subprocess.PIPE,
    )


def assert_record_matches_rows(settings: Settings) -> None:
    """What each table's newest snapshot says it holds is what its rows came from."""
    catalog = iceberg.open_catalog(settings)
    for name in VIEWS.values():
        if not catalog.table_exists(f"{settings.iceberg_namespace}.{name}"):
            continue  # killed before this tier's first commit
        table = catalog.load_table(f"{settings.iceberg_namespace}.{name}")
        held, _ = iceberg.published_ids(table)
        rows = table.scan(selected_fields=("vault_file_id",)).to_arrow()
        assert set(rows.column("vault_file_id").to_pylist()) == held, name


def finish_and_check(settings: Settings) -> None:
    with Vault.open_local(settings.data, settings) as vault:
        iceberg.publish(vault)
        assert_same_rows(vault, settings)
        again = iceberg.publish(vault)
    assert all(r.rows_added == 0 for r in again)


def test_killed_right_after_a_commit_the_next_publish_adds_no_duplicate(tmp_path: Path):
    settings = make_vault(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    proc = publisher(tmp_path, settings, "die-after-first-commit")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    catalog = iceberg.open_catalog(settings)
    held: set[int] = set()
    for name in VIEWS.values():
        if catalog.table_exists(f"{settings.iceberg_namespace}.{name}"):
            table = catalog.load_table(f"{settings.iceberg_namespace}.{name}")
            held |= iceberg.published_ids(table)[0]
    with Vault.open_local(settings.data, settings) as vault:
        files = {f.file_id for f in vault.catalog_version().files}
    assert held and held < files  # it died part way: one commit landed, not the rest
    assert_record_matches_rows(settings)
    finish_and_check(settings)


def test_killed_at_random_moments_the_tables_end_exact(tmp_path: Path):
    settings = make_vault(tmp_path, f"sqlite:///{tmp_path}/catalog.db")
    rng = random.Random(7)
    for _ in range(3):
        proc = publisher(tmp_path, settings)
        time.sleep(rng.uniform(0.5, 6.0))  # a kill point, not a timing assertion
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert_record_matches_rows(settings)
    finish_and_check(settings)


def test_racing_publishers_on_postgresql_publish_each_file_once(tmp_path: Path, postgres):
    settings = make_vault(tmp_path, postgres.uri, namespace="racing")
    procs = [publisher(tmp_path, settings) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-3000:]
    assert_record_matches_rows(settings)
    finish_and_check(settings)


OPENER = """
import sys, time
from metricvault.config import Settings
from metricvault.store import iceberg

settings = Settings(iceberg_catalog=sys.argv[1], iceberg_warehouse=sys.argv[2])
while time.time() < float(sys.argv[3]):  # every opener starts at the same moment
    time.sleep(0.001)
iceberg.open_catalog(settings)
"""


def test_processes_opening_a_new_postgresql_catalog_at_once_all_open_it(tmp_path: Path, postgres):
    import psycopg

    admin = postgres.uri.replace("postgresql+psycopg://", "postgresql://")
    name = f"opened_at_once_{time.time_ns()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    uri = postgres.uri.rsplit("/", 1)[0] + "/" + name
    start = time.time() + 3.0  # after every interpreter has imported pyiceberg
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, uri, str(tmp_path / "warehouse"), str(start)],
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
