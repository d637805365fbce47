"""PromQL engine latency on dashboard queries, against the store read it is built on.

    .venv/bin/python bench/promql.py                  # 13 nodes x 8 GPUs x 1 day at 15 s
    .venv/bin/python bench/promql.py --nodes 2 --days 0.25 --runs 3

For each query and range it reports the median latency of ``Engine(VaultSource(vault))`` (the
whole path: read raw samples through ``vault.query``, then evaluate), of the same engine over a
``MemorySource`` holding the same samples (evaluation alone), and of the raw ``vault.query`` of
the selector over the same range (the read the engine cannot avoid), with the number of series
answered and whether both sources gave the same answer. Peers (Prometheus,
VictoriaMetrics) and rollup tiers come with the rest of issue 13; this measures what the engine
core adds on top of the store read today.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.promql import Engine, MemorySource, VaultSource
from metricvault.sim import ClusterSpec, generate
from metricvault.store.vault import Vault

METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
HOUR_MS = 3_600_000
# (name, PromQL with $i for Grafana's $__rate_interval, the selector it reads)
QUERIES = (
    ("per-GPU avg util", "avg_over_time(DCGM_FI_DEV_GPU_UTIL[$i])", "DCGM_FI_DEV_GPU_UTIL"),
    (
        "energy rate per host",
        "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$i]))",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ),
    ("top 5 GPUs", "topk(5, avg_over_time(DCGM_FI_DEV_GPU_UTIL[$i]))", "DCGM_FI_DEV_GPU_UTIL"),
    (
        "one GPU",
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node01", gpu="0"}',
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node01", gpu="0"}',
    ),
)
# (range, step, window): Grafana's usual steps for a ~1000 px wide panel.
RANGES = ((HOUR_MS, 15_000, "1m"), (24 * HOUR_MS, 120_000, "5m"))


def load(spec: ClusterSpec, directory: Path) -> tuple[Vault, MemorySource, int]:
    vault = Vault.open(str(directory / "vault"))
    memory = MemorySource()
    end = 0
    for table in generate(spec):
        table = table.filter(pc.is_in(table["metric"], pa.array(METRICS)))
        vault.write(table)
        end = max(end, int(pc.max(table["timestamp"]).as_py()))
        _add_to_memory(memory, table)
    vault.flush()
    return vault, memory, end


def _add_to_memory(memory: MemorySource, table: pa.Table) -> None:
    frame = table.to_pandas()
    labels = [c for c in frame.columns if c not in ("metric", "timestamp", "value")]
    for key, rows in frame.groupby(["metric", *labels], dropna=False, sort=False):
        names = ["__name__", *labels]
        series = {n: str(v) for n, v in zip(names, key, strict=True) if isinstance(v, str) and v}
        memory.add(series, rows["timestamp"].to_numpy(), rows["value"].to_numpy())
    _merge_same_series(memory)


def _merge_same_series(memory: MemorySource) -> None:
    # generate() yields time windows; join each series's pieces into one.
    merged: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for i, s in enumerate(memory.series):
        merged.setdefault(tuple(sorted(s.labels.items())), []).append(i)
    out = []
    for rows in merged.values():
        first = memory.series[rows[0]]
        first.ts = np.concatenate([memory.series[r].ts for r in rows])
        first.values = np.concatenate([memory.series[r].values for r in rows])
        out.append(first)
    memory.series = out


def median_ms(run: Callable[[], object], runs: int) -> float:
    run()  # warm: the first run reads files and fills caches
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def measure(
    vault: Vault, on_vault: Engine, in_memory: Engine, expr: str, selector: str,
    query: tuple[int, int, int], runs: int,
) -> str:  # fmt: skip
    start, end, _ = query
    full = median_ms(partial(on_vault.evaluate, expr, *query), runs)
    alone = median_ms(partial(in_memory.evaluate, expr, *query), runs)
    read = median_ms(partial(vault.query, selector, start, end + 1, output="arrow"), runs)
    answer = on_vault.evaluate(expr, *query).to_prometheus()
    same = "yes" if answer == in_memory.evaluate(expr, *query).to_prometheus() else "NO"
    return f"{full:13.1f} {alone:12.1f} {read:12.1f}  {len(answer['result']):>6} {same}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=13)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    spec = ClusterSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days, interval_s=15
    )
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        vault, memory, end = load(spec, Path(tmp))
        took = time.perf_counter() - started
        print(f"loaded {spec.nodes} nodes x {spec.gpus_per_node} GPUs x {spec.days} d "
              f"({len(memory.series)} series) in {took:.1f} s")  # fmt: skip
        on_vault, in_memory = Engine(VaultSource(vault)), Engine(memory)
        print(f"{'query':22} {'range':>5} {'step':>5} {'vault+engine':>13} {'engine only':>12} "
              f"{'vault.query':>12}  {'series':>6} same  (median ms of {args.runs})")  # fmt: skip
        for range_ms, step_ms, window in RANGES:
            if range_ms <= spec.days * 24 * HOUR_MS:
                for name, template, selector in QUERIES:
                    expr = template.replace("$i", window)
                    row = measure(vault, on_vault, in_memory, expr, selector,
                                  (end - range_ms, end, step_ms), args.runs)  # fmt: skip
                    print(f"{name:22} {range_ms // HOUR_MS:>4}h {step_ms // 1000:>4}s {row}")
        vault.close()


if __name__ == "__main__":
    main()
