"""Compare's batched step curves (server/ui_curves.py) are exactly the per-run ``history``
curves, and runs with other selectors are left to the per-run path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from metricvault.server.ui_api import history_curves
from metricvault.server.ui_curves import step_curves
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000
NOW = T0 + 30 * 86_400_000


def _run(vault: Vault, exp_id: str, start: int, steps: int, metrics: dict[str, float]) -> None:
    vault.experiments.create(
        exp_id, f'{{experiment="{exp_id}"}}', start=start, end=start + steps * 10_000
    )
    ts = start + np.arange(steps, dtype=np.int64) * 10_000
    labels = {"experiment": exp_id, "host": "h0"}
    step = np.arange(steps, dtype=np.float64)
    frames = [pd.DataFrame({"timestamp": ts, "metric": "train_step", **labels, "value": step})]
    keep = np.arange(steps) != steps // 2  # a step without a sample stays a gap
    for name, scale in metrics.items():
        values = scale * np.linspace(3.0, 1.0, steps)
        frames.append(
            pd.DataFrame({"timestamp": ts, "metric": name, **labels, "value": values})[keep]
        )
    vault.write(pd.concat(frames, ignore_index=True))


def test_batched_curves_equal_one_history_per_run(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        _run(vault, "a", T0, 900, {"train_loss": 1.0})
        _run(vault, "b", T0 + 3_000_000, 50, {"train_loss": 2.0, "mfu": 0.1})
        _run(vault, "c", T0 + 600_000, 30, {"mfu": 0.2})  # overlaps a; no train_loss
        # a sample of b's series outside b's window is not b's
        outside = {"experiment": "b", "host": "h0"}
        vault.write(
            [("train_loss", outside, T0 + 10_000, 9.0), ("train_step", outside, T0 + 10_000, 7.0)]
        )
        exps = [vault.experiments.get(i) for i in ("a", "b", "c")]
        for metric in ("train_loss", "mfu", "grad_norm"):
            batched = step_curves(vault, exps, metric, 100, NOW)
            assert batched is not None
            per_run = {
                e.id: history_curves(vault, e, [metric], 100)["metrics"].get(metric) for e in exps
            }
            assert batched == per_run
        assert step_curves(vault, exps, "train_loss", 100, NOW)["c"] is None  # type: ignore[index]


def test_runs_with_other_selectors_are_left_to_history(tmp_path: Path) -> None:
    with Vault.open_local(str(tmp_path / "v")) as vault:
        _run(vault, "a", T0, 20, {"train_loss": 1.0})
        vault.experiments.create("j", '{job="j"} or {Hostname="n1"}', start=T0, end=T0 + 1000)
        tracked = vault.experiments.get("a")
        assert (
            step_curves(vault, [tracked, vault.experiments.get("j")], "train_loss", 50, NOW) is None
        )
        assert step_curves(vault, [tracked], 'train_loss"}', 50, NOW) is None  # not a name
        assert step_curves(vault, [], "train_loss", 50, NOW) is None


def test_ranks_extra_labels_and_odd_values_join_as_history_joins_them(tmp_path: Path) -> None:
    """Two ranks logging the same steps (their mean), a series with one more label (its own
    step series), steps with no metric sample beside them and NaN/inf samples."""
    steps = 40
    ranks: tuple[tuple[str, dict[str, str], float], ...] = (
        ("h0", {}, 0.0),
        ("h1", {}, 0.5),
        ("h2", {"rank": "2"}, 1.0),
    )
    with Vault.open_local(str(tmp_path / "v")) as vault:
        for exp_id, start in (("a", T0), ("b", T0 + 100_000)):
            end = start + steps * 10_000
            vault.experiments.create(exp_id, f'{{experiment="{exp_id}"}}', start=start, end=end)
            rows = []
            for host, extra, shift in ranks:
                labels = {"experiment": exp_id, "host": host, **extra}
                values = np.linspace(3.0, 1.0, steps) + shift
                values[5] = np.nan if host == "h0" else values[5]
                values[7] = np.inf if host == "h1" else values[7]
                for i in range(steps):
                    t = start + i * 10_000
                    rows.append(("train_step", labels, t, float(i)))
                    if i < steps - 3:
                        rows.append(("train_loss", labels, t, float(values[i])))
            vault.write(rows)
        exps = [vault.experiments.get(i) for i in ("a", "b")]
        batched = step_curves(vault, exps, "train_loss", 100, NOW)
        per_run = {
            e.id: history_curves(vault, e, ["train_loss"], 100)["metrics"].get("train_loss")
            for e in exps
        }
        assert batched == per_run
        assert batched is not None and batched["a"] is not None
        assert batched["a"]["points"] == steps - 3
