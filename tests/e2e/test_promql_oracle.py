"""The PromQL oracle: the same samples in Debian's real Prometheus and in the engine; every
expression below must give the same answer from both.

Samples go into Prometheus through its remote-write receiver (the project's own remote-write
encoder), into a :class:`MemorySource`, and into a real vault the engine reads through its read seam
(``Engine(vault)``). Each expression runs as instant queries at several times (on sample
timestamps, between them, past the end of the data and past the lookback) and as range
queries, through Prometheus's ``/api/v1/query`` and ``/api/v1/query_range`` and through the
engine. Answers are compared as the upstream PromQL compliance tester compares them: same
result type, same label sets, timestamps exact, values within a relative 1e-5 (NaN equals
NaN). Every disagreement is printed with both answers.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from metricvault.promql import STALE_NAN, Engine, MemorySource, PromQLError
from metricvault.promql.values import QueryResult
from metricvault.wire.remote_write import encode_write_request

from .conftest import free_port, stop_process, wait_http_ok

SCRAPE_MS = 15_000
N_SAMPLES = 161  # 40 minutes
REL_TOL = 1e-5
# Metrics the vault cannot hold: none since issue 13 (NaN values and stale markers are stored).
NOT_IN_VAULT: tuple[str, ...] = ()

QUERIES = [
    # selectors, modifiers, literals
    "node_temp_celsius",
    'node_temp_celsius{zone="gpu"}',
    'node_temp_celsius{instance=~"a|b", zone!="cpu"}',
    '{__name__=~"node_temp_celsius|gpu_util_ratio", instance="c"}',
    'gpu_util_ratio{gpu!~"[01]"}',
    "node_temp_celsius offset 5m",
    "node_temp_celsius offset -2m",
    "flaky_up",
    "nan_gauge",
    "stale_gauge",
    "node_temp_celsius @ end()",
    "node_temp_celsius @ start() offset 1m",
    "1",
    "-2.5",
    "(node_temp_celsius)",
    "-node_temp_celsius",
    "- -gpu_util_ratio",
    # range vectors at the top level (instant queries only)
    "node_temp_celsius[1m]",
    "http_requests_total[45s] offset 30s",
    # rates
    "rate(http_requests_total[1m])",
    "rate(http_requests_total[5m])",
    "rate(http_requests_total[2m] offset 3m)",
    "increase(http_requests_total[3m])",
    "irate(http_requests_total[1m])",
    "delta(node_temp_celsius[2m])",
    "idelta(node_temp_celsius[1m])",
    "rate(flaky_up[5m])",
    "rate(request_duration_seconds_count[2m])",
    "increase(http_requests_total[10m:30s])",
    "rate(http_requests_total[1m] @ end())",
    "resets(http_requests_total[10m])",
    "changes(node_temp_celsius[5m])",
    "changes(flaky_up[15m])",
    # *_over_time
    "avg_over_time(node_temp_celsius[3m])",
    "min_over_time(node_temp_celsius[3m])",
    "max_over_time(gpu_util_ratio[2m])",
    "sum_over_time(gpu_util_ratio[2m])",
    "count_over_time(flaky_up[4m])",
    "last_over_time(node_temp_celsius[2m])",
    "quantile_over_time(0.9, node_temp_celsius[5m])",
    "quantile_over_time(0.25, gpu_util_ratio[3m])",
    "stddev_over_time(node_temp_celsius[5m])",
    "stdvar_over_time(gpu_util_ratio[5m])",
    "present_over_time(flaky_up[2m])",
    "absent_over_time(flaky_up[1m])",
    'absent_over_time(nonexistent{job="x"}[5m])',
    "avg_over_time(nan_gauge[3m])",
    "max_over_time(nan_gauge[3m])",
    "count_over_time(stale_gauge[2m])",
    "max_over_time(rate(http_requests_total[1m])[5m:30s])",
    "avg_over_time(node_temp_celsius[5m:1m])",
    "min_over_time(node_temp_celsius[4m:])",
    # regression and smoothing
    "deriv(node_temp_celsius[5m])",
    "deriv(http_requests_total[3m])",
    "predict_linear(node_temp_celsius[5m], 600)",
    "predict_linear(http_requests_total[5m], 300)",
    "holt_winters(node_temp_celsius[5m], 0.5, 0.5)",
    "holt_winters(gpu_util_ratio[3m], 0.1, 0.9)",
    # aggregations
    "sum(node_temp_celsius)",
    "sum by (zone) (node_temp_celsius)",
    "sum without (instance) (rate(http_requests_total[2m]))",
    "avg by (instance) (gpu_util_ratio)",
    "min by (zone) (node_temp_celsius)",
    "max without (gpu) (gpu_util_ratio)",
    "count(gpu_util_ratio)",
    "count by (instance) (flaky_up or gpu_util_ratio)",
    "stddev(node_temp_celsius)",
    "stdvar by (instance) (gpu_util_ratio)",
    "group by (instance) (gpu_util_ratio)",
    "topk(2, node_temp_celsius)",
    "bottomk(3, gpu_util_ratio)",
    "topk by (zone) (1, node_temp_celsius)",
    "quantile(0.5, gpu_util_ratio)",
    "quantile by (instance) (0.9, gpu_util_ratio)",
    'count_values("code", http_status_code)',
    'count_values by (instance) ("gpu_count", gpu_count)',
    "sum(nan_gauge)",
    "max(nan_gauge)",
    "avg(stale_gauge)",
    'sum by (__name__) ({__name__=~"node_temp_celsius|gpu_util_ratio"})',
    # binary operators
    "node_temp_celsius * 2",
    "2 ^ gpu_util_ratio",
    "node_temp_celsius % 7",
    "node_temp_celsius > 50",
    "node_temp_celsius > bool 50",
    "55 < node_temp_celsius",
    "gpu_util_ratio == bool 0.5",
    "1 + 2 * 3",
    "2 > bool 1",
    "node_temp_celsius atan2 10",
    'node_temp_celsius{zone="gpu"} - ignoring(zone) node_temp_celsius{zone="cpu"}',
    'node_temp_celsius{zone="gpu"} / on(instance) node_temp_celsius{zone="cpu"}',
    "gpu_util_ratio * on(instance) group_left(version) node_info",
    "node_info * on(instance) group_right(version) gpu_util_ratio",
    "gpu_util_ratio > on(instance) group_left avg by (instance) (gpu_util_ratio)",
    "gpu_util_ratio / ignoring(gpu) group_left sum without (gpu) (gpu_util_ratio)",
    "node_temp_celsius > bool on(instance, zone) node_temp_celsius offset 1m",
    "rate(http_requests_total[2m]) / on(instance, method) rate(http_requests_total[5m])",
    "gpu_util_ratio and on(instance) flaky_up",
    "gpu_util_ratio unless on(instance) flaky_up",
    "flaky_up or node_temp_celsius",
    "node_temp_celsius and node_temp_celsius > 50",
    "(node_temp_celsius > 50) or (node_temp_celsius < 45)",
    "sum(gpu_util_ratio) / count(gpu_util_ratio)",
    "time() - timestamp(node_temp_celsius)",
    # instant functions
    "abs(delta(node_temp_celsius[1m]))",
    "ceil(node_temp_celsius)",
    "floor(gpu_util_ratio * 10)",
    "round(node_temp_celsius)",
    "round(node_temp_celsius, 0.5)",
    "exp(gpu_util_ratio)",
    "ln(node_temp_celsius)",
    "log2(node_temp_celsius)",
    "log10(node_temp_celsius)",
    "sqrt(node_temp_celsius)",
    "sgn(delta(node_temp_celsius[1m]))",
    "clamp(node_temp_celsius, 45, 55)",
    "clamp_max(node_temp_celsius, 50)",
    "clamp_min(node_temp_celsius, 50)",
    "clamp(node_temp_celsius, 55, 45)",
    "time()",
    "timestamp(node_temp_celsius)",
    "timestamp(rate(http_requests_total[1m]))",
    "vector(1)",
    "vector(time())",
    "scalar(sum(gpu_util_ratio))",
    "scalar(gpu_util_ratio)",
    "node_temp_celsius * scalar(count(flaky_up))",
    "absent(nonexistent)",
    'absent(nonexistent{job="x", instance=~"a.*"})',
    "absent(node_temp_celsius)",
    "absent(flaky_up)",
    "sort(node_temp_celsius)",
    "sort_desc(sum by (instance) (gpu_util_ratio))",
    'label_replace(node_temp_celsius, "host", "node-$1", "instance", "(.*)")',
    'label_replace(node_temp_celsius, "zone", "", "zone", "gpu")',
    'label_join(node_temp_celsius, "id", "/", "instance", "zone")',
    "histogram_quantile(0.9, rate(request_duration_seconds_bucket[2m]))",
    "histogram_quantile(0.5, sum by (le) (rate(request_duration_seconds_bucket[5m])))",
    "histogram_quantile(0.99, request_duration_seconds_bucket)",
    "rate(request_duration_seconds_sum[2m]) / rate(request_duration_seconds_count[2m])",
    "day_of_month()",
    "day_of_week(timestamp(node_temp_celsius))",
    "days_in_month()",
    "hour()",
    "minute(vector(time()))",
    "month()",
    "year(vector(1700000000))",
    # subqueries
    "node_temp_celsius[10m:1m]",
    "sum_over_time(gpu_util_ratio[5m:45s] offset 1m)",
    "max_over_time(sum(gpu_util_ratio)[5m:])",
    "rate(http_requests_total[5m:15s] @ end())",
    # NaN, Inf and stale markers through functions and operators
    "rate(nan_gauge[5m])",
    "changes(nan_gauge[5m])",
    "resets(nan_gauge[5m])",
    "deriv(nan_gauge[5m])",
    "quantile_over_time(0.5, nan_gauge[3m])",
    "sort(nan_gauge or node_temp_celsius)",
    "sort_desc(nan_gauge or gpu_util_ratio)",
    "topk(2, nan_gauge or node_temp_celsius)",
    "bottomk(2, nan_gauge or node_temp_celsius)",
    "quantile(0.5, nan_gauge or gpu_util_ratio)",
    'count_values("v", nan_gauge)',
    "nan_gauge > 5",
    "nan_gauge == bool nan_gauge",
    "sum by (instance) (stale_gauge)",
    "last_over_time(stale_gauge[1m])",
    "1 / 0",
    "0 / 0",
    "-1 ^ 0.5",
    "node_temp_celsius / 0",
    # more modifiers, parameters and matching
    "timestamp(node_temp_celsius offset 1m)",
    "timestamp(node_temp_celsius @ end())",
    "sum_over_time(gpu_util_ratio[3m:30s] @ start())",
    "max_over_time(node_temp_celsius[2m:20s] offset 90s)",
    "topk(scalar(count(flaky_up)) + 1, gpu_util_ratio)",
    "quantile(1.5, gpu_util_ratio)",
    "quantile(-1, gpu_util_ratio)",
    "histogram_quantile(1.2, rate(request_duration_seconds_bucket[2m]))",
    "histogram_quantile(0, rate(request_duration_seconds_bucket[2m]))",
    'count_values without (instance) ("code", http_status_code)',
    "sum by () (rate(http_requests_total[1m]))",
    "node_info * on(instance) group_left(zone) node_temp_celsius",
    "gpu_util_ratio * on(instance) group_left(nonexistent) node_info",
    "gpu_util_ratio + ignoring(gpu) group_left node_info",
    "node_temp_celsius unless node_temp_celsius offset 30m",
    "node_temp_celsius == bool node_temp_celsius offset 1m",
    "node_temp_celsius offset 1m or node_temp_celsius",
    "scalar(vector(1))",
    "vector(1) + on() group_left node_info",
    "histogram_count(request_duration_seconds_bucket)",
    '"hello"',
    # window boundaries, nesting, pinned subtrees, parameters
    "rate(http_requests_total[15s])",
    "increase(http_requests_total[30s])",
    "node_temp_celsius offset 7500ms",
    "max_over_time(avg_over_time(node_temp_celsius[1m:15s])[5m:1m])",
    "node_temp_celsius - scalar(min(node_temp_celsius) @ end())",
    "-vector(1)",
    "-(1)",
    "topk(0, gpu_util_ratio)",
    "topk(2.7, gpu_util_ratio)",
    "topk(1, node_temp_celsius @ start())",
    "bottomk by (instance) (1, rate(http_requests_total[1m]))",
    "sum by (method) (rate(http_requests_total[5m])) > 1",
    'histogram_quantile(0.5, request_duration_seconds_bucket{le!="+Inf"})',
    'label_join(node_temp_celsius, "id", "-", "nonexistent", "instance", "also_missing")',
    "clamp_min(nan_gauge, 5)",
    "changes(stale_gauge[30m])",
    "count_over_time(http_requests_total[1m] @ start())",
    # failures both must report (parse errors: the wording is the parser's, the type is checked)
    "sum(",
    "rate(node_temp_celsius)",
    'node_temp_celsius{zone=~"("}',
    "node_temp_celsius[5m",
    "no_such_function(node_temp_celsius)",
    "1 > 2",
    "node_temp_celsius offset",
    'sum by (zone) ("x")',
    "topk(node_temp_celsius, gpu_util_ratio)",
    "node_temp_celsius and 1",
    "{}",
    'label_join(node_temp_celsius, "1bad", "-", "zone")',
    'count_values("not a label", gpu_count)',
    '-({__name__=~"gpu_count|http_status_code"})',
    'rate({__name__=~"gpu_count|http_status_code"}[1m])',
    'abs({__name__=~"gpu_count|http_status_code"})',
    'label_replace(gpu_util_ratio, "gpu", "x", "gpu", ".*")',
    'sum(node_temp_celsius{instance="a"}) + on() group_left node_temp_celsius',
    "node_temp_celsius + ignoring(zone) node_temp_celsius",
    "holt_winters(node_temp_celsius[5m], 2, 0.5)",
    'label_replace(node_temp_celsius, "x", "$1", "instance", "(")',
    '{__name__=~"node_temp_celsius|gpu_util_ratio"} * 1 unless gpu_util_ratio',
]
# Every range function and aggregation over every kind of series, generated.
_SERIES = ("http_requests_total", "node_temp_celsius", "flaky_up", "nan_gauge", "stale_gauge",
           "request_duration_seconds_bucket")  # fmt: skip
_RANGE_FUNCTIONS = ("rate", "increase", "delta", "irate", "idelta", "resets", "changes", "deriv",
                    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
                    "count_over_time", "last_over_time", "stddev_over_time", "stdvar_over_time",
                    "present_over_time", "absent_over_time")  # fmt: skip
QUERIES += [
    f"{fn}({series}[{window}])"
    for fn in _RANGE_FUNCTIONS
    for series in _SERIES
    for window in ("30s", "4m", "2m:20s")
]
QUERIES += [
    f"{op}{modifier} ({series})"
    for op in ("sum", "avg", "min", "max", "count", "stddev", "stdvar", "group")
    for modifier in ("", " by (instance)", " without (instance)")
    for series in _SERIES
]
QUERIES += [f"quantile_over_time(0.33, {series}[2m])" for series in _SERIES]
QUERIES += [f"holt_winters({series}[3m], 0.3, 0.7)" for series in _SERIES]
QUERIES += [f"predict_linear({series}[3m], 120)" for series in _SERIES]
_OPERANDS = ("node_temp_celsius", "nan_gauge", "flaky_up", "node_info",
             "rate(http_requests_total[1m])")  # fmt: skip
QUERIES += [
    f"{lhs} {op} {rhs}"
    for op in ("+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "atan2")
    for lhs, rhs in (
        ("node_temp_celsius", "50"),
        ("2", "gpu_util_ratio"),
        ("nan_gauge", "nan_gauge offset 1m"),
    )
]
QUERIES += [f"nan_gauge {op} bool 10" for op in ("==", "!=", ">", "<", ">=", "<=")]
QUERIES += [
    f"{lhs} {op} {rhs}"
    for lhs in _OPERANDS
    for rhs in _OPERANDS
    if lhs != rhs
    for op in ("and", "or ignoring(zone)", "unless on(instance)")
]
QUERIES += [
    f"{fn}({arg})"
    for fn in (
        "abs",
        "ceil",
        "floor",
        "exp",
        "ln",
        "log2",
        "log10",
        "sqrt",
        "sgn",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "deg",
        "rad",
        "day_of_week",
        "day_of_year",
        "hour",
        "minute",
        "month",
        "year",
        "day_of_month",
        "days_in_month",
    )
    for arg in ("nan_gauge", "-gpu_util_ratio")
]
# Range vectors and strings have no range-query form.
INSTANT_ONLY = ("[1m]", "[45s] offset", "[10m:1m]")


# ------------------------------------------------------------------------------ data
def dataset(t0: int) -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    """Deterministic series: counters with resets, gauges, histogram buckets, a series with
    gaps, NaN/Inf values and a stale marker; some on exact 15 s ticks, some jittered."""
    rng = np.random.default_rng(13)
    grid = t0 + np.arange(N_SAMPLES, dtype=np.int64) * SCRAPE_MS
    out: list[tuple[str, dict[str, str], np.ndarray, np.ndarray]] = []

    def jitter(amount: int) -> np.ndarray:
        return grid + rng.integers(0, amount + 1, N_SAMPLES) if amount else grid

    for inst, method, slope, reset_at, jit in [
        ("a", "get", 3.0, 60, 0),
        ("a", "post", 0.5, None, 900),
        ("b", "get", 7.0, 100, 400),
        ("b", "post", 1.25, 30, 0),
        ("c", "get", 0.0, None, 0),
    ]:
        inc = rng.poisson(slope * 15, N_SAMPLES).astype(np.float64)
        vals = np.cumsum(inc) + 5
        if reset_at:
            vals[reset_at:] = np.cumsum(inc[reset_at:])
        labels = {"job": "api", "instance": inst, "method": method}
        out.append(("http_requests_total", labels, jitter(jit), vals))
    minutes = np.arange(N_SAMPLES) * SCRAPE_MS / 60_000
    for inst, phase in [("a", 0.0), ("b", 1.0), ("c", 2.0)]:
        for zone, base in [("gpu", 50.0), ("cpu", 47.0)]:
            wave = base + 8 * np.sin(minutes / 3 + phase) + rng.normal(0, 0.7, N_SAMPLES)
            out.append(
                ("node_temp_celsius", {"instance": inst, "zone": zone}, jitter(300), wave.round(3))
            )
        for gpu in "0123":
            util = np.clip(rng.beta(2, 2, N_SAMPLES), 0, 1).round(4)
            out.append(("gpu_util_ratio", {"instance": inst, "gpu": gpu}, grid, util))
        out.append(
            ("node_info", {"instance": inst, "version": f"1.{ord(inst)}"}, grid, np.ones(N_SAMPLES))
        )
        out.append(("gpu_count", {"instance": inst}, grid, np.full(N_SAMPLES, 8.0)))
        out.append(
            (
                "http_status_code",
                {"instance": inst},
                grid,
                rng.choice([200.0, 404.0, 500.0], N_SAMPLES),
            )
        )
    for inst in "ab":
        per_bucket = rng.poisson([4, 6, 3, 1], (N_SAMPLES, 4)).astype(np.float64)
        cumulative = np.cumsum(np.cumsum(per_bucket, axis=1), axis=0)
        for i, le in enumerate(["0.1", "0.5", "1", "+Inf"]):
            labels = {"instance": inst, "le": le}
            out.append(("request_duration_seconds_bucket", labels, grid, cumulative[:, i]))
        total = cumulative[:, -1]
        out.append(("request_duration_seconds_count", {"instance": inst}, grid, total))
        sums = np.cumsum((per_bucket * [0.05, 0.3, 0.7, 2.0]).sum(axis=1))
        out.append(("request_duration_seconds_sum", {"instance": inst}, grid, sums))
    up = (minutes < 10) | ((minutes >= 20) & (minutes < 25)) | (minutes >= 30)
    out.append(("flaky_up", {"instance": "a"}, grid[up], np.ones(int(up.sum()))))
    nan_vals = np.linspace(1, 20, N_SAMPLES)
    nan_vals[[10, 50, 51, 90]] = np.nan
    nan_vals[120] = np.inf
    out.append(("nan_gauge", {"instance": "a"}, grid, nan_vals))
    stale = minutes <= 20.25
    stale_vals = np.where(minutes[stale] == 20.25, STALE_NAN, 3.0)
    out.append(("stale_gauge", {"instance": "a"}, grid[stale], stale_vals))
    return out


# ------------------------------------------------------------------------------ servers
@dataclass
class Oracle:
    url: str
    t0: int
    memory: Engine
    vault: Engine


def _start_prometheus(directory: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install -y prometheus")
    port = free_port()
    config = directory / "prometheus.yml"
    # evaluation_interval is the default step of subqueries written [range:].
    config.write_text(json.dumps({"global": {"evaluation_interval": "1m"}}))
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-remote-write-receiver",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/-/ready", proc, log_path, "prometheus")
    return proc, url, log_path


def _remote_write(
    url: str, series: list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]
) -> None:
    samples = [
        (metric, labels, int(t), float(v))
        for metric, labels, ts, vs in series
        for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
    ]
    request = urllib.request.Request(
        f"{url}/api/v1/write",
        data=encode_write_request(samples),
        headers={
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status in (200, 204), resp.read()


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    from metricvault.store.vault import Vault

    directory = tmp_path_factory.mktemp("promql_oracle")
    t0 = (int(time.time() * 1000) - 50 * 60_000) // 60_000 * 60_000
    series = dataset(t0)
    proc, url, log_path = _start_prometheus(directory)
    try:
        _remote_write(url, series)
        memory = MemorySource()
        for metric, labels, ts, vs in series:
            memory.add({"__name__": metric, **labels}, ts, vs)
        vault = Vault.open_local(str(directory / "vault"))
        vault.write(
            [
                (metric, labels, int(t), float(v))
                for metric, labels, ts, vs in series
                if metric not in NOT_IN_VAULT
                for t, v in zip(ts.tolist(), vs.tolist(), strict=True)
            ]
        )
        vault.maintain()  # rolls every hour up: aligned windows are answered from rollups
        assert vault.catalog_version().rollup_watermark_ms() is None
        yield Oracle(url, t0, Engine(memory), Engine(vault))
        vault.close()
    finally:
        stop_process(proc, timeout=20)
        del log_path


# ------------------------------------------------------------------------------ comparing
Normal = tuple[str, Any]


def _prometheus(url: str, path: str, params: dict[str, str]) -> Normal:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=30) as resp:
            reply = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        reply = json.loads(exc.read())
    return normal_reply(reply)


def normal_reply(reply: dict[str, Any]) -> Normal:
    """A Prometheus API answer as (result type, sorted-comparable series), or ("error", ...)."""
    if reply["status"] != "success":
        return "error", (reply.get("errorType", ""), reply.get("error", ""))
    data = reply["data"]
    kind = data["resultType"]
    if kind in ("scalar", "string"):
        t, v = data["result"]
        return kind, [((), [(round(t * 1000), v if kind == "string" else float(v))])]
    points = []
    for item in data["result"]:
        labels = tuple(sorted(item["metric"].items()))
        raw = [item["value"]] if kind == "vector" else item["values"]
        points.append((labels, [(round(t * 1000), float(v)) for t, v in raw]))
    return kind, points


def _ours(engine: Engine, expr: str, *args: int) -> Normal:
    try:
        result: QueryResult = engine.evaluate(expr, *args)
    except PromQLError as exc:
        return "error", (exc.kind, exc.message)
    if result.result_type == "string":
        return "string", [((), [(int(result.series[0][1][0]), result.text)])]
    return result.result_type, [
        (tuple(sorted(labels.items())), list(zip(ts.tolist(), vs.tolist(), strict=True)))
        for labels, ts, vs in result.series
    ]


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return bool(a == b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return bool(a == b)
    return abs(a - b) <= REL_TOL * min(abs(a), abs(b)) or a == b


def _agree(expected: Normal, got: Normal, ordered: bool) -> bool:
    if expected[0] != got[0]:
        return False
    if expected[0] == "error":
        # Parse errors are worded by the parser package; errors on data must match exactly.
        return got[1][0] == "bad_data" or bool(got[1] == expected[1])
    exp_series, got_series = expected[1], got[1]
    if not ordered:
        exp_series, got_series = sorted(exp_series), sorted(got_series)
    if [labels for labels, _ in exp_series] != [labels for labels, _ in got_series]:
        return False
    for (_, exp_points), (_, got_points) in zip(exp_series, got_series, strict=True):
        if [t for t, _ in exp_points] != [t for t, _ in got_points]:
            return False
        if not all(_close(a, b) for (_, a), (_, b) in zip(exp_points, got_points, strict=True)):
            return False
    return True


def _cases(t0: int) -> list[tuple[str, str, dict[str, str], tuple[int, ...]]]:
    end = t0 + (N_SAMPLES - 1) * SCRAPE_MS
    instants = [end, end - 7_500, t0 + 20 * 60_000, t0 + 20 * 60_000 + 22_500, end + 180_000,
                end + 360_000]  # fmt: skip
    ranges = [(t0 + 120_000, end + 120_000, 30_000), (t0 + 300_000, t0 + 1_500_000, 17_000)]
    cases: list[tuple[str, str, dict[str, str], tuple[int, ...]]] = []
    for expr in QUERIES:
        for t in instants:
            cases.append((expr, "query", {"query": expr, "time": f"{t / 1000:.3f}"}, (t,)))
        if any(marker in expr for marker in INSTANT_ONLY):
            continue
        for start, stop, step in ranges:
            params = {"query": expr, "start": f"{start / 1000:.3f}", "end": f"{stop / 1000:.3f}",
                      "step": f"{step / 1000:.3f}"}  # fmt: skip
            cases.append((expr, "query_range", params, (start, stop, step)))
    return cases


def _run(oracle: Oracle, engine: Engine, skip: tuple[str, ...]) -> tuple[int, list[str]]:
    disagreements: list[str] = []
    compared = answered = 0
    for expr, path, params, args in _cases(oracle.t0):
        if any(name in expr for name in skip):
            continue
        expected = _prometheus(oracle.url, path, params)
        got = _ours(engine, expr, *args)
        compared += 1
        answered += expected[0] != "error" and bool(expected[1])
        ordered = path == "query" and expr.startswith("sort")
        if not _agree(expected, got, ordered):
            disagreements.append(
                f"{path} {expr!r} at {args}:\n  prometheus: {str(expected)[:600]}\n"
                f"  engine:     {str(got)[:600]}"
            )
    # Agreeing on empty answers proves nothing: most cases must have data.
    assert answered >= 0.7 * compared, f"only {answered} of {compared} answers hold data"
    return compared, disagreements


def test_engine_over_memory_agrees_with_prometheus(oracle: Oracle) -> None:
    compared, disagreements = _run(oracle, oracle.memory, ())
    print(f"{compared} queries compared, {len(disagreements)} disagree")
    for line in disagreements:
        print(line)
    assert compared >= 500
    assert not disagreements, f"{len(disagreements)} of {compared} disagree:\n" + "\n".join(
        disagreements[:30]
    )


def test_engine_over_vault_agrees_with_prometheus(oracle: Oracle) -> None:
    compared, disagreements = _run(oracle, oracle.vault, NOT_IN_VAULT)
    print(f"{compared} queries compared through the vault, {len(disagreements)} disagree")
    for line in disagreements:
        print(line)
    assert compared >= 400
    assert not disagreements, f"{len(disagreements)} of {compared} disagree:\n" + "\n".join(
        disagreements[:30]
    )


# Windows of whole minutes at minute-aligned times: answered from the 1m rollup rows (tiers.py),
# whose answers must be Prometheus's too. t0 is on a minute, so samples sit on bucket edges.
TIER_QUERIES = [
    "rate(http_requests_total[1m])",
    "rate(http_requests_total[5m])",
    "increase(http_requests_total[3m])",
    "rate(http_requests_total[2m] offset 3m)",
    "rate(request_duration_seconds_count[2m])",
    "rate(flaky_up[5m])",
    "delta(node_temp_celsius[2m])",
    "avg_over_time(node_temp_celsius[3m])",
    "min_over_time(node_temp_celsius[3m])",
    "max_over_time(gpu_util_ratio[2m])",
    "sum_over_time(gpu_util_ratio[2m])",
    "count_over_time(flaky_up[4m])",
    "last_over_time(node_temp_celsius[2m])",
    "present_over_time(flaky_up[2m])",
    "sum without (instance) (rate(http_requests_total[2m]))",
    "sum by (le) (rate(request_duration_seconds_bucket[5m]))",
    "histogram_quantile(0.9, sum by (le) (rate(request_duration_seconds_bucket[5m])))",
    "topk(2, avg_over_time(node_temp_celsius[5m]))",
    "avg_over_time(nan_gauge[3m])",  # NaN samples: read from raw, same answer
    "count_over_time(stale_gauge[2m])",
]


def test_rollup_tiers_agree_with_prometheus(oracle: Oracle) -> None:
    end = oracle.t0 + (N_SAMPLES - 1) * SCRAPE_MS
    disagreements, from_rollups, compared = [], 0, 0
    for expr in TIER_QUERIES:
        cases: list[tuple[str, dict[str, str], tuple[int, ...]]] = [
            ("query", {"query": expr, "time": f"{t / 1000:.3f}"}, (t,))
            for t in (end, end - 10 * 60_000, end + 120_000)
        ]
        start, stop = oracle.t0 + 5 * 60_000, end + 180_000
        params = {"query": expr, "start": f"{start / 1000:.3f}", "end": f"{stop / 1000:.3f}",
                  "step": "60"}  # fmt: skip
        cases.append(("query_range", params, (start, stop, 60_000)))
        for path, args_params, args in cases:
            expected = _prometheus(oracle.url, path, args_params)
            result = oracle.vault.evaluate(expr, *args)
            from_rollups += "1m" in result.served_by
            got = _ours(oracle.vault, expr, *args)
            compared += 1
            if not _agree(expected, got, ordered=False):
                shown = f"\n  prometheus: {str(expected)[:600]}\n  rollups:    {str(got)[:600]}"
                disagreements.append(f"{path} {expr!r} at {args}:{shown}")
    print(f"{compared} compared, {from_rollups} answered from 1m rollups")
    assert from_rollups >= 0.8 * compared
    assert not disagreements, "\n".join(disagreements[:20])
