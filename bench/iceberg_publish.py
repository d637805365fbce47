"""Iceberg publishing cost: `metricvault iceberg publish` (store/iceberg.py) of a vault's three
tiers into a SQLite catalog, beside the peer in the same run: the vault's own `maintain` (flush,
compact, roll up) of the same samples, and a second publish with nothing new.

    python bench/iceberg_publish.py            # 64 GPUs x 1 day, 3 metrics at 15 s (1.1 M samples)
    python bench/iceberg_publish.py --quick    # 8 GPUs x 6 h (34,560 samples)

Prints the machine's load beside the table: on a shared machine the ratios are what to read.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from metricvault.config import Settings
from metricvault.store import iceberg
from metricvault.store.vault import Vault

T0 = 1_774_958_400_000  # 2026-03-31T12:00Z
METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED")


def frame(gpus: int, hours: float, step_ms: int) -> pd.DataFrame:
    ts = np.arange(T0, T0 + int(hours * 3_600_000), step_ms)
    rng = np.random.default_rng(1)
    parts = []
    for g in range(gpus):
        for m in METRICS:
            parts.append(
                pd.DataFrame(
                    {
                        "metric": m,
                        "timestamp": ts,
                        "value": np.round(rng.uniform(0, 100, len(ts)), 1),
                        "Hostname": f"node{g // 8:02d}",
                        "gpu": str(g % 8),
                        "UUID": f"GPU-{g:04d}",
                        "team": f"team{g % 4}",
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="8 GPUs x 6 h instead of 64 x 24 h")
    args = parser.parse_args()
    gpus, hours = (8, 6.0) if args.quick else (64, 24.0)
    data = frame(gpus, hours, 15_000)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data=f"{tmp}/vault", retention_raw="forever", iceberg_catalog=f"sqlite:///{tmp}/c.db"
        )
        with Vault.open_local(settings.data, settings) as vault:
            vault.write(data)
            t0 = time.perf_counter()
            vault.maintain(T0 + 3 * 86_400_000)
            maintain_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            first = iceberg.publish(vault)
            publish_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            iceberg.publish(vault)
            again_s = time.perf_counter() - t0
    rows = sum(r.rows_added for r in first)
    load = os.getloadavg()
    print(f"{len(data):,} samples ({gpus} GPUs x {hours:g} h, 3 metrics, 15 s); load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print("| step | seconds | rows/s | vs maintain |")
    print("|---|---|---|---|")
    print(f"| maintain (flush, compact, roll up): the peer | {maintain_s:.2f} | "
          f"{len(data) / maintain_s:,.0f} | 1.00 |")  # fmt: skip
    print(f"| iceberg publish, 3 tables ({rows:,} rows) | {publish_s:.2f} | "
          f"{rows / publish_s:,.0f} | {publish_s / maintain_s:.2f} |")  # fmt: skip
    print(f"| iceberg publish again (nothing new) | {again_s:.2f} | - | "
          f"{again_s / maintain_s:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
