"""Small GPU-cluster samples for the Iceberg tests: 2 nodes x 2 GPUs of two teams, utilisation
(one GPU idle for its first hours) and a cumulative energy counter, one sample a minute."""

from __future__ import annotations

from typing import Any

import pandas as pd

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_774_958_400_000  # 2026-03-31T12:00Z: the data crosses a day and a quarter boundary
UTIL, ENERGY = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
IDLE_HOURS = 4  # GPU-1-1 is below 5 % for its first hours

VIEWS = {"raw": "raw", "1m": "rollup_1m", "1h": "rollup_1h"}  # tier -> table and SQL view
Sample = tuple[str, dict[str, str], int, float]


def gpu_labels(node: int, gpu: int) -> dict[str, str]:
    return {
        "Hostname": f"node{node}",
        "gpu": str(gpu),
        "UUID": f"GPU-{node}-{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "team": "vision" if node == 0 else "nlp",
        "pod": f"train-{node}",
    }


def samples(start: int, hours: int, step: int = 60_000) -> list[Sample]:
    out = []
    for node in range(2):
        for gpu in range(2):
            labels = gpu_labels(node, gpu)
            for ts in range(start, start + hours * HOUR, step):
                k = (ts - T0) // step
                util = float((k * 7 + node * 13 + gpu) % 101)
                if (node, gpu) == (1, 1) and ts < T0 + IDLE_HOURS * HOUR:
                    util = float(k % 3)
                out.append((UTIL, labels, ts, util))
                out.append((ENERGY, labels, ts, 1_000_000.0 * k * (1 + node) + 0.25 * gpu))
    return out


def table_frame(s: Any, tier: str) -> pd.DataFrame:
    from metricvault.store import iceberg

    catalog = iceberg.open_catalog(s)
    table = catalog.load_table(f"{s.iceberg_namespace}.{VIEWS[tier]}")
    frame = table.scan().to_pandas()
    return frame


def sql_frame(vault: Any, tier: str) -> pd.DataFrame:
    cols = "series_id, ts, value" if tier == "raw" else "series_id, ts, count, sum, min, max, last"
    return vault.sql(f"SELECT {cols} FROM {VIEWS[tier]} ORDER BY series_id, ts")


def assert_same_rows(vault: Any, s: Any) -> None:
    """Every Iceberg table holds the rows of the vault's SQL view, once each, decoded."""
    for tier in VIEWS:
        got = table_frame(s, tier)
        if tier != "raw":
            got = got[got["count"] > 0]  # the SQL views leave NaN-only buckets out
        got = got.assign(ts=got["ts"].astype("int64") // 1000)  # µs -> ms
        cols = list(sql_frame(vault, tier).columns)
        got = got[cols].sort_values(["series_id", "ts"]).reset_index(drop=True)
        want = sql_frame(vault, tier)
        assert len(got) == len(want), tier
        assert not got.duplicated(["series_id", "ts"]).any(), tier
        pd.testing.assert_frame_equal(got, want, check_dtype=False, obj=tier)
