"""Another engine reads the vault: `metricvault maintain` publishes the tiers as Iceberg tables
in a PostgreSQL catalog (a real server on loopback), and Dask's distributed scheduler (a
scheduler and two worker processes, all on 127.0.0.1) answers the cost-audit questions from
the Parquet files the Iceberg metadata lists, with no metricvault code on the workers: the
same answers as `vault.sql` (and `metricvault cost`), and tasks ran on both workers."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from metricvault.config import Settings
from metricvault.cost import MJ_PER_KWH, cost_report
from metricvault.store import iceberg
from metricvault.store.upkeep import MaintenanceLoop
from metricvault.store.vault import Vault
from tests.iceberg_data import DAY, ENERGY, HOUR, T0, UTIL, samples

pytest.importorskip("pyiceberg")
distributed = pytest.importorskip("distributed")
dd = pytest.importorskip("dask.dataframe")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NOW = T0 + 3 * DAY
ROUNDS = 3  # maintain rounds of 6 h each: several Iceberg files per table, tasks for two workers
REL = 1e-9
Q1_END = 1_775_001_600_000  # 2026-04-01T00:00Z
TEAM, HOST = (
    "json_extract_string(s.labels, '$.team')",
    "json_extract_string(s.labels, '$.Hostname')",
)


def sql_answers(vault: Vault) -> dict[str, pd.DataFrame]:
    """The questions as `vault.sql` answers them (DuckDB over the vault's own files)."""
    quarter = "year(r.timestamp) || 'Q' || quarter(r.timestamp)"
    hours = vault.sql(
        f"SELECT {TEAM} AS team, {quarter} AS quarter, count(*) AS gpu_hours, "
        "sum(CASE WHEN r.mean < 5 THEN 1 ELSE 0 END) AS idle_gpu_hours "
        "FROM rollup_1h r JOIN series s USING (series_id) "
        f"WHERE s.metric = '{UTIL}' GROUP BY ALL"
    )
    energy = vault.sql(
        f"SELECT {TEAM} AS team, {quarter} AS quarter, sum(r.increase) / {MJ_PER_KWH} AS kwh "
        f"FROM rollup_1h r JOIN series s USING (series_id) WHERE s.metric = '{ENERGY}' "
        "GROUP BY ALL"
    )
    p95 = vault.sql(
        f"SELECT {HOST} AS Hostname, strftime(r.timestamp, '%Y-%m-%d') AS day, "
        "quantile_cont(r.value, 0.95) AS p95 FROM raw r JOIN series s USING (series_id) "
        f"WHERE s.metric = '{UTIL}' GROUP BY ALL"
    )
    return {
        "hours": hours.set_index(["team", "quarter"]).sort_index(),
        "energy": energy.set_index(["team", "quarter"]).sort_index(),
        "p95": p95.set_index(["Hostname", "day"]).sort_index(),
    }


def data_files(settings: Settings, table: str) -> list[str]:
    """The Parquet files of the table's current snapshot, from the Iceberg metadata (pyiceberg
    writes copy-on-write: no delete files to apply)."""
    catalog = iceberg.open_catalog(settings)
    tasks = list(catalog.load_table(f"{settings.iceberg_namespace}.{table}").scan().plan_files())
    assert all(not t.delete_files for t in tasks)
    return [t.file.file_path.removeprefix("file://") for t in tasks]


def dask_answers(client: Any, settings: Settings) -> dict[str, pd.DataFrame]:
    hours = dd.read_parquet(
        data_files(settings, "rollup_1h"),
        columns=["ts", "metric", "team", "count", "sum", "increase"],
    )
    hours = hours[hours["count"] > 0]
    hours = hours.assign(
        quarter=hours["ts"].dt.year.astype(str) + "Q" + hours["ts"].dt.quarter.astype(str)
    )
    util = hours[hours["metric"] == UTIL]
    util = util.assign(idle=(util["sum"] / util["count"] < 5).astype("int64"))
    gpu = util.groupby(["team", "quarter"])["idle"].agg(["count", "sum"])
    energy = hours[hours["metric"] == ENERGY].groupby(["team", "quarter"])["increase"].sum()
    raw = dd.read_parquet(
        data_files(settings, "raw"), columns=["ts", "metric", "Hostname", "value"]
    )
    raw = raw[raw["metric"] == UTIL]
    raw = raw.assign(day=raw["ts"].dt.strftime("%Y-%m-%d"))
    p95 = raw.groupby(["Hostname", "day"])["value"].apply(
        lambda s: float(np.quantile(s.to_numpy(), 0.95)), meta=("value", "f8")
    )
    gpu, energy, p95 = client.compute([gpu, energy, p95], sync=True)
    gpu = gpu.rename(columns={"count": "gpu_hours", "sum": "idle_gpu_hours"})
    return {
        "hours": gpu.sort_index(),
        "energy": (energy / MJ_PER_KWH).to_frame("kwh").sort_index(),
        "p95": p95.to_frame("p95").sort_index(),
    }


def assert_close(got: pd.DataFrame, want: pd.DataFrame, name: str) -> None:
    got.index = got.index.set_names(want.index.names)
    assert list(got.index) == list(want.index), name
    for col in want.columns:
        for key, a, b in zip(want.index, got[col], want[col], strict=True):
            assert math.isclose(float(a), float(b), rel_tol=REL), (name, col, key, a, b)


def build_vault(tmp_path: Path, catalog_uri: str) -> Settings:
    settings = Settings(
        data=str(tmp_path / "vault"),
        retention_raw="forever",
        compact_min_files=1000,  # keep each round's raw file: more files for the workers
        iceberg_catalog=catalog_uri,
        iceberg_warehouse=str(tmp_path / "warehouse"),
    )
    with Vault.open_local(settings.data, settings) as vault:
        for i in range(ROUNDS - 1):  # maintain rounds in this process (the same hook) ...
            vault.write(samples(T0 + 6 * i * HOUR, 6))
            MaintenanceLoop(vault, 60).round(NOW, wait=True)
        vault.write(samples(T0 + 6 * (ROUNDS - 1) * HOUR, 6))
    # ... and the last through the command line
    sets = [
        f"retention_raw={settings.retention_raw}",
        f"compact_min_files={settings.compact_min_files}",
        f"iceberg_catalog={catalog_uri}",
        f"iceberg_warehouse={settings.iceberg_warehouse}",
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metricvault.cli",
            "maintain",
            "--now",
            str(NOW),
            "-d",
            settings.data,
        ]
        + [arg for s in sets for arg in ("--set", s)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Iceberg tables:" in done.stdout, done.stdout
    return settings


def test_dask_on_two_workers_answers_the_cost_audit_like_vault_sql(tmp_path: Path, postgres):
    settings = build_vault(tmp_path, postgres.uri)
    with Vault.open_local(settings.data, settings) as vault:
        want = sql_answers(vault)
        q1 = cost_report(vault, T0, Q1_END, by="team").table.set_index("team").sort_index()
    assert len(want["hours"]) == 4 and want["hours"]["idle_gpu_hours"].sum() > 0
    # the SQL answers are the cost command's (its Q1 figures per team)
    q1_sql = want["hours"].xs("2026Q1", level="quarter")
    assert list(q1["gpu_hours"]) == list(q1_sql.loc[q1.index, "gpu_hours"])
    assert list(q1["idle_gpu_hours"]) == list(q1_sql.loc[q1.index, "idle_gpu_hours"])
    q1_kwh: dict[Any, float] = dict(want["energy"].xs("2026Q1", level="quarter")["kwh"])
    for team, kwh in q1["energy_kwh"].items():
        assert math.isclose(float(kwh), float(q1_kwh[team]), rel_tol=REL), team

    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
        scheduler_port=0,
    )
    try:
        with distributed.Client(cluster, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            workers = set(client.scheduler_info()["workers"])
            assert all(w.startswith("tcp://127.0.0.1:") for w in workers), workers
            assert client.scheduler.address.startswith("tcp://127.0.0.1:")
            pids = client.run(os.getpid)
            assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
            with distributed.get_task_stream(client) as stream:
                got = dask_answers(client, settings)
            ran_on = {task["worker"] for task in stream.data}
    finally:
        cluster.close(timeout=30)
    assert len(ran_on) >= 2 and ran_on <= workers, ran_on
    for name in ("hours", "energy", "p95"):
        assert_close(got[name], want[name], name)
