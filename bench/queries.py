"""The three benchmark queries, as metricvault calls and as the equivalent PromQL/MetricsQL.

Q1  mean and max of the GPU utilisation per GPU over the whole range.
Q2  one GPU's utilisation at 1-minute resolution over the whole range.
Q3  mean MFU per experiment (label ``job``) per day.

metricvault's step buckets are ``[t, t + step)`` labelled ``t``; VictoriaMetrics evaluates a
rollup at ``t`` over ``(t - window, t]``. The VictoriaMetrics ranges are therefore shifted by one
step so both systems aggregate the same calendar minutes and days (a sample exactly on a bucket
edge lands in the neighbouring bucket on one side; the result row counts show any difference).
VictoriaMetrics' ``avg by (job) (avg_over_time(...))`` averages per-series means; with one MFU
series per experiment (the simulator's shape) it equals metricvault's mean over all samples.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.datasets import DAY_MS, MINUTE_MS, Summary
from bench.peers import VictoriaMetrics

QUERY_TARGETS_MS = {"Q1": 20.0, "Q2": 5.0, "Q3": 20.0}  # metricvault's median latency targets


@dataclass(frozen=True)
class Timing:
    first_ms: float  # the first (cold) run
    median_ms: float  # median of the following runs
    rows: int


def time_runs(run: Callable[[], int], runs: int) -> Timing:
    """One first run, then ``runs`` timed runs; ``run`` returns the number of result rows."""
    started = time.perf_counter()
    rows = run()
    first = (time.perf_counter() - started) * 1000
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        rows = run()
        samples.append((time.perf_counter() - started) * 1000)
    return Timing(first, statistics.median(samples), rows)


@dataclass(frozen=True)
class QueryCase:
    key: str
    title: str
    expected_rows: int
    vault_call: str  # what the metricvault run does, for the report
    vm_request: str  # what the VictoriaMetrics run sends, for the report
    run_vault: Callable[[Any], int]
    run_vm: Callable[[VictoriaMetrics], int]


def floor_to(ms: int, step: int) -> int:
    return ms - ms % step


def query_cases(summary: Summary) -> list[QueryCase]:
    """Q1 and Q2 always; Q3 where the workload has an MFU metric."""
    cases = [_q1(summary), _q2(summary)]
    if summary.workload.mfu_metric and summary.experiment_days:
        cases.append(_q3(summary))
    return cases


def _q1(s: Summary) -> QueryCase:
    metric, start, end = s.workload.util_metric, s.min_ts, s.max_ts + 1
    window = f"{s.max_ts - s.min_ts + 1}ms"  # (max_ts - window, max_ts] holds every sample
    expr = (
        f'label_set(avg_over_time({metric}[{window}]), "agg", "mean") or '
        f'label_set(max_over_time({metric}[{window}]), "agg", "max")'
    )

    def run_vault(vault: Any) -> int:
        return len(vault.query(metric, start, end, step="all", aggs=("mean", "max")))

    return QueryCase(
        key="Q1",
        title=f"mean and max of {metric} per GPU, whole range",
        expected_rows=len(s.gpus),
        vault_call=f'query("{metric}", start, end, step="all", aggs=("mean","max"))',
        vm_request=f"/api/v1/query time=end: {expr}",
        run_vault=run_vault,
        run_vm=lambda vm: vm.instant(expr, s.max_ts) // 2,
    )


def _q2(s: Summary) -> QueryCase:
    selector = s.probe_selector()
    start, end = floor_to(s.min_ts, MINUTE_MS), s.max_ts + 1
    vm_start, vm_end = start + MINUTE_MS - 1, floor_to(s.max_ts, MINUTE_MS) + MINUTE_MS - 1
    expr = f"avg_over_time({selector}[1m])"

    def run_vault(vault: Any) -> int:
        return len(vault.query(selector, start, end, step="1m", aggs=("mean",)))

    return QueryCase(
        key="Q2",
        title="one GPU's utilisation at 1-minute resolution, whole range",
        expected_rows=s.probe_minutes(),
        vault_call=f'query({selector!r}, start, end, step="1m", aggs=("mean",))',
        vm_request=f"/api/v1/query_range step=1m: {expr}",
        run_vault=run_vault,
        run_vm=lambda vm: vm.range(expr, vm_start, vm_end, MINUTE_MS),
    )


def _q3(s: Summary) -> QueryCase:
    metric, label = s.workload.mfu_metric or "", s.workload.experiment_label or ""
    start, end = floor_to(s.min_ts, DAY_MS), s.max_ts + 1
    vm_start, vm_end = start + DAY_MS - 1, floor_to(s.max_ts, DAY_MS) + DAY_MS - 1
    expr = f"avg by ({label}) (avg_over_time({metric}[1d]))"

    def run_vault(vault: Any) -> int:
        frame = vault.query(metric, start, end, step="1d", aggs=("sum", "count"))
        per_day = frame.groupby(["timestamp", label])[["sum", "count"]].sum()
        return len(per_day["sum"] / per_day["count"])

    return QueryCase(
        key="Q3",
        title=f"mean {metric} per experiment ({label}) per day",
        expected_rows=len(s.experiment_days),
        vault_call=(
            f'query("{metric}", start, end, step="1d", aggs=("sum","count")) '
            f"+ pandas sum/count by ({label}, day)"
        ),
        vm_request=f"/api/v1/query_range step=1d: {expr}",
        run_vault=run_vault,
        run_vm=lambda vm: vm.range(expr, vm_start, vm_end, DAY_MS),
    )
