"""What the PromQL columns of rollup rows cost (docs/decisions/0003).

Backfills a fresh vault with simulated days (2 nodes x 8 GPUs at 5 s by default), maintains
it, then writes its 1m and 1h rows twice with the vault's own file writer: as rollup rows were
before issue 13 (``count, sum, min, max, last, increase``) and as they are now (plus
``first, first_ts, last_ts, nonfinite``), and prints bytes per rollup row and per raw sample
of each. Run from the repository root:

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
        print("| tier | rows | before: B/row | now: B/row | before: B/raw sample "
              "| now: B/raw sample | growth |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for tier in ("1m", "1h"):
            files = snap.tier_files(tier)
            rows = vault.reader.read(files, None, 0, 2**62, tier, use_cache=False)
            now = len(fmt.write_parquet(rows.select(list(ROLLUP_COLUMNS)), fmt.ROLLUP_FLOATS))
            old_floats = [c for c in fmt.ROLLUP_FLOATS if c != "first"]
            before = len(fmt.write_parquet(rows.select(list(BEFORE)), old_floats))
            n = rows.num_rows
            print(f"| {tier} | {n:,} | {before / n:.2f} | {now / n:.2f} | "
                  f"{before / samples:.3f} | {now / samples:.3f} | "
                  f"{100 * (now - before) / before:+.0f} % |")  # fmt: skip
        vault.close()


if __name__ == "__main__":
    main()
