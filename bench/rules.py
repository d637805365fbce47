"""Rule evaluation: metricvault's evaluator beside Debian's Prometheus, same rules, same data.

    .venv/bin/python bench/rules.py                     # 256 GPUs, 200 rules, 28 d at 5 min
    .venv/bin/python bench/rules.py --gpus 1000 --rules 200 --days 28 --long-interval 300

Part 1, shipped-style rules: ``--rules`` alerting and recording rules generated from the
expressions of ``deploy/rules/*.yml`` (thresholds; ``avg/max/min_over_time`` and ``rate`` over
5m to 1h; ``by (Hostname)`` aggregations; ``predict_linear``; the ``unless`` of
GpuMetricsAbsent) in groups of 20 at ``interval: 30s``, over ``--gpus`` simulated GPUs
(``metricvault.sim``, every series labelled ``simulated="true"``; 11 dcgm-exporter metrics
each, a 30 s scrape, 3 h of data so that 1 h windows, ``predict_linear(...[2h])`` and
``offset`` have samples). The same samples go into a vault (written, flushed, maintained) and,
as OpenMetrics text backfilled with ``promtool tsdb create-blocks-from openmetrics``, into a
TSDB directory that Debian's ``prometheus`` (2.42) is started on, on 127.0.0.1, with the same
rule file and a 30 s ``evaluation_interval``. The data reaches past the run's end, so both
evaluate "now" over full windows. Per evaluation round (all groups once):

- metricvault: ``RuleGroup.evaluate`` with ``engine_query(Engine(vault))``, recorded samples
  and ``ALERTS`` written back into the vault as the server does; wall time (sum of the
  groups' times, and the round's elapsed time) and CPU time (``time.process_time``) of this
  process; once with the groups one after another and once ``--concurrency`` at a time in
  a thread pool, as the evaluator runs them (``rules_max_concurrent_groups``);
  ``--no-head-cache``: with the engine's kept recent samples off (every rule reads the
  store, promql/head_cache.py), the before;
- Prometheus: the sum of the groups' ``evaluationTime`` from ``/api/v1/rules`` (its own timer
  around each group's round) and the process's CPU time (``/proc/PID/stat`` utime + stime)
  between the first and the last round observed, per round.

Part 2, the 28-day rule: ``avg_over_time`` and ``quantile_over_time(0.95, ...)`` of
``DCGM_FI_DEV_GPU_UTIL[28d]`` over ``--gpus`` series, ``--days`` of data at
``--long-interval`` seconds in a vault with ``retention_raw=7d`` after ``maintain`` (so the
window starts before the raw horizon, as in production), evaluated as a rule (``engine_query``,
what a rule group calls) at ten of a rule's evaluation times (30 s multiples plus a group
offset), at ten whole hours (an hourly rule), and at a rule's first time after each of ten
whole hours (evaluated at its last time before it too, untimed: the window's end and
start cross an hour): time per evaluation (median of 9, after one) uncached (the
engine's window cache off: every evaluation reads all its rows) and through a rule
manager's engine, which keeps the window between evaluations (promql/window_cache.py; its
first evaluation builds it, and later ones slide it across the hours), against the
target of 100 ms per rule, and the tiers that answered (``QueryResult.served_by``, which must
name ``1h``).
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import calendar
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from metricvault.promql import Engine
from metricvault.promql.eval import EngineOptions
from metricvault.rules.files import read_rule_files
from metricvault.rules.group import RuleGroup, engine_query
from metricvault.sim import ClusterSpec, generate

GPUS_PER_NODE = 8
SCRAPE_S = 30
EVAL_INTERVAL_S = 30
RULE_DATA_HOURS = 3.0  # predict_linear(...[2h]) and `offset 2h` need 2 h behind "now"
GROUP_SIZE = 20
LONG_RULE_TARGET_MS = 100.0
LONG_EVALS = 9  # evaluations measured per 28-day rule and kind of time (after one)
LONG_RETENTION_RAW = "7d"
LONG_METRIC = "DCGM_FI_DEV_GPU_UTIL"
LONG_EXPRS = (
    f"avg_over_time({LONG_METRIC}[28d])",
    f"quantile_over_time(0.95, {LONG_METRIC}[28d])",
)
READY_TIMEOUT_S = 60.0
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Gauges with a threshold that some simulated GPUs cross (the simulator's ranges): metric,
# a high threshold and a low one.
GAUGES = (
    ("DCGM_FI_DEV_GPU_UTIL", 95, 5),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", 35, 2),
    ("DCGM_FI_DEV_GPU_TEMP", 70, 35),
    ("DCGM_FI_DEV_POWER_USAGE", 650, 100),
    ("DCGM_FI_DEV_SM_CLOCK", 1900, 400),
    ("DCGM_FI_DEV_FB_USED", 60000, 1000),
    ("DCGM_FI_PROF_SM_ACTIVE", 0.9, 0.1),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.4, 0.02),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 0.35, 0.05),
)
COUNTER = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ
WINDOWS = ("5m", "10m", "15m", "30m", "1h")
OVER_TIME = ("avg_over_time", "max_over_time", "min_over_time")


# --------------------------------------------------------------------------- the rules
def rule_variants() -> Iterator[dict[str, Any]]:
    """Shipped-style rules, cycling through the kinds so that any prefix mixes them all."""
    n = 0
    while True:
        for w in WINDOWS:
            for metric, high, low in GAUGES:
                n += 1
                suffix = f"{n:03d}"
                short = metric.removeprefix("DCGM_FI_DEV_").removeprefix("DCGM_FI_PROF_").lower()
                fn = OVER_TIME[n % len(OVER_TIME)]
                thr = high if fn != "min_over_time" else low
                op = "<" if fn == "min_over_time" else ">"
                yield _alert(f"Gpu{short}High{suffix}", f"{metric} > {high}", "2m")
                yield _alert(
                    f"Gpu{short}{fn.split('_')[0].title()}{w}{suffix}",
                    f"{fn}({metric}[{w}]) {op} {thr}",
                    "5m",
                )
                yield _alert(
                    f"Host{short}{w}{suffix}",
                    f"max by (Hostname) (avg_over_time({metric}[{w}])) > {high}",
                    "",
                )
                yield {
                    "record": f"hostname:{short.lower()}:avg{w}_{suffix}",
                    "expr": f"avg by (Hostname) (avg_over_time({metric}[{w}]))",
                }
            yield _alert(
                f"GpuEnergyRate{w}{n:03d}",
                f"rate({COUNTER}[{w}]) / 1000 > 600",  # mJ/s -> W
                "5m",
            )
            yield {
                "record": f"hostname:gpu_power_watts:rate{w}_{n:03d}",
                "expr": f"sum by (Hostname) (rate({COUNTER}[{w}])) / 1000",
            }
            yield _alert(
                f"GpuMemoryLeak{w}{n:03d}",
                f"predict_linear(DCGM_FI_DEV_FB_USED[{w}], 4 * 3600) "
                "> DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE",
                "30m",
            )
            yield _alert(
                f"GpuMetricsAbsent{w}{n:03d}",
                f"max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_UTIL[{w}])) "
                "unless max by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
                "2m",
            )


def _alert(name: str, expr: str, hold: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if hold:
        rule["for"] = hold
    rule["labels"] = {"severity": "warning", "scope": "gpu"}
    rule["annotations"] = {"summary": "{{ $labels.Hostname }} GPU {{ $labels.gpu }}: {{ $value }}"}
    return rule


def make_rules(count: int) -> list[dict[str, Any]]:
    """The first ``count`` generated rules, every name distinct."""
    out: list[dict[str, Any]] = []
    for rule in rule_variants():
        if len(out) == count:
            return out
        out.append(rule)
    return out  # unreachable: the generator is endless


def rule_file_text(rules: list[dict[str, Any]], group_size: int = GROUP_SIZE) -> str:
    groups = [
        {"name": f"bench-{i // group_size:02d}", "interval": f"{EVAL_INTERVAL_S}s",
         "rules": rules[i : i + group_size]}
        for i in range(0, len(rules), group_size)
    ]  # fmt: skip
    return yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000)


# --------------------------------------------------------------------------- the data
def gpu_spec(gpus: int, hours: float, interval_s: int, end_ms: int) -> ClusterSpec:
    """``gpus`` simulated GPUs (rounded up to whole 8-GPU nodes), ``hours`` up to ``end_ms``."""
    nodes = max(1, -(-gpus // GPUS_PER_NODE))
    return ClusterSpec.ending_at(
        end_ms, hours / 24, nodes=nodes, gpus_per_node=GPUS_PER_NODE, interval_s=interval_s
    )


def whole_nodes(gpus: int) -> int:
    """How many GPUs ``gpu_spec`` simulates for ``gpus``: whole 8-GPU nodes."""
    return max(1, -(-gpus // GPUS_PER_NODE)) * GPUS_PER_NODE


def gpu_tables(spec: ClusterSpec, metrics: tuple[str, ...] | None = None) -> Iterator[pa.Table]:
    """The simulator's GPU series (the training series left out: the rules do not read them)."""
    for table in generate(spec):
        keep = pc.starts_with(table["metric"], "DCGM_")
        if metrics is not None:
            keep = pc.is_in(table["metric"], pa.array(metrics))
        yield table.filter(keep)


