"""What the columns of rollup rows cost (docs/decisions/0003, 0005).

Backfills a fresh vault with simulated days (2 nodes x 8 GPUs at 5 s by default), maintains
it, then writes its 1m and 1h rows three times with the vault's own file writer: as rollup
rows were first (``count, sum, min, max, last, increase``), with the PromQL columns
(``first, first_ts, last_ts, nonfinite``), and as they are now (plus ``m2`` and the quantile
sketch ``sketch_keys, sketch_counts``), and prints bytes per rollup row and per raw sample of
each, with the time one 28-day P95/P99 query over the 1h rows takes. Run from the repository
root:

    .venv/bin/python bench/rollup_columns.py [--nodes 2] [--days 2] [--interval 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from metricvault.sim import ClusterSpec, generate
from metricvault.store import files as fmt
from metricvault.store.rollup import ROLLUP_COLUMNS
from metricvault.store.vault import Vault

BEFORE = ("series_id", "ts", "count", "sum", "min", "max", "last", "increase")
PROMQL = (*BEFORE[:6], "first", "first_ts", "last", "last_ts", "increase", "nonfinite")
DAY_MS = 86_400_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--interval", type=int, default=5, help="scrape interval, seconds")
    args = parser.parse_args()
    start = int(time.time() * 1000) // DAY_MS * DAY_MS - int((args.days + 1) * DAY_MS)
    spec = ClusterSpec(nodes=args.nodes, days=args.days, interval_s=args.interval, start_ms=start)
    with tempfile.TemporaryDirectory() as tmp:
        vault = Vault.open_local(str(Path(tmp) / "vault"))
        samples = sum(vault.write(chunk) for chunk in generate(spec))
        vault.maintain()
        snap = vault.catalog_version()
        print(f"{samples:,} raw samples ({spec.nodes} nodes x 8 GPUs x {args.days} days at "
              f"{args.interval} s, simulated)\n")  # fmt: skip
        print("| tier | rows | first: B/row | PromQL cols: B/row | + m2: B/row | now (+ m2, "
              "sketch): B/row | now: B/raw sample | growth over PromQL cols |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for tier in ("1m", "1h"):
            files = snap.tier_files(tier)
            rows = vault.reader.read(files, None, 0, 2**62, tier, use_cache=False)
            now = len(fmt.write_parquet(rows.select(list(ROLLUP_COLUMNS)), fmt.ROLLUP_FLOATS))
            floats = [c for c in fmt.ROLLUP_FLOATS if c != "m2"]
            promql = len(fmt.write_parquet(rows.select(list(PROMQL)), floats))
            m2 = len(fmt.write_parquet(rows.select([*PROMQL, "m2"]), fmt.ROLLUP_FLOATS))
            old_floats = [c for c in floats if c != "first"]
            before = len(fmt.write_parquet(rows.select(list(BEFORE)), old_floats))
            n = rows.num_rows
            print(f"| {tier} | {n:,} | {before / n:.2f} | {promql / n:.2f} | {m2 / n:.2f} | "
                  f"{now / n:.2f} | "
                  f"{now / samples:.3f} | {100 * (now - promql) / promql:+.0f} % |")  # fmt: skip
        end = start + int(args.days * DAY_MS) // 3_600_000 * 3_600_000
        for label, sel in (("gpu 0 of each node", 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'),
                           ("all GPUs", "DCGM_FI_DEV_GPU_UTIL")):  # fmt: skip
            took = []
            for _ in range(5):
                t = time.perf_counter()
                vault.query(sel, start=start, end=end, step="all", aggs=["p95", "p99"])
                took.append(time.perf_counter() - t)
            print(f"\nP95/P99 over the whole span, {label}, step=all: "
                  f"{1000 * min(took):.1f} ms (best of 5)")  # fmt: skip
        vault.close()


if __name__ == "__main__":
    main()
