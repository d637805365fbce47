"""PromQL dashboard queries: Debian's Prometheus and metricvault on the same samples, same run.

    .venv/bin/python bench/promql.py --quick          # 2 nodes x 8 GPUs x 1 day, < 1 min
    .venv/bin/python bench/promql.py                  # 13 nodes x 8 GPUs x 1 day at 15 s
    .venv/bin/python bench/promql.py --nodes 4 --days 0.5 --runs 3

The simulated cluster's GPU utilisation and energy counter (one day ending now, at 15 s) go into
a fresh vault and, through its remote-write receiver, into a fresh Prometheus 2.42 (Debian's
``prometheus``; in time order, 30 minutes per request, so no sample is out of order or older
than its head accepts; the load is checked against Prometheus's own appended-samples counter).
Then ``metricvault serve`` is started over the same vault. For each query and range it reports
the median latency of ``--runs`` warm runs (after one unmeasured run) of:

- Prometheus ``GET /api/v1/query_range`` (keep-alive connection, the body read, not parsed);
- metricvault ``GET /api/v1/query_range``, same parameters, same way, and again on a new
  connection per request ("new conn": a reused connection waits ~40 ms per answer today);
- ``Engine(VaultSource(vault))`` in this process (what the HTTP API runs, without HTTP/JSON);
- the raw ``vault.query`` of the selector over the range (the read the engine cannot avoid);

with the number of series answered and whether metricvault's HTTP answer agrees with
Prometheus's (same label sets and timestamps, values within a relative 1e-5, NaN equals NaN).
Needs the ``prometheus`` binary (``apt-get install -y prometheus``); without it, or with
``--no-prometheus``, those columns are left out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.promql import Engine, MemorySource, VaultSource
from metricvault.sim import ClusterSpec, generate
from metricvault.store.vault import Vault
from metricvault.wire.remote_write import encode_write_request

METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
HOUR_MS = 3_600_000
INTERVAL_S = 15
PUSH_WINDOW_MS = HOUR_MS // 2  # one remote-write request per 30 simulated minutes
READY_TIMEOUT_S = 30.0
COMPACTION_TIMEOUT_S = 60.0
REL_TOL = 1e-5
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


# --------------------------------------------------------------------------- load
def load(spec: ClusterSpec, directory: Path) -> tuple[Vault, MemorySource, int, int]:
    vault = Vault.open(str(directory / "vault"))
    memory = MemorySource()
    end, samples = 0, 0
    for table in generate(spec):
        table = table.filter(pc.is_in(table["metric"], pa.array(METRICS)))
        vault.write(table)
        end = max(end, int(pc.max(table["timestamp"]).as_py()))
        samples += table.num_rows
        _add_to_memory(memory, table)
    vault.flush()
    return vault, memory, end, samples


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


def push_to_prometheus(url: str, memory: MemorySource, start: int, end: int) -> None:
    """Every sample, oldest first, all series in each request: Prometheus 2.42 refuses a
    sample more than an hour older than its head's newest (out of bounds), so a request
    never reaches back behind the one before it."""
    for lo in range(start, end + 1, PUSH_WINDOW_MS):
        hi = lo + PUSH_WINDOW_MS
        batch: list[tuple[str, dict[str, str], int, float]] = []
        for s in memory.series:
            a, b = np.searchsorted(s.ts, [lo, hi])
            metric = s.labels["__name__"]
            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            ts, vs = s.ts[a:b].tolist(), s.values[a:b].tolist()
            batch += [(metric, labels, t, v) for t, v in zip(ts, vs, strict=True)]
        if batch:
            post_write(url, encode_write_request(batch))


def post_write(url: str, body: bytes) -> None:
    request = urllib.request.Request(
        f"{url}/api/v1/write",
        data=body,
        headers={
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        if resp.status not in (200, 204):
            raise RuntimeError(f"Prometheus refused a remote-write request: {resp.read()!r}")


# --------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(
        f"{name} not ready within {READY_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}"
    )


@contextmanager
def process(cmd: list[str], directory: Path, name: str) -> Iterator[str]:
    """Start ``cmd`` (its last ``--listen``/``--web.listen-address`` port is in the URL we
    yield), wait for ``/-/ready``, SIGTERM it afterwards."""
    port = free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    log = directory / f"{name.replace(' ', '_')}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=directory,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, name)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def prometheus_cmd(binary: str, directory: Path) -> list[str]:
    config = directory / "prometheus.yml"
    config.write_text(json.dumps({"global": {"evaluation_interval": "1m"}}))
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'prometheus-data'}",
        "--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
    ]


def serve_cmd(vault_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "metricvault.cli", "serve", "--data", str(vault_dir),
        "--listen", "127.0.0.1:{port}", "--set", "gateway_maintain=false",
    ]  # fmt: skip


def self_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = name.partition("{")[0]  # summed over label sets (2.42: type="float")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def settle_prometheus(url: str, expected: int) -> str:
    """Check every sample was appended, then wait (bounded) until the head is compacted into
    blocks as it would be in production, so no compaction runs while queries are timed."""
    m = self_metrics(url)
    appended = int(m.get("prometheus_tsdb_head_samples_appended_total", 0))
    refused = int(m.get("prometheus_tsdb_out_of_bound_samples_total", 0))
    refused += int(m.get("prometheus_tsdb_out_of_order_samples_total", 0))
    if appended != expected or refused:
        raise RuntimeError(
            f"Prometheus appended {appended:,} samples and refused {refused:,}; "
            f"{expected:,} were sent"
        )
    deadline = time.monotonic() + COMPACTION_TIMEOUT_S
    while time.monotonic() < deadline:
        m = self_metrics(url)
        span = m["prometheus_tsdb_head_max_time"] - m["prometheus_tsdb_head_min_time"]
        if span <= 3 * HOUR_MS:  # 1.5 x the 2 h block range: nothing left to compact
            break
        time.sleep(0.5)
    blocks = int(m.get("prometheus_tsdb_blocks_loaded", 0))
    return f"{appended:,} samples appended, none refused; {blocks} blocks + head"


# --------------------------------------------------------------------------- measuring
class Http:
    """GET on one keep-alive connection: the body is read (the whole answer crossed the
    wire) and kept for the agreement check, not parsed inside the timed part."""

    def __init__(self, url: str, fresh: bool = False) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.connect = partial(http.client.HTTPConnection, host, int(port), timeout=120)
        self.conn = self.connect()
        self.fresh = fresh  # a new connection per request (then closed)
        self.body = b""

    def query_range(self, expr: str, start: int, end: int, step: int) -> None:
        params = {"query": expr, "start": f"{start / 1000:.3f}", "end": f"{end / 1000:.3f}",
                  "step": f"{step / 1000:g}"}  # fmt: skip
        if self.fresh:
            self.conn.close()
            self.conn = self.connect()
        self.conn.request("GET", f"/api/v1/query_range?{urlencode(params)}")
        resp = self.conn.getresponse()
        self.body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{expr}: HTTP {resp.status}: {self.body[:300]!r}")

    def answer(self) -> Any:
        return json.loads(self.body)["data"]


def median_ms(run: Callable[[], object], runs: int) -> float:
    run()  # warm: the first run reads files and fills caches
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def agree(ours: Any, theirs: Any) -> str:
    """The compliance tester's rule: same label sets and timestamps, values within 1e-5.
    Where the series differ but every step holds the same values (topk among equal values
    picks any of them), say so rather than call it a disagreement."""

    def keyed(data: Any) -> dict[tuple[tuple[str, str], ...], list[list[Any]]]:
        return {tuple(sorted(r["metric"].items())): r["values"] for r in data["result"]}

    def per_step(data: Any) -> dict[float, list[float]]:
        steps: dict[float, list[float]] = {}
        for r in data["result"]:
            for t, v in r["values"]:
                steps.setdefault(t, []).append(float(v))
        return {t: sorted(vs) for t, vs in steps.items()}

    a, b = keyed(ours), keyed(theirs)
    same_points = a.keys() == b.keys() and all(
        [p[0] for p in a[k]] == [p[0] for p in b[k]] for k in a
    )
    if not same_points:
        pa_, pb = per_step(ours), per_step(theirs)
        if pa_.keys() == pb.keys() and all(
            np.allclose(pa_[t], pb[t], rtol=REL_TOL, atol=0, equal_nan=True) for t in pa_
        ):
            return "ties: same values each step, other series picked"
        return f"NO: {len(a)} vs {len(b)} series or other timestamps"
    worst = 0.0
    for key, points in a.items():
        for (_, x), (_, y) in zip(points, b[key], strict=True):
            fx, fy = float(x), float(y)
            if fx == fy or (math.isnan(fx) and math.isnan(fy)):
                continue
            worst = max(worst, abs(fx - fy) / max(abs(fx), abs(fy)))
    if worst > REL_TOL:
        return f"NO: rel err {worst:.1e}"
    return f"yes, {sum(len(p) for p in a.values())} points, max rel err {worst:.0e}"


def fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 nodes x 8 GPUs x 1 day, 3 runs")
    parser.add_argument("--nodes", type=int, default=13)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-prometheus", action="store_true", help="skip the peer")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.runs = 2, 3
    binary = None if args.no_prometheus else shutil.which("prometheus")
    if binary is None and not args.no_prometheus:
        print("prometheus is not installed (apt-get install -y prometheus): skipping the peer")
    # The day ends now: Prometheus's head takes only recent samples in order.
    span_ms = int(args.days * 24 * HOUR_MS)
    start_ms = (int(time.time() * 1000) - span_ms) // (INTERVAL_S * 1000) * INTERVAL_S * 1000
    spec = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days,
                       interval_s=INTERVAL_S, start_ms=start_ms)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        vault, memory, end, total = load(spec, directory)
        print(f"vault: {spec.nodes} nodes x {spec.gpus_per_node} GPUs x {spec.days} d at "
              f"{INTERVAL_S} s ({len(memory.series)} series, {total:,} samples) in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        with (
            _peer(binary, directory, memory, spec.start_ms, end, total) as prom_url,
            process(serve_cmd(directory / "vault"), directory, "metricvault serve") as mv,
        ):
            run_queries(args, vault, prom_url, mv, end)
        vault.close()


@contextmanager
def _peer(
    binary: str | None, directory: Path, memory: MemorySource, start: int, end: int, total: int
) -> Iterator[str | None]:
    if binary is None:
        yield None
        return
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    with process(prometheus_cmd(binary, directory), directory, "prometheus") as url:
        started = time.perf_counter()
        push_to_prometheus(url, memory, start, end)
        pushed = time.perf_counter() - started
        state = settle_prometheus(url, total)
        print(f"{version.stdout.splitlines()[0]}: remote-write in {pushed:.1f} s, {state}")
        yield url


def run_queries(
    args: argparse.Namespace, vault: Vault, prom_url: str | None, mv_url: str, end: int
) -> None:
    on_vault = Engine(VaultSource(vault))
    mv, mv_new = Http(mv_url), Http(mv_url, fresh=True)
    prom = Http(prom_url) if prom_url else None
    print(f"\nmedian ms of {args.runs} warm runs (HTTP on a keep-alive connection; 'new conn': "
          "a new one per request); agree: metricvault HTTP vs Prometheus HTTP")  # fmt: skip
    columns = ("Prometheus", "mv HTTP", "new conn", "mv engine", "vault.query", "series")
    print(
        f"{'query':21} {'range':>5} {'step':>5} " + " ".join(f"{c:>10}" for c in columns), " agree"
    )
    for range_ms, step_ms, window in RANGES:
        if range_ms > args.days * 24 * HOUR_MS:
            continue
        for name, template, selector in QUERIES:
            expr = template.replace("$i", window)
            query = (end - range_ms, end, step_ms)
            p_ms = median_ms(partial(prom.query_range, expr, *query), args.runs) if prom else None
            h_ms = median_ms(partial(mv.query_range, expr, *query), args.runs)
            n_ms = median_ms(partial(mv_new.query_range, expr, *query), args.runs)
            e_ms = median_ms(partial(on_vault.evaluate, expr, *query), args.runs)
            read = partial(vault.query, selector, end - range_ms, end + 1, output="arrow")
            r_ms = median_ms(read, args.runs)
            ours = mv.answer()
            same = agree(ours, prom.answer()) if prom else "-"
            cells = [
                fmt(p_ms),
                fmt(h_ms),
                fmt(n_ms),
                fmt(e_ms),
                fmt(r_ms),
                str(len(ours["result"])),
            ]
            print(f"{name:21} {range_ms // HOUR_MS:>4}h {step_ms // 1000:>4}s "
                  + " ".join(f"{c:>10}" for c in cells), f" {same}")  # fmt: skip


if __name__ == "__main__":
    main()