def openmetrics_lines(table: pa.Table) -> list[str]:
    """One OpenMetrics sample line per row (exact values: shortest round-trip text; ms
    timestamps as seconds with 3 decimals); empty labels left out as Prometheus drops them."""
    labels = [c for c in table.column_names if c not in ("metric", "timestamp", "value")]
    parts: list[Any] = []
    for i, name in enumerate(labels):
        column = pc.fill_null(table[name], "")
        text = pc.binary_join_element_wise(
            f'{"," if i else ""}{name}="', column, '"', ""
        )  # fmt: skip
        parts.append(pc.if_else(pc.equal(column, ""), "", text))
    ts = table["timestamp"].cast(pa.int64())
    secs = pc.cast(pc.divide(ts, 1000), pa.string())
    millis = pc.utf8_lpad(pc.cast(pc.subtract(ts, pc.multiply(pc.divide(ts, 1000), 1000)),
                                  pa.string()), 3, "0")  # fmt: skip
    values = pc.cast(table["value"], pa.string())
    line = pc.binary_join_element_wise(
        table["metric"], "{", *parts, "} ", values, " ", secs, ".", millis, ""
    )
    # a label list that starts with a dropped label would leave a leading comma
    line = pc.replace_substring(line, "{,", "{")
    return [str(s) for s in line.to_pylist()]


