"""The cost report (GPU-hours, idle GPU-hours, kWh per group) from the 1h tier equals the same
figures computed from the raw samples of a simulated vault, for every grouping."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.cli.main import app
from metricvault.cost import GPU_ENERGY, GPU_UTIL, MJ_PER_KWH, NONE, cost_report
from metricvault.durations import now_ms
from metricvault.errors import InputError
from metricvault.sim import ClusterSpec, generate

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = now_ms() // DAY * DAY - 2 * DAY  # within raw retention: the oracle reads raw samples
DAYS = 1
IDLE = 5.0
# A GPU of node09 that moves from namespace "a" to "b" half way through hour 3: its two series
# share that hour by their samples (one GPU-hour in all).
MOVED = {"Hostname": "node09", "UUID": "GPU-moved", "gpu": "0", "team": "vision"}


def moved_gpu_samples() -> list[tuple[str, dict[str, str], int, float]]:
    out = []
    for i in range(0, 6 * HOUR, 60_000):
        labels = {**MOVED, "namespace": "a" if i < 3 * HOUR + HOUR // 2 else "b"}
        util = 2.0 if i < 2 * HOUR else 80.0
        out.append((GPU_UTIL, labels, T0 + i, util))
        out.append((GPU_ENERGY, labels, T0 + i, 1e6 * i / 60_000))
    return out


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    path = tmp_path_factory.mktemp("cost") / "v"
    spec = ClusterSpec(nodes=2, gpus_per_node=2, days=DAYS, seed=5, start_ms=T0)
    with Vault.open_local(str(path)) as v:
        for chunk in generate(spec):
            v.write(chunk)
        v.write(moved_gpu_samples())
        v.maintain()
        v.experiments.create(
            "r3", '{Hostname="node01"}', start=T0 + 2 * HOUR + 777, end=T0 + 9 * HOUR,
            owner="alice",
        )  # fmt: skip
        v.experiments.create(
            "r4", '{Hostname=~"node0[12]"}', start=T0 + 8 * HOUR, end=T0 + 20 * HOUR, owner="bob"
        )
        yield v


# --------------------------------------------------------------------------- the oracle
def raw_hours(vault: Vault, start: int, end: int) -> pd.DataFrame:
    """Per (series labels, GPU, hour) from raw samples: util samples and sum, energy (mJ)."""
    lookback = vault.horizons().counter_lookback_ms
    util: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    energy: dict[tuple[str, int], float] = defaultdict(float)
    for labels, ts, values in vault.select_series(GPU_UTIL, start, end):
        key, gpu = series_key(labels), gpu_key(labels)
        for t, x in zip(ts, values, strict=True):
            if math.isfinite(x):
                cell = util[(key, gpu, int(t) // HOUR * HOUR)]
                cell[0] += 1
                cell[1] += x
    for labels, ts, values in vault.select_series(GPU_ENERGY, start - lookback, end):
        gpu = gpu_key(labels)
        for i in range(1, len(ts)):
            if ts[i] < start or ts[i] - ts[i - 1] > lookback:
                continue
            step = values[i] - values[i - 1]
            energy[(gpu, int(ts[i]) // HOUR * HOUR)] += step if step >= 0 else values[i]
    rows = [
        {"labels": k, "gpu": g, "ts": h, "count": c, "sum": s} for (k, g, h), (c, s) in util.items()
    ]
    frame = pd.DataFrame(rows)
    frame["share"] = frame["count"] / frame.groupby(["gpu", "ts"])["count"].transform("sum")
    frame["energy_mj"] = [
        energy.get((g, h), 0.0) for g, h in zip(frame["gpu"], frame["ts"], strict=True)
    ]
    frame["energy_mj"] *= frame["share"]
    frame["idle"] = np.where(frame["sum"] / frame["count"] < IDLE, frame["share"], 0.0)
    return frame


def series_key(labels: dict[str, str]) -> str:
    return json.dumps({k: v for k, v in labels.items() if k != "__name__"}, sort_keys=True)


def gpu_key(labels: dict[str, str]) -> str:
    return f"{labels.get('Hostname')}/{labels['UUID']}"


def oracle_groups(vault: Vault, frame: pd.DataFrame, by: str) -> pd.DataFrame:
    labels = frame["labels"].map(json.loads)
    if by == "experiment" or by == "team":
        groups: list[list[str]] = [[] for _ in range(len(frame))]
        owners: list[str | None] = [None] * len(frame)
        for exp in sorted(vault.experiments.list(), key=lambda e: e.start_ms):
            hosts = {"r3": {"node01"}, "r4": {"node01", "node02"}}[exp.id]
            assert exp.end_ms is not None
            for i, (d, h) in enumerate(zip(labels, frame["ts"], strict=True)):
                if d["Hostname"] in hosts and exp.start_ms // HOUR * HOUR <= h < exp.end_ms:
                    groups[i].append(exp.id)
                    owners[i] = owners[i] or exp.owner
        if by == "team":
            teams = [d.get("team") or o or NONE for d, o in zip(labels, owners, strict=True)]
            frame = frame.assign(group=teams)
        else:
            lists = pd.Series([g or [NONE] for g in groups], index=frame.index, dtype=object)
            frame = frame.assign(group=lists).explode("group")
    else:
        frame = frame.assign(group=labels.map(lambda d: d.get(by, NONE)))
    grouped = frame.groupby("group")
    out = pd.DataFrame(
        {
            "gpus": grouped["gpu"].nunique(),
            "gpu_hours": grouped["share"].sum(),
            "idle_gpu_hours": grouped["idle"].sum(),
            "gpu_util_mean": grouped["sum"].sum() / grouped["count"].sum(),
            "energy_kwh": grouped["energy_mj"].sum() / MJ_PER_KWH,
        }
    )
    return out.rename_axis(by).sort_index()


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("by", ["Hostname", "namespace", "experiment", "team"])
@pytest.mark.parametrize(
    ("start", "end"), [(T0, T0 + DAYS * 24 * HOUR), (T0 + 3 * HOUR + 5, T0 + 10 * HOUR + 59_000)]
)
def test_the_report_equals_the_raw_samples_figures(vault: Vault, by: str, start: int, end: int):
    report = cost_report(vault, start, end, by, idle_below=IDLE)
    assert report.tiers == ("1h",) and report.warnings == ()
    got = report.table.set_index(by).sort_index()
    want = oracle_groups(vault, raw_hours(vault, start // HOUR * HOUR, end // HOUR * HOUR), by)
    assert list(got.index) == list(want.index)
    for column in want.columns:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-9, err_msg=column)
    assert got["idle_share"].tolist() == pytest.approx(
        (want["idle_gpu_hours"] / want["gpu_hours"]).tolist()
    )


def test_a_gpu_that_changes_series_within_an_hour_counts_once(vault: Vault) -> None:
    report = cost_report(vault, T0 + 3 * HOUR, T0 + 4 * HOUR, "namespace")
    rows = report.table.set_index("namespace")
    assert rows.loc["a", "gpu_hours"] == pytest.approx(0.5)
    assert rows.loc["b", "gpu_hours"] == pytest.approx(0.5)
    assert report.totals()["gpu_hours"] == pytest.approx(4 + 1)  # 4 simulated GPUs + the moved


def test_team_comes_from_the_label_else_the_experiment_owner(vault: Vault) -> None:
    teams = cost_report(vault, T0, T0 + 24 * HOUR, "team").table.set_index("team")
    assert {"vision", "alice", "bob", NONE} == set(teams.index)
    assert teams.loc["vision", "gpu_hours"] == pytest.approx(6)
    assert teams.loc["alice", "gpus"] == 2  # r3: node01's GPUs, before r4 took them


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"by": "not a label"}, "neither team, experiment nor a label name"),
        ({"end_ms": T0 + 10}, "holds no whole UTC hour"),
        ({"idle_below": 120.0}, "must be a utilisation in 0..100"),
        ({"team_label": "1x"}, "is not a label name"),
    ],
)
def test_bad_input_is_refused_with_the_fix(vault: Vault, kwargs: dict[str, Any], message: str):
    args: dict[str, Any] = {"start_ms": T0, "end_ms": T0 + HOUR, **kwargs}
    with pytest.raises(InputError, match=message):
        cost_report(vault, **args)


def test_the_command_writes_the_reports_csv(vault: Vault, tmp_path: Path) -> None:
    out = tmp_path / "q.csv"
    result = CliRunner().invoke(
        app,
        ["cost", "--by", "experiment", "-d", str(vault.location.root), "--start", str(T0),
         "--end", str(T0 + 24 * HOUR), "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = pd.read_csv(out).set_index("experiment").sort_index()
    want = cost_report(vault, T0, T0 + 24 * HOUR, "experiment").table
    want = want.set_index("experiment").sort_index()
    assert list(written.columns) == list(want.columns)
    np.testing.assert_allclose(written.to_numpy(float), want.to_numpy(float), rtol=1e-12)
