"""`vault.sql` with a series filter: pushed down to the data files' scans, or run as written.

    python bench/sql_pushdown.py --nodes 4 --days 2          # ~12 M samples, ~2 min to build

Builds a vault of the simulated cluster (``metricvault.sim``, data ending now), then runs each
statement in a fresh process twice: as written (``pushdown=False``, DuckDB joins every sample
with the series view) and with the series conditions pushed down (store/sql_pushdown.py), and
prints wall time and peak RSS of each, with the answers' row counts (which must agree).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STATEMENTS = {
    "one XID event (raw JOIN series, metric =, value > 0)": (
        "SELECT s.labels, r.timestamp, r.value FROM raw r JOIN series s "
        "ON r.series_id = s.series_id WHERE s.metric = 'DCGM_FI_DEV_XID_ERRORS' AND r.value > 0"
    ),
    "hot GPU samples (raw JOIN series, metric =)": (
        "SELECT s.labels, r.timestamp, r.value FROM raw r JOIN series s "
        "ON r.series_id = s.series_id WHERE s.metric = 'DCGM_FI_DEV_GPU_TEMP' AND r.value > 60"
    ),
    "one node's power (USING, LIKE on labels)": (
        "SELECT count(*) AS n, avg(value) AS mean FROM raw JOIN series USING (series_id) "
        "WHERE series.metric = 'DCGM_FI_DEV_POWER_USAGE' AND series.labels LIKE '%node01%'"
    ),
    "1m rollup maxima (rollup_1m JOIN series)": (
        "SELECT s.labels, max(r.max) AS peak FROM rollup_1m r JOIN series s "
        "ON s.series_id = r.series_id WHERE s.metric = 'DCGM_FI_DEV_GPU_TEMP' GROUP BY 1"
    ),
}

CHILD = """
import json, resource, sys, time
from metricvault.store.introspect import run_sql
from metricvault.store.vault import Vault
path, statement, pushdown = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with Vault.open_local(path) as vault:
    t = time.perf_counter()
    rows = run_sql(vault, statement, "arrow", pushdown=pushdown).num_rows
    took = time.perf_counter() - t
print(json.dumps({"s": took, "rows": rows,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def build(path: str, nodes: int, days: float) -> int:
    from metricvault.sim import ClusterSpec, generate
    from metricvault.store.vault import Vault

    spec = ClusterSpec.ending_at(int(time.time() * 1000), days, nodes=nodes, gpus_per_node=8)
    total = 0
    with Vault.open_local(path) as vault:
        for chunk in generate(spec):
            total += vault.write(chunk)
        vault.maintain()
    return total


def run(path: str, statement: str, pushdown: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, statement, "1" if pushdown else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--vault", help="the vault to read (built there when missing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.vault or str(Path(tmp) / "vault")
        if not Path(path).exists():
            t = time.perf_counter()
            n = build(path, args.nodes, args.days)
            print(f"built {n:,} samples ({args.nodes} nodes x 8 GPUs x {args.days:g} d) "
                  f"in {time.perf_counter() - t:.0f} s")  # fmt: skip
        print(f"{'statement':52} {'as written':>16} {'pushed down':>16} {'rows':>8}")
        for name, statement in STATEMENTS.items():
            before, after = run(path, statement, False), run(path, statement, True)
            assert before["rows"] == after["rows"], (name, before, after)
            print(
                f"{name:52} {before['s']:6.2f} s {before['rss_mb']:5.0f} MB "
                f"{after['s']:6.2f} s {after['rss_mb']:5.0f} MB {int(after['rows']):8,}"
            )


if __name__ == "__main__":
    main()