def write_openmetrics(path: Path, tables: list[pa.Table]) -> int:
    """All samples, series after series (each in time order), then ``# EOF``."""
    table = pa.concat_tables(tables).combine_chunks()
    keys = [c for c in table.column_names if c not in ("timestamp", "value")]
    table = table.sort_by([(k, "ascending") for k in [*keys, "timestamp"]])
    with open(path, "w") as out:
        for start in range(0, table.num_rows, 500_000):
            out.write("\n".join(openmetrics_lines(table.slice(start, 500_000))))
            out.write("\n")
        out.write("# EOF\n")
    return int(table.num_rows)


# --------------------------------------------------------------------------- Prometheus
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def prometheus(binary: str, directory: Path, rule_file: Path) -> Iterator[tuple[str, int]]:
    config = directory / "prometheus.yml"
    config.write_text(
        json.dumps(
            {"global": {"evaluation_interval": f"{EVAL_INTERVAL_S}s"},
             "rule_files": [str(rule_file)]}
        )
    )  # fmt: skip
    port = _free_port()
    log = directory / "prometheus.log"
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'tsdb'}",
        "--storage.tsdb.retention.time=3650d",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=directory)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class Rounds:
    wall_s: list[float]  # per round, all groups
    cpu_s: list[float]
    errors: int  # rules with an error in the last round
    alerts: int  # pending or firing alerts after the last round
    messages: dict[str, str]  # rule -> its error, the last round
    times: list[dict[str, int]]  # per round (the unmeasured first one too): group -> eval ms
    elapsed_s: list[float] | None = None  # per round, first group start to last group end


