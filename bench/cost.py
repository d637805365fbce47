"""`metricvault cost` over a quarter: the report from the 1h tier beside the same figures
asked of the 1m tier with SQL and of PromQL (`increase(...[period])`), on one vault.

    python bench/cost.py --nodes 2 --days 91 --interval 300    # 16 GPUs, ~10 M samples

Builds a vault of the simulated cluster (``metricvault.sim``, data ending now, one sample every
``--interval`` seconds so a quarter builds in minutes; the 1h rows are the same size whatever
the interval), maintains it (rollups, retention), registers its two jobs as experiments, then
times each way in a fresh process (median of ``--repeat`` runs after one warm-up) and checks
that the GPU-hours and kWh they give agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HOUR_MS = 3_600_000

CHILD = r"""
import json, sys, time
from metricvault import Vault
from metricvault.cost import cost_report
path, way = sys.argv[1], sys.argv[2]
start, end, repeat = (int(a) for a in sys.argv[3:6])
UTIL, ENERGY = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
SQL_1M = f'''
  WITH s AS (SELECT series_id, metric, json_extract_string(labels, '$.Hostname') AS host
             FROM series WHERE metric IN ('{UTIL}', '{ENERGY}'))
  SELECT host,
         count(DISTINCT CASE WHEN metric = '{UTIL}'
               THEN r.series_id::VARCHAR || '/' || (r.ts // 3600000)::VARCHAR END) AS gpu_hours,
         sum(CASE WHEN metric = '{ENERGY}' THEN r.increase END) / 3.6e9 AS energy_kwh
  FROM rollup_1m r JOIN s USING (series_id)
  WHERE r.ts >= {start} AND r.ts < {end} GROUP BY host ORDER BY host'''
PROMQL = f'sum by (Hostname) (increase({ENERGY}[{(end - start) // 1000}s])) / 3.6e9'

def once(vault):
    if way == "cost --by Hostname (1h tier)":
        t = cost_report(vault, start, end, "Hostname").table.sort_values("Hostname")
        return {"gpu_hours": t["gpu_hours"].sum(), "energy_kwh": t["energy_kwh"].sum()}
    if way == "cost --by experiment (1h tier)":
        cost_report(vault, start, end, "experiment")
        return {}
    if way == "SQL over rollup_1m":
        t = vault.sql(SQL_1M)
        return {"gpu_hours": t["gpu_hours"].sum(), "energy_kwh": t["energy_kwh"].sum()}
    frame = vault.promql(PROMQL, end)
    return {"energy_kwh": float(frame["value"].sum())}

with Vault.open_local(path) as vault:
    once(vault)  # warm-up: file footers, the series index
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        answer = once(vault)
        times.append(time.perf_counter() - t)
print(json.dumps({"times": times, **{k: float(v) for k, v in answer.items()}}))
"""

WAYS = (
    "cost --by Hostname (1h tier)",
    "cost --by experiment (1h tier)",
    "SQL over rollup_1m",
    "PromQL increase(energy[period]) (energy only)",
)


def build(path: str, nodes: int, days: float, interval_s: int) -> tuple[int, int, int]:
    from metricvault.demo import register_jobs
    from metricvault.sim import ClusterSpec, generate
    from metricvault.store.vault import Vault

    spec = ClusterSpec.ending_at(
        int(time.time() * 1000), days, nodes=nodes, gpus_per_node=8, interval_s=interval_s
    )
    total = 0
    with Vault.open_local(path) as vault:
        for chunk in generate(spec):
            total += vault.write(chunk)
        vault.maintain()
        register_jobs(vault, spec)
    start = -(-spec.start_ms // HOUR_MS) * HOUR_MS
    end = vault_end = spec.end_ms // HOUR_MS * HOUR_MS - HOUR_MS  # whole, rolled-up hours
    return total, start, min(end, vault_end)


def run(path: str, way: str, start: int, end: int, repeat: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, path, way, str(start), str(end), str(repeat)],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--days", type=float, default=91.0)
    parser.add_argument("--interval", type=int, default=300, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/vault"
        began = time.perf_counter()
        samples, start, end = build(path, args.nodes, args.days, args.interval)
        print(
            f"vault: {args.nodes} nodes x 8 GPUs x {args.days:g} d at {args.interval} s, "
            f"{samples:,} samples, built in {time.perf_counter() - began:.0f} s; period "
            f"{(end - start) / HOUR_MS:,.0f} h; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores\n"
        )
        print("| way | median | min | GPU-hours | kWh |")
        print("|---|---|---|---|---|")
        for way in WAYS:
            got = run(path, way, start, end, args.repeat)
            times: list[float] = got["times"]
            hours = f"{got['gpu_hours']:,.1f}" if "gpu_hours" in got else "-"
            kwh = f"{got['energy_kwh']:,.2f}" if "energy_kwh" in got else "-"
            print(
                f"| {way} | {statistics.median(times) * 1000:,.1f} ms | "
                f"{min(times) * 1000:,.1f} ms | {hours} | {kwh} |"
            )


if __name__ == "__main__":
    main()
