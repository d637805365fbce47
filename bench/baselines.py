"""Baselines from the rollup rows beside the raw scan they replace (docs/anomaly.md).

Backfills a fresh vault with ``--gpus`` GPUs' memory series over ``--days`` days at
``--interval`` seconds (numpy: a daily cycle on half of them, Gaussian noise), maintains it,
then times, in the same run: ``compute_baselines`` (1h rollup partials: mean, sigma,
P50/P95/P99, median/MAD, the seasonality test) against reading every raw sample of the window
(``vault.select_series``) and computing the same statistics with numpy. Prints a markdown
table and how far the rollup answers are from numpy's. Run from the repository root:

    .venv/bin/python bench/baselines.py [--gpus 16] [--days 28] [--interval 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from metricvault import Vault
from metricvault.analysis.baselines import HOUR_MS, BaselineSpec, compute_baselines, seasonality

METRIC = "DCGM_FI_DEV_FB_USED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--interval", type=int, default=60, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    now = int(time.time() * 1000) // HOUR_MS * HOUR_MS
    start = now - args.days * 24 * HOUR_MS
    ts = np.arange(start, now, args.interval * 1000)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp, Vault.open_local(f"{tmp}/v") as vault:
        for gpu in range(args.gpus):
            daily = 8000.0 if gpu % 2 == 0 else 0.0
            hour = (ts // HOUR_MS) % 24
            values = 40_000 + daily * np.sin(2 * np.pi * hour / 24) + rng.normal(0, 500, ts.size)
            vault.write(
                pd.DataFrame(
                    {"metric": METRIC, "timestamp": ts, "value": values,
                     "Hostname": f"node{gpu // 8:02d}", "gpu": str(gpu % 8)}
                )
            )  # fmt: skip
        vault.maintain()
        spec = BaselineSpec(METRIC, window=f"{args.days}d", warmup="0")
        rollup_s, raw_s = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            found = compute_baselines(vault, spec, now)
            rollup_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            exact = _raw_baselines(vault, start, now)
            raw_s.append(time.perf_counter() - t0)
        worst = {k: 0.0 for k in ("mean", "stddev", "p99", "mad")}
        for b in found:
            ref = exact[(b.labels["Hostname"], b.labels["gpu"])]
            for k in worst:
                worst[k] = max(worst[k], abs(b.stats[k] - ref[k]) / abs(ref[k]))
        samples = args.gpus * ts.size
        print(f"{args.gpus} series x {args.days} d at {args.interval} s = {samples:,} samples\n")
        print("| method | median time (s) | reads |")
        print("|---|---|---|")
        print(f"| rollup (1h partials) | {np.median(rollup_s):.3f} | "
              f"{args.gpus * args.days * 24:,} rows |")  # fmt: skip
        print(f"| raw scan + numpy | {np.median(raw_s):.3f} | {samples:,} samples |")
        print("\nlargest relative difference from numpy over the series: "
              + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))  # fmt: skip
        seasonal = sum(bool(b.seasonality and b.seasonality.seasonal) for b in found)
        print(f"seasonal: {seasonal} of {len(found)} (the {args.gpus // 2 + args.gpus % 2} "
              "with a daily cycle)")  # fmt: skip


def _raw_baselines(vault: Vault, start: int, end: int) -> dict[tuple[str, str], dict[str, float]]:
    out = {}
    for labels, ts, values in vault.select_series(METRIC, start, end, stale_markers=False):
        med = float(np.median(values))
        hours = ts // HOUR_MS
        uniq, inv = np.unique(hours, return_inverse=True)
        seasonality(np.bincount(inv, weights=values) / np.bincount(inv), uniq)
        out[(labels["Hostname"], labels["gpu"])] = {
            "mean": float(values.mean()),
            "stddev": float(values.std()),
            "p99": float(np.quantile(values, 0.99)),
            "mad": float(np.median(np.abs(values - med))),
        }
    return out


if __name__ == "__main__":
    main()