def prometheus_rounds(url: str, pid: int, groups: int, rounds: int) -> Rounds:
    """Wait until every group evaluated ``rounds + 1`` times; the groups' evaluationTime of
    each round after the first, and the CPU time between the first and last rounds."""
    seen: dict[str, dict[str, float]] = {}  # group -> lastEvaluation -> evaluationTime
    cpu_marks: list[tuple[int, float]] = []
    deadline = time.monotonic() + (rounds + 3) * EVAL_INTERVAL_S + 60
    data: Any = None
    while time.monotonic() < deadline:
        data = _get_json(f"{url}/api/v1/rules")["data"]["groups"]
        for g in data:
            if g["lastEvaluation"].startswith("0001"):
                continue
            seen.setdefault(g["name"], {})[g["lastEvaluation"]] = g["evaluationTime"]
        done = min((len(v) for v in seen.values()), default=0) if len(seen) == groups else 0
        if not cpu_marks or cpu_marks[-1][0] != done:
            cpu_marks.append((done, _cpu_seconds(pid)))
        if done >= rounds + 1:
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"Prometheus evaluated fewer than {rounds + 1} rounds in time")
    per_round = [sum(sorted(v.items())[r][1] for v in seen.values()) for r in range(1, rounds + 1)]
    times = [{g: rfc3339_ms(sorted(v)[r]) for g, v in seen.items()} for r in range(rounds + 1)]
    first = next(c for n, c in cpu_marks if n >= 1)
    cpu = (cpu_marks[-1][1] - first) / (cpu_marks[-1][0] - 1)
    messages = {r["name"]: r["lastError"] for g in data for r in g["rules"] if r["health"] == "err"}
    alerts = sum(len(r.get("alerts", [])) for g in data for r in g["rules"])
    return Rounds(per_round, [cpu] * rounds, len(messages), alerts, messages, times)


def rfc3339_ms(text: str) -> int:
    """Prometheus's ``lastEvaluation`` (RFC 3339, up to nanoseconds) in ms."""
    stamp, _, frac = text.rstrip("Z").partition(".")
    secs = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    return secs * 1000 + int((frac + "000")[:3])


# --------------------------------------------------------------------------- metricvault
def metricvault_rounds(
    vault: Any,
    rule_file: Path,
    rounds: int,
    times: list[dict[str, int]] | None,
    concurrency: int = 1,
    options: EngineOptions | None = None,
) -> Rounds:
    """``rounds + 1`` rounds, the first unmeasured; at Prometheus's evaluation times where it
    ran (each group's aligned time at its ``lastEvaluation``), else at the aligned times of
    now; ``concurrency`` groups at a time."""
    groups = [RuleGroup(spec) for spec in read_rule_files([str(rule_file)])]
    query = engine_query(Engine(vault, options))
    wall, cpu, elapsed = [], [], []
    messages: dict[str, str] = {}
    pool = ThreadPoolExecutor(concurrency) if concurrency > 1 else None
    for r in range(rounds + 1):
        now = int(time.time() * 1000)
        wall_s, cpu_started, started = 0.0, time.process_time(), time.perf_counter()
        messages = {}
        stamps = [g.eval_timestamp(times[r][g.name] if times else now) for g in groups]
        if pool is None:
            pairs = zip(groups, stamps, strict=True)
            results = [g.evaluate(at, query, vault.write) for g, at in pairs]
        else:
            results = list(pool.map(lambda g, at: g.evaluate(at, query, vault.write),
                                    groups, stamps))  # fmt: skip
        for result in results:
            wall_s += result.seconds
            messages.update(result.errors)
        if r:  # the first round reads files into the caches: left out, as for Prometheus
            wall.append(wall_s)
            cpu.append(time.process_time() - cpu_started)
            elapsed.append(time.perf_counter() - started)
    if pool is not None:
        pool.shutdown()
    alerts = sum(
        a.state != "inactive" for g in groups for rule in g.alerting_rules()
        for a in rule.active.values()
    )  # fmt: skip
    return Rounds(wall, cpu, len(messages), alerts, messages, [], elapsed)


