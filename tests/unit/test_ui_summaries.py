"""The experiments table's batched summary figures (server/ui_summaries.py) are the per-row
``summarise`` figures, and runs with other selectors are left to the per-row path."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from metricvault.archive.compare import summarise
from metricvault.server.ui_api import SUMMARY_FIELDS
from metricvault.server.ui_summaries import page_summaries
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000
NOW = T0 + 30 * 86_400_000
STEP_MS = 10_000


def _run(vault: Vault, exp_id: str, start: int, steps: int, metrics: dict[str, float]) -> None:
    """A tracked run: ``metrics`` per step, and for DCGM metrics one series per GPU."""
    vault.experiments.create(
        exp_id, f'{{experiment="{exp_id}"}}', start=start, end=start + steps * STEP_MS
    )
    ts = start + np.arange(steps, dtype=np.int64) * STEP_MS
    frames = []
    for name, scale in metrics.items():
        gpus = ("0", "1") if name.startswith("DCGM") else ("",)
        for gpu in gpus:
            labels = {"experiment": exp_id, "host": "h0", **({"gpu": gpu} if gpu else {})}
            if name.endswith("ENERGY_CONSUMPTION"):
                values = scale * np.cumsum(np.full(steps, 1e6))  # a counter (mJ)
                values[steps // 2 :] -= values[steps // 2]  # with a reset
            else:
                values = scale * np.linspace(3.0, 1.0, steps)
            frames.append(
                pd.DataFrame({"timestamp": ts, "metric": name, **labels, "value": values})
            )
    if frames:
        vault.write(pd.concat(frames, ignore_index=True))


def _per_row(vault: Vault, exp_id: str) -> dict[str, float]:
    figures = dataclasses.asdict(summarise(vault, vault.experiments.get(exp_id), now=NOW))
    return {k: figures[k] for k in SUMMARY_FIELDS}


def _same(got: float, want: float) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == pytest.approx(want, rel=1e-12)


def test_batched_summaries_equal_summarise_per_experiment(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        _run(vault, "a", T0, 900, {"train_loss": 1.0, "mfu": 0.2})
        _run(
            vault,
            "b",
            T0 + 3_000_000,
            60,
            {
                "train_loss": 2.0,
                "DCGM_FI_DEV_GPU_UTIL": 30.0,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1,
            },
        )
        _run(vault, "c", T0 + 600_000, 30, {"mfu": 0.3})  # overlaps a; no loss, no GPUs
        _run(vault, "d", T0 + 9_000_000, 5, {})  # nothing logged
        # samples of b's and c's series outside their windows are not theirs
        outside = {"experiment": "b", "host": "h0"}
        vault.write(
            [("train_loss", outside, T0 + 10_000, 9.0), ("mfu", {"experiment": "c"}, T0, 5.0)]
        )
        # a NaN sample is no figure (a's last mfu step, c's loss)
        nan = float("nan")
        late = T0 + 899 * STEP_MS + 1
        vault.write([("mfu", {"experiment": "a", "host": "h0"}, late, nan)])
        vault.write([("train_loss", {"experiment": "c", "host": "h0"}, T0 + 600_000, nan)])
        exps = [vault.experiments.get(i) for i in ("a", "b", "c", "d")]
        batched = page_summaries(vault, exps, NOW)
        assert batched is not None
        for exp in exps:
            want = _per_row(vault, exp.id)
            got = batched[exp.id]
            assert all(_same(got[k], want[k]) for k in SUMMARY_FIELDS), (exp.id, got, want)
        assert batched["b"]["gpus"] == 2 and not math.isnan(batched["b"]["energy_kwh"])
        assert math.isnan(batched["c"]["final_loss"]) and batched["c"]["gpus"] == 0


def test_other_selectors_are_left_to_the_per_row_path(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        _run(vault, "a", T0, 20, {"train_loss": 1.0})
        vault.experiments.create("j", '{job="j"} or {Hostname="n1"}', start=T0, end=T0 + 1000)
        exps = [vault.experiments.get("a"), vault.experiments.get("j")]
        assert page_summaries(vault, exps, NOW) is None
        assert page_summaries(vault, [], NOW) is None


def test_the_table_endpoint_shows_the_per_row_figures_for_a_mixed_page(make_client) -> None:
    """track()'s runs batched, a job's selector one summary itself, all in one page."""
    client, vault = make_client()
    _run(vault, "a", T0, 120, {"train_loss": 1.0, "mfu": 0.2})
    _run(vault, "b", T0 + 60_000, 60, {"mfu": 0.3, "DCGM_FI_DEV_GPU_UTIL": 50.0})
    vault.write([("train_loss", {"job": "j"}, T0 + 1_000, 4.0)])
    vault.experiments.create("j", '{job="j"} or {Hostname="n1"}', start=T0, end=T0 + 5_000)
    got = client.get("/api/v1/ui/experiments?limit=10").json()
    assert {r["id"] for r in got["rows"]} == {"a", "b", "j"}
    for row in got["rows"]:
        want = dataclasses.asdict(summarise(vault, vault.experiments.get(row["id"])))
        for k in SUMMARY_FIELDS:
            if isinstance(want[k], float) and math.isnan(want[k]):
                assert row[k] is None, (row["id"], k)
            else:
                assert row[k] == pytest.approx(want[k], rel=1e-12), (row["id"], k)
    assert [r["final_loss"] for r in got["rows"] if r["id"] == "j"] == [4.0]
    # the second read of finished runs comes from the cache: the same answer
    assert client.get("/api/v1/ui/experiments?limit=10").json()["rows"] == got["rows"]


def test_late_data_in_a_finished_runs_window_is_not_hidden_by_the_cache(make_client) -> None:
    client, vault = make_client()
    _run(vault, "a", T0, 120, {"train_loss": 1.0})
    _run(vault, "b", T0, 60, {"train_loss": 2.0})
    first = {r["id"]: r for r in client.get("/api/v1/ui/experiments").json()["rows"]}
    assert first["a"]["final_loss"] == pytest.approx(1.0)
    # a's last step arrives late (after the table was read): its final loss changes
    end = vault.experiments.get("a").end_ms
    assert end is not None
    vault.write([("train_loss", {"experiment": "a", "host": "h0"}, end - 1, 0.25)])
    again = {r["id"]: r for r in client.get("/api/v1/ui/experiments").json()["rows"]}
    assert again["a"]["final_loss"] == pytest.approx(0.25)
    assert again["b"] == first["b"]
    # Compare's summaries are the same figures
    compared = client.get("/api/v1/compare?ids=a,b").json()["summaries"]
    assert [s["final_loss"] for s in compared] == [
        again["a"]["final_loss"],
        first["b"]["final_loss"],
    ]