def long_rule(args: argparse.Namespace, directory: Path) -> list[list[str]]:
    from metricvault.store.vault import Vault

    end = int(time.time() * 1000) // HOUR_MS * HOUR_MS
    spec = gpu_spec(args.gpus, args.days * 24, args.long_interval, end)
    started = time.perf_counter()
    rows = 0
    with Vault.open_local(str(directory / "long"), retention_raw=LONG_RETENTION_RAW) as vault:
        for table in gpu_tables(spec, (LONG_METRIC,)):
            vault.write(table)
            rows += table.num_rows
        vault.flush()
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        vault.maintain(now_ms=end)
        maintained = time.perf_counter() - started
        gpus = whole_nodes(args.gpus)
        print(f"28-day vault: {rows:,} samples of {LONG_METRIC} ({gpus} GPUs, {args.days} d "
              f"at {args.long_interval} s), written in {loaded:.0f} s, maintained in "
              f"{maintained:.0f} s, retention_raw={LONG_RETENTION_RAW}")  # fmt: skip
        # A rule's evaluation times: 30 s multiples plus its group's offset (7 s here), never
        # whole hours; and, beside them, whole hours, where the 1h rows answer exactly.
        step = EVAL_INTERVAL_S * 1000
        rule_at = (end - 20 * 60_000) // step * step + 7_000
        hours = [end - (LONG_EVALS + 1 - i) * HOUR_MS for i in range(LONG_EVALS + 1)]
        # a rule's last time before each of those hours and its first one after (timed)
        crossing = [t + d for t in hours for d in (7_000 - step, 7_000)]
        whens = (
            ("a rule's times (30 s + 7 s)", [rule_at + i * step for i in range(LONG_EVALS + 1)]),
            ("whole hours", hours),
            ("a rule's first time in an hour", crossing),
        )
        out = []
        for expr in LONG_EXPRS:
            for when, stamps in whens:
                timed = slice(1, None, 2) if stamps is crossing else slice(None)
                # uncached: every evaluation reads all its rows (the engine's window cache off)
                plain = engine_query(Engine(vault, EngineOptions(window_cache=False)))
                uncached = _timed(plain, expr, stamps)[timed]
                kept_engine = Engine(vault)  # a rule manager's engine: long windows kept
                # the first builds it; at the crossings, the time after each hour
                kept = _timed(engine_query(kept_engine), expr, stamps)
                kept = [kept[0], *kept[timed][1:]] if stamps is crossing else kept
                result = kept_engine.evaluate(expr, stamps[-1])
                first, ms = kept[0], statistics.median(kept[1:])
                served = ",".join(sorted(result.served_by)) or "raw"
                ok = ms <= LONG_RULE_TARGET_MS and "1h" in result.served_by
                out.append([f"`{expr}`", when, str(len(result.series)), served,
                            f"{statistics.median(uncached[1:]):.1f} ms", f"{first:.1f} ms",
                            f"{ms:.1f} ms", f"{'met' if ok else 'MISSED'} (<= "
                            f"{LONG_RULE_TARGET_MS:.0f} ms, from 1h rows)"])  # fmt: skip
    return out


def _timed(query: Any, expr: str, stamps: list[int]) -> list[float]:
    """ms per evaluation at each of ``stamps`` (the first one too: the caller leaves it out
    of the median, it reads the files into the caches or builds the kept window)."""
    import gc

    times = []
    for at in stamps:
        gc.collect()
        t0 = time.perf_counter()
        query(expr, at)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def rules_part(
    args: argparse.Namespace, directory: Path, prom_binary: str | None, promtool: str | None
) -> None:
    """Part 1: the generated rules in both evaluators, at Prometheus's evaluation times."""
    from metricvault.store.vault import Vault

    rules = make_rules(args.rules)
    groups = -(-len(rules) // GROUP_SIZE)
    gpus = whole_nodes(args.gpus)
    size = (f"{gpus} simulated GPUs x 11 metrics at {SCRAPE_S} s, {len(rules)} rules in "
            f"{groups} groups at {EVAL_INTERVAL_S} s, {args.rounds} rounds")  # fmt: skip
    print(f"## bench/rules.py: {size}")
    rule_file = directory / "rules.yml"
    rule_file.write_text(rule_file_text(rules))
    # The data ends now: Prometheus's head takes recorded samples only after its blocks.
    spec = gpu_spec(args.gpus, RULE_DATA_HOURS, SCRAPE_S, int(time.time() * 1000))
    tables = list(gpu_tables(spec))
    rows: list[list[str]] = []
    prom: Rounds | None = None
    if prom_binary is not None and promtool is not None:
        started = time.perf_counter()
        samples = write_openmetrics(directory / "data.om", tables)
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", "data.om", "tsdb"],
            cwd=directory, check=True, capture_output=True, timeout=1800,
        )  # fmt: skip
        (directory / "data.om").unlink()
        print(f"promtool: {samples:,} samples backfilled in "
              f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        with prometheus(prom_binary, directory, rule_file) as (url, pid):
            prom = prometheus_rounds(url, pid, groups, args.rounds)
    with Vault.open_local(str(directory / "vault"), retention_raw="forever") as vault:
        started = time.perf_counter()
        for t in tables:
            vault.write(t)
        vault.flush()
        vault.maintain(now_ms=spec.end_ms)
        print(f"vault: {sum(t.num_rows for t in tables):,} samples loaded and maintained "
              f"in {time.perf_counter() - started:.0f} s")  # fmt: skip
        prom_times = prom.times if prom else None
        # --no-head-cache: the engine reads every rule's samples from the store (the before)
        options = EngineOptions(head_cache=False) if args.no_head_cache else None
        mv = metricvault_rounds(vault, rule_file, args.rounds, prom_times, 1, options)
        mv_pool = metricvault_rounds(
            vault, rule_file, args.rounds, prom_times, args.concurrency, options
        )
    tables.clear()
    print()
    head = ["evaluator", "size", "wall per round (sum of groups, median)", "round elapsed",
            "per rule", "CPU per round", "rules in error", "active alerts"]  # fmt: skip
    runs = (("metricvault, groups one after another", mv),
            (f"metricvault, {args.concurrency} groups at once", mv_pool),
            ("Prometheus 2.42 (a goroutine per group)", prom))  # fmt: skip
    for name, r in runs:
        if r is None:
            rows.append([name, size, "-", "-", "-", "-", "-", "-"])
            continue
        wall = statistics.median(r.wall_s)
        took = f"{statistics.median(r.elapsed_s) * 1000:,.0f} ms" if r.elapsed_s else "-"
        rows.append([name, size, f"{wall * 1000:,.0f} ms", took,
                     f"{wall * 1000 / len(rules):.2f} ms",
                     f"{statistics.median(r.cpu_s) * 1000:,.0f} ms", str(r.errors),
                     str(r.alerts)])  # fmt: skip
    table(head, rows)
    print(f"load average (1, 5, 15 min) after the rounds: {_load()}")
    for name, r in (("metricvault", mv), ("Prometheus", prom)):
        for rule, error in sorted((r.messages if r else {}).items())[:5]:
            print(f"{name}: {rule}: {error}")


# --------------------------------------------------------------------------- the run
def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def table(head: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--gpus", type=int, default=256, help="simulated GPUs, whole 8-GPU nodes (full: 1000)"
    )
    parser.add_argument("--rules", type=int, default=200, help="generated rules")
    parser.add_argument("--days", type=float, default=28.0, help="days for the 28-day rule")
    parser.add_argument("--long-interval", type=int, default=300,
                        help="scrape interval (s) of the 28-day data")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="evaluation rounds measured")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="groups evaluated at once in the pooled run")  # fmt: skip
    parser.add_argument("--no-prometheus", action="store_true")
    parser.add_argument("--skip-long", action="store_true", help="skip the 28-day rule")
    parser.add_argument("--no-head-cache", action="store_true",
                        help="no recent samples kept between rules (the before)")  # fmt: skip
    parser.add_argument("--skip-rules", action="store_true", help="only the 28-day rule")
    args = parser.parse_args()

    prom_binary = None if args.no_prometheus else shutil.which("prometheus")
    promtool = shutil.which("promtool")
    if prom_binary is None or promtool is None:
        if not args.no_prometheus:
            print("prometheus/promtool are not installed (apt-get install -y prometheus): "
                  "skipping that peer")  # fmt: skip
        prom_binary = None
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if not args.skip_rules:
            rules_part(args, directory, prom_binary, promtool)
        if not args.skip_long:
            print(f"\n## 28-day rule: {whole_nodes(args.gpus)} simulated GPUs, {args.days} d at "
                  f"{args.long_interval} s")  # fmt: skip
            long_rows = long_rule(args, directory)
            print()
            table(["28-day rule", "evaluated at", "series", "served_by",
                   f"uncached (median of {LONG_EVALS})", "kept window: first evaluation",
                   f"kept window (median of {LONG_EVALS})", "target"], long_rows)  # fmt: skip
            print(f"load average (1, 5, 15 min): {_load()}")


if __name__ == "__main__":
    main()
