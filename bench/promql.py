"""PromQL dashboard queries: Prometheus, VictoriaMetrics and metricvault on the same samples.

    .venv/bin/python bench/promql.py --quick          # 2 nodes x 8 GPUs x 1 day at 15 s, ~1 min
    .venv/bin/python bench/promql.py                  # 13 x 8 GPUs: 7 d at 15 s, 30 d at 60 s
    .venv/bin/python bench/promql.py --workloads 7d --nodes 4 --runs 3

Each workload (the simulated cluster's GPU utilisation and energy counter, plus a simulated
latency histogram, ending at the run's start) goes into a fresh vault, which is then
maintained (``vault.maintain``: compaction, the 1m/1h rollup tiers) as in production; through
its remote-write receiver into a fresh Prometheus 2.42 (Debian's ``prometheus``; in time
order, 30 minutes per request, so no sample is out of order or older than its head accepts;
the load is checked against Prometheus's own appended-samples counter, and the head is left to
compact into blocks); and through ``/api/v1/import`` into a fresh VictoriaMetrics 1.79
(Debian's ``victoria-metrics``, started by ``bench/peers.py``; flushed and force-merged). Then
``metricvault serve`` is started over the vault. For each query at Grafana's step for the range
it reports the median of ``--runs`` warm runs (after one unmeasured run) of:

- Prometheus, VictoriaMetrics and metricvault ``GET /api/v1/query_range`` (one keep-alive
  connection each, the body read, not parsed); VictoriaMetrics both as a dashboard gets it
  (its rollup-result cache on) and with ``nocache=1``;
- the engine in this process (``Engine(vault)``, what the HTTP API runs, without HTTP/JSON),
  and the same engine over the old long-shape read (``vault.query``), before/after;
- the raw reads of the selector over the range: ``vault.select_series`` (what the vault's
  ``select`` reads) and ``vault.query(..., output="arrow")`` (the long shape);

with the number of series answered, whether metricvault's and VictoriaMetrics's answers agree
with Prometheus's (same label sets and timestamps, values within a relative 1e-5, NaN equals
NaN: the rule of Prometheus's compliance tester), and issue 13's latency target (on ranges of
24 h and more: metricvault HTTP <= VictoriaMetrics and >= 10x faster than Prometheus; on 1 h:
<= 2x Prometheus) as met or missed. A peer that is not installed (``apt-get install -y
prometheus victoria-metrics``) is skipped with a message, its columns left empty.
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
import http.client
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlencode

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.ingest import SAMPLE_RECORD_BYTES, _label_bytes, _sample_records, _varint
from bench.peers import VM_INSTALL_HINT, VictoriaMetrics, find_victoria_metrics
from bench.peers import victoria_metrics_version as vm_version
from metricvault import compiled
from metricvault.promql import Engine, MemorySource, SeriesSamples, tiers
from metricvault.selector import Matcher, Selector
from metricvault.sim import ClusterSpec, generate
from metricvault.store.vault import Vault

METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
PUSH_WINDOW_MS = HOUR_MS // 2  # one remote-write request per 30 simulated minutes
READY_TIMEOUT_S = 120.0  # the shared 2-core machine can be loaded
COMPACTION_TIMEOUT_S = 120.0
REL_TOL = 1e-5

# A clearly simulated latency histogram (the GPU simulator has none): 8 inference servers, 12
# cumulative buckets each (11 bounds and +Inf), requests per scrape drawn from a Poisson law
# with a daily cycle, latencies log-normal, a slow regime 5 % of the time.
HISTOGRAM = "simulated_inference_request_duration_seconds_bucket"
HIST_SERVERS = 8
HIST_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# (name, PromQL: $i is Grafana's $__interval, $r the rate window, the selector it reads)
QUERIES = (
    ("per-GPU avg util", "avg_over_time(DCGM_FI_DEV_GPU_UTIL[$i])", "DCGM_FI_DEV_GPU_UTIL"),
    (
        "energy rate per host",
        "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$r]))",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ),
    (
        "p99 latency (sim. hist.)",
        f"histogram_quantile(0.99, sum by (le) (rate({HISTOGRAM}[5m])))",
        HISTOGRAM,
    ),
    ("top 5 GPUs", "topk(5, avg_over_time(DCGM_FI_DEV_GPU_UTIL[$i]))", "DCGM_FI_DEV_GPU_UTIL"),
    (
        "one GPU",
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node01", gpu="0"}',
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node01", gpu="0"}',
    ),
)


@dataclass(frozen=True)
class Workload:
    name: str
    days: float
    interval_s: int
    ranges_ms: tuple[int, ...]


# Scrape intervals chosen so that loading three systems stays bounded on a 2-core machine:
# 7 days at 15 s (Prometheus's default) and 30 days at 60 s.
WORKLOADS = {
    "7d": Workload("7 d at 15 s", 7, 15, (HOUR_MS, DAY_MS, 7 * DAY_MS)),
    "30d": Workload("30 d at 60 s", 30, 60, (7 * DAY_MS, 30 * DAY_MS)),
}
QUICK = Workload("1 d at 15 s", 1, 15, (HOUR_MS, DAY_MS))


# --------------------------------------------------------------------------- Grafana's step
# Grafana's interval for a panel: rangeutil.calculateInterval() in
# packages/grafana-data/src/datetime/rangeutil.ts rounds range / max data points to a "nice"
# interval (roundInterval(), the table below: (upper bound, interval) in ms), then raises it to
# the data source's min interval (the Prometheus data source's "scrape interval" setting, which
# is the scrape interval); the Prometheus data source sends that as ``step`` and as
# $__interval, and aligns start and end to multiples of the step (its default "align").
MAX_DATA_POINTS = 1000  # a panel about 1000 px wide: Grafana's max data points = its width
_ROUND_INTERVAL = (
    (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
    (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000),
    (45000, 30000), (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000),
    (1050000, 900000), (1500000, 1200000), (2700000, 1800000), (5400000, 3600000),
    (9000000, 7200000), (16200000, 10800000), (32400000, 21600000), (86400000, 43200000),
    (604800000, 86400000), (1209600000, 604800000), (2419200000, 1209600000),
    (3024000000, 2592000000),
)  # fmt: skip


def round_interval(ms: float) -> int:
    for bound, nice in _ROUND_INTERVAL:
        if ms < bound:
            return nice
    return 31_536_000_000


def grafana_step(range_ms: int, scrape_ms: int) -> int:
    return max(round_interval(range_ms / MAX_DATA_POINTS), scrape_ms)


def rate_window(step_ms: int, scrape_ms: int) -> int:
    """``$__interval``, but at least 4 scrapes where it holds too few samples for rate():
    the floor Grafana's ``$__rate_interval`` puts on it (1 h at 15 s: 1m, not 15s)."""
    return max(step_ms, 4 * scrape_ms)


def duration(ms: int) -> str:
    for unit, size in (("d", DAY_MS), ("h", HOUR_MS), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# --------------------------------------------------------------------------- data
def histogram_table(start_ms: int, end_ms: int, interval_s: int, seed: int) -> pa.Table:
    """The simulated histogram family in the long shape (one series per server and ``le``)."""
    rng = np.random.default_rng(seed)
    step = interval_s * 1000
    ts = np.arange(start_ms, end_ms, step, dtype=np.int64)
    upper = np.log(np.asarray(HIST_BOUNDS))
    parts = []
    for server in range(HIST_SERVERS):
        load = 1 + 0.6 * np.sin(2 * np.pi * (ts % DAY_MS) / DAY_MS + server)
        n = rng.poisson(5.0 * (1 + server / 4) * interval_s * load)
        slow = rng.random(ts.size) < 0.05
        counts = np.zeros((ts.size, len(HIST_BOUNDS) + 1), np.int64)
        for is_slow, mu in ((False, np.log(0.06)), (True, np.log(0.9))):
            cdf = np.array([0.5 * (1 + math.erf((u - mu) / (0.7 * math.sqrt(2)))) for u in upper])
            probs = np.diff(np.concatenate(([0.0], cdf, [1.0])))
            rows = slow == is_slow
            counts[rows] = rng.multinomial(n[rows], probs)
        cumulative = np.cumsum(np.cumsum(counts, axis=1), axis=0).astype(np.float64)
        for b, le in enumerate([*(f"{x:g}" for x in HIST_BOUNDS), "+Inf"]):
            parts.append((f"inference-{server:02d}:8000", le, cumulative[:, b]))
    size = ts.size
    return pa.table(
        {
            "metric": pa.array([HISTOGRAM] * (size * len(parts)), pa.string()),
            "timestamp": pa.array(np.tile(ts, len(parts))),
            "value": pa.array(np.concatenate([p[2] for p in parts])),
            "instance": pa.array(np.repeat([p[0] for p in parts], size)),
            "job": pa.array(["inference"] * (size * len(parts)), pa.string()),
            "le": pa.array(np.repeat([p[1] for p in parts], size)),
            "simulated": pa.array(["true"] * (size * len(parts)), pa.string()),
        }
    )


def tables(spec: ClusterSpec) -> Iterator[pa.Table]:
    """The benchmark's samples: the two GPU metrics of the simulator, then the histogram."""
    end = spec.start_ms + int(spec.days * DAY_MS)
    for table in generate(spec):
        yield table.filter(pc.is_in(table["metric"], pa.array(METRICS)))
    yield histogram_table(spec.start_ms, end, spec.interval_s, spec.seed)


def to_memory(table: pa.Table, memory: dict[tuple[tuple[str, str], ...], list[Any]]) -> None:
    """Group a long table's rows by series into ``memory`` (label set -> [ts..], [values..])."""
    labels = [c for c in table.column_names if c not in ("metric", "timestamp", "value")]
    keys = ["metric", *labels]
    table = table.append_column("row", pa.array(np.arange(table.num_rows)))
    grouped = table.group_by(keys, use_threads=False).aggregate([("row", "list")])
    ts, values = table["timestamp"].to_numpy(), table["value"].to_numpy()
    rows_of = grouped["row_list"].to_pylist()
    for row, rows in zip(grouped.select(keys).to_pylist(), rows_of, strict=True):
        key = [("__name__", row["metric"])]
        key += [(k, row[k]) for k in labels if row[k] not in (None, "")]
        entry = memory.setdefault(tuple(sorted(key)), [[], []])
        entry[0].append(ts[rows])
        entry[1].append(values[rows])


def memory_source(memory: dict[tuple[tuple[str, str], ...], list[Any]]) -> MemorySource:
    source = MemorySource()
    for key, (ts, values) in memory.items():
        source.add(dict(key), np.concatenate(ts), np.concatenate(values))
    return source


# --------------------------------------------------------------------------- Prometheus
def push_to_prometheus(url: str, memory: MemorySource, start: int, end: int) -> None:
    """Every sample, oldest first, all series in each request: Prometheus 2.42 refuses a
    sample more than an hour older than its head's newest (out of bounds), so a request
    never reaches back behind the one before it. The WriteRequests are put together from
    pre-encoded pieces (bench/ingest.py's encoder), not one protobuf object per sample."""
    heads = [_label_bytes(sorted(s.labels.items())) for s in memory.series]
    records = [_sample_records(s.ts, s.values) for s in memory.series]
    for lo in range(start, end + 1, PUSH_WINDOW_MS):
        parts: list[bytes] = []
        for s, head, rec in zip(memory.series, heads, records, strict=True):
            a, b = np.searchsorted(s.ts, [lo, lo + PUSH_WINDOW_MS]).tolist()
            if b > a:
                parts.append(b"\x0a" + _varint(len(head) + SAMPLE_RECORD_BYTES * (b - a)) + head)
                parts.append(rec[a:b].tobytes())
        if parts:
            post_write(url, bytes(cramjam.snappy.compress_raw(b"".join(parts))))


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
    with urllib.request.urlopen(request, timeout=120) as resp:
        if resp.status not in (200, 204):
            raise RuntimeError(f"Prometheus refused a remote-write request: {resp.read()!r}")


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
    """Start ``cmd`` (``{port}`` in it is a free port, the one in the URL we yield), wait for
    ``/-/ready``, SIGTERM it afterwards (by its PID)."""
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
        "--storage.tsdb.retention.time=3650d",  # the default 15d would drop the 30-day data
        "--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
    ]


def serve_cmd(vault_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "metricvault.cli", "serve", "--data", str(vault_dir),
        "--listen", "127.0.0.1:{port}", "--set", "gateway_maintain=false",
        "--set", "retention_raw=forever",
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
    blocks and the block count stays put, so no compaction runs while queries are timed."""
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
    seen, stable = -1.0, 0
    while time.monotonic() < deadline and stable < 6:
        m = self_metrics(url)
        span = m["prometheus_tsdb_head_max_time"] - m["prometheus_tsdb_head_min_time"]
        blocks = m.get("prometheus_tsdb_blocks_loaded", 0) + m.get(
            "prometheus_tsdb_compactions_total", 0
        )
        stable = stable + 1 if span <= 3 * HOUR_MS and blocks == seen else 0
        seen = blocks
        time.sleep(0.5)
    blocks = int(m.get("prometheus_tsdb_blocks_loaded", 0))
    return f"{appended:,} samples appended, none refused; {blocks} blocks + head"


# --------------------------------------------------------------------------- measuring
class Http:
    """GET on one keep-alive connection: the body is read (the whole answer crossed the
    wire) and kept for the agreement check, not parsed inside the timed part."""

    def __init__(self, url: str, extra: dict[str, str] | None = None) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.connect = partial(http.client.HTTPConnection, host, int(port), timeout=300)
        self.conn = self.connect()
        self.extra = extra or {}
        self.body = b""

    def query_range(self, expr: str, start: int, end: int, step: int) -> None:
        params = {"query": expr, "start": f"{start / 1000:.3f}", "end": f"{end / 1000:.3f}",
                  "step": f"{step / 1000:g}", **self.extra}  # fmt: skip
        path = f"/api/v1/query_range?{urlencode(params)}"
        try:
            self.conn.request("GET", path)
            resp = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            # VictoriaMetrics closes a keep-alive connection idle for a minute (while the
            # slow columns run): reconnect once, as any client would
            self.conn.close()
            self.conn = self.connect()
            self.conn.request("GET", path)
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
    if not a and not b:
        return "both empty"
    same_points = a.keys() == b.keys() and all(
        [p[0] for p in a[k]] == [p[0] for p in b[k]] for k in a
    )
    if not same_points:
        pa_, pb = per_step(ours), per_step(theirs)
        if pa_.keys() == pb.keys() and all(
            len(pa_[t]) == len(pb[t])
            and np.allclose(pa_[t], pb[t], rtol=REL_TOL, atol=0, equal_nan=True)
            for t in pa_
        ):
            return "ties: same values each step, other series picked"
        counts = sum(len(p) for p in a.values()), sum(len(p) for p in b.values())
        return f"NO: {len(a)} vs {len(b)} series, {counts[0]} vs {counts[1]} points"
    worst, points = 0.0, 0
    for key, ps in a.items():
        for (_, x), (_, y) in zip(ps, b[key], strict=True):
            points += 1
            fx, fy = float(x), float(y)
            if fx == fy or (math.isnan(fx) and math.isnan(fy)):
                continue
            worst = max(worst, abs(fx - fy) / max(abs(fx), abs(fy)))
    if worst > REL_TOL:
        return f"NO: rel. error {worst:.1e}"
    return f"yes ({points:,} points, max rel. error {worst:.0e})"


def target(
    range_ms: int,
    mv: float,
    prom: float | None,
    vm: float | None,
    mv_nocache: float | None = None,
    vm_nocache: float | None = None,
) -> str:
    """The latency target for the range, on metricvault's HTTP answer: on 1 h <= 2x
    Prometheus; on 24 h and more, cache on (a dashboard's repeat) <= VictoriaMetrics's with its
    cache on, and with ``nocache=1`` on both <= 2x VictoriaMetrics's."""
    missed = []
    if range_ms <= HOUR_MS:
        if prom is None:
            return "- (no Prometheus)"
        goal = "<= 2x Prometheus"
        if mv > 2 * prom:
            missed.append(f"{mv / prom:.1f}x Prometheus")
    else:
        if vm is None:
            return "- (no VictoriaMetrics)"
        goal = "cached <= VM, nocache <= 2x VM nocache"
        if mv > vm:
            missed.append(f"cached {mv / vm:.1f}x VM")
        if mv_nocache is not None and vm_nocache is not None and mv_nocache > 2 * vm_nocache:
            missed.append(f"nocache {mv_nocache / vm_nocache:.1f}x VM nocache")
    return f"missed ({goal}): {', '.join(missed)}" if missed else f"met ({goal})"


def _http_ms(
    client: Http | None, expr: str, query: tuple[int, int, int], runs: int
) -> float | None:
    return None if client is None else median_ms(partial(client.query_range, expr, *query), runs)


def _refresh_ms(
    client: Http | None, expr: str, query: tuple[int, int, int], runs: int
) -> float | None:
    """A dashboard refresh: the same query with its range moved forward by one step per run
    (a result cache reuses the older steps and evaluates the newest)."""
    if client is None:
        return None
    start, end, step = query
    shift = itertools.count(1)

    def refresh() -> None:
        k = next(shift) * step
        client.query_range(expr, start + k, end + k, step)

    return median_ms(refresh, runs)


def fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


class LongShapeSource:
    """The vault's read seam with its raw reads through the long shape (``vault.query``: a row
    per sample with its label columns, split back into series), the rollup reads passed
    through: the path before the typed read, for the before/after column."""

    def __init__(self, vault: Vault) -> None:
        self._vault = vault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._vault, name)  # select_buckets, horizons, samples_per_row, ...

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: Any = None
    ) -> list[SeriesSamples]:
        selector = str(Selector(tuple(matchers)))
        long = self._vault.query(selector, start_ms, end_ms + 1, output="arrow", stale_markers=True)
        return split_long(long)

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        return self.select(matchers, start_ms, end_ms)


def split_long(table: pa.Table) -> list[SeriesSamples]:
    """A long-shape table (rows by series, then time) back into one series per run of equal
    metric and labels."""
    rows = table.num_rows
    if rows == 0:
        return []
    names = [c for c in table.column_names if c not in ("timestamp", "value")]
    cells = {c: table[c].to_numpy(zero_copy_only=False) for c in names}
    change = np.zeros(rows, dtype=bool)
    change[0] = True
    for column in cells.values():
        change[1:] |= column[1:] != column[:-1]
    starts = [*np.flatnonzero(change).tolist(), rows]
    ts = table["timestamp"].cast(pa.int64()).to_numpy()
    values = np.asarray(table["value"].to_numpy(), dtype=np.float64)
    out = []
    for lo, hi in itertools.pairwise(starts):
        labels = {("__name__" if c == "metric" else c): cells[c][lo] for c in names}
        labels = {k: v for k, v in labels.items() if v}
        out.append(SeriesSamples(labels, ts[lo:hi], values[lo:hi]))
    return out


# --------------------------------------------------------------------------- the run
def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 nodes x 8 GPUs x 1 day, 3 runs")
    parser.add_argument("--workloads", default="7d,30d", help="comma-separated: 7d, 30d")
    parser.add_argument("--nodes", type=int, default=13)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--runs", type=int, default=None, help="warm runs per cell (5; --quick 3)")
    parser.add_argument("--no-prometheus", action="store_true", help="skip Prometheus")
    parser.add_argument("--no-vm", action="store_true", help="skip VictoriaMetrics")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.runs = 2, args.runs or 3
        workloads = [QUICK]
    else:
        args.runs = args.runs or 5
        workloads = [WORKLOADS[w.strip()] for w in args.workloads.split(",")]
    prom_binary = None if args.no_prometheus else shutil.which("prometheus")
    if prom_binary is None and not args.no_prometheus:
        print("prometheus is not installed (apt-get install -y prometheus): skipping that peer")
    vm_binary = None if args.no_vm else find_victoria_metrics()
    if vm_binary is None and not args.no_vm:
        print(VM_INSTALL_HINT)
    for workload in workloads:
        run_workload(args, workload, prom_binary, vm_binary)


def run_workload(
    args: argparse.Namespace, workload: Workload, prom_binary: str | None, vm_binary: str | None
) -> None:
    interval_ms = workload.interval_s * 1000
    # The data ends now: Prometheus's head takes only recent samples in order.
    span_ms = int(workload.days * DAY_MS)
    start_ms = (int(time.time() * 1000) - span_ms) // interval_ms * interval_ms
    spec = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=workload.days,
                       interval_s=workload.interval_s, start_ms=start_ms)  # fmt: skip
    print(f"\n## {args.nodes} nodes x {args.gpus_per_node} GPUs, {workload.name}")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        directory = Path(tmp)
        vault = Vault.open_local(str(directory / "vault"), retention_raw="forever")
        stack.callback(vault.close)
        vm = stack.enter_context(VictoriaMetrics(vm_binary, directory)) if vm_binary else None
        started = time.perf_counter()
        memory: dict[tuple[tuple[str, str], ...], list[Any]] = {}
        end, total, vm_s = 0, 0, 0.0
        for table in tables(spec):
            vault.write(table)
            to_memory(table, memory)
            end = max(end, int(pc.max(table["timestamp"]).as_py()))
            total += table.num_rows
            if vm is not None:
                vm_s += sum(vm.ingest(table))
        vault.flush()
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        report = vault.maintain(now_ms=end + HOUR_MS)
        tiers = _tier_rows(vault)
        print(f"vault: {len(memory)} series, {total:,} samples, loaded in {loaded:.0f} s "
              f"(VictoriaMetrics import {vm_s:.0f} s of it); maintain in "
              f"{time.perf_counter() - started:.0f} s ({report['rolled_up_hours']} hours rolled "
              f"up; rows per tier {tiers})")  # fmt: skip
        source = memory_source(memory)
        memory.clear()
        if vm is not None:
            # idle through the maintenance (minutes on a loaded machine): VictoriaMetrics
            # has closed that keep-alive connection
            vm._reset_connection()
            vm.force_flush()
            merged = vm.force_merge_and_wait()
            print(f"VictoriaMetrics {vm_version()}: {vm.series_count()} series, "
                  f"force-merged in {merged:.0f} s")  # fmt: skip
        prom_url = None
        if prom_binary is not None:
            prom_url = stack.enter_context(
                _prometheus(prom_binary, directory, source, spec.start_ms, end, total)
            )
        del source
        mv_url = stack.enter_context(
            process(serve_cmd(directory / "vault"), directory, "metricvault serve")
        )
        vm_url = f"http://127.0.0.1:{vm.port}" if vm is not None else None
        run_queries(args, workload, vault, prom_url, vm_url, mv_url, end)


def _tier_rows(vault: Vault) -> dict[str, int]:
    rows: dict[str, int] = {}
    for f in vault.catalog_version().files:
        rows[f.tier] = rows.get(f.tier, 0) + f.rows
    return rows


@contextmanager
def _prometheus(
    binary: str, directory: Path, memory: MemorySource, start: int, end: int, total: int
) -> Iterator[str]:
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    with process(prometheus_cmd(binary, directory), directory, "prometheus") as url:
        started = time.perf_counter()
        push_to_prometheus(url, memory, start, end)
        pushed = time.perf_counter() - started
        state = settle_prometheus(url, total)
        print(f"{version.stdout.splitlines()[0]}: remote-write in {pushed:.0f} s, {state}")
        yield url


def run_queries(
    args: argparse.Namespace,
    workload: Workload,
    vault: Vault,
    prom_url: str | None,
    vm_url: str | None,
    mv_url: str,
    data_end: int,
) -> None:
    # the compiled rollup-row kernel loaded in this process (as in `metricvault serve`, which
    # loads its own at start: from numba's cache, which this call fills, in about a second)
    compiled.start(tiers.KERNEL, wait=True)
    engine = Engine(vault)
    engine_long = Engine(LongShapeSource(vault))
    mv = Http(mv_url)
    prom = Http(prom_url) if prom_url else None
    vm = Http(vm_url) if vm_url else None
    vm_nocache = Http(vm_url, {"nocache": "1"}) if vm_url else None
    mv_nocache = Http(mv_url, {"nocache": "1"})
    scrape_ms = workload.interval_s * 1000
    print(f"\nmedian of {args.runs} warm runs; agreement with Prometheus's answer; targets on "
          f"metricvault HTTP; load average {os.getloadavg()[0]:.2f} (2 cores)\n")  # fmt: skip
    head = ("query", "range, step", "Prometheus", "VM", "VM nocache", "VM refresh", "mv HTTP",
            "mv nocache", "mv refresh", "mv engine", "engine (long read)", "select_series",
            "vault.query", "series", "mv agrees", "VM agrees", "target")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for range_ms, step, queries in _panels(workload, scrape_ms):
        end = data_end // step * step  # Grafana aligns the range to the step
        start = end - range_ms
        for name, template, selector in queries:
            expr = template.replace("$i", duration(step))
            expr = expr.replace("$r", duration(rate_window(step, scrape_ms)))
            query = (start, end, step)
            timed = partial(_http_ms, expr=expr, query=query, runs=args.runs)
            p_ms, v_ms, vn_ms, h_ms = timed(prom), timed(vm), timed(vm_nocache), timed(mv)
            hn_ms = timed(mv_nocache)
            # the answers of the repeated (cached) requests, before the refreshes move them
            ours, fresh = mv.answer(), mv_nocache.answer()
            theirs = prom.answer() if prom else None
            vm_answer = vm.answer() if vm else None
            refresh = partial(_refresh_ms, expr=expr, query=query, runs=args.runs)
            vr_ms, hr_ms = refresh(vm), refresh(mv)
            e_ms = median_ms(partial(engine.evaluate, expr, *query), args.runs)
            el_ms = median_ms(partial(engine_long.evaluate, expr, *query), args.runs)
            select = getattr(vault, "select_series", None)
            s_ms = (
                median_ms(partial(select, selector, start, end + 1), args.runs)
                if select is not None
                else None
            )
            read = partial(vault.query, selector, start, end + 1, output="arrow")
            r_ms = median_ms(read, args.runs)
            same = agree(ours, theirs) if theirs is not None else "-"
            if ours != fresh:
                same += "; NO: the cached answer differs from nocache=1's"
            vm_same = agree(vm_answer, theirs) if vm_answer is not None and theirs else "-"
            assert h_ms is not None
            cells = [f"`{expr}`" if name != "one GPU" else "one GPU's `DCGM_FI_DEV_GPU_UTIL`",
                     f"{duration(range_ms)}, {duration(step)}", fmt(p_ms), fmt(v_ms), fmt(vn_ms),
                     fmt(vr_ms), fmt(h_ms), fmt(hn_ms), fmt(hr_ms), fmt(e_ms), fmt(el_ms),
                     fmt(s_ms), fmt(r_ms), str(len(ours["result"])), same, vm_same,
                     target(range_ms, h_ms, p_ms, v_ms, hn_ms, vn_ms)]  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)


def _panels(workload: Workload, scrape_ms: int) -> list[tuple[int, int, tuple[Any, ...]]]:
    """(range, step, queries): Grafana's step for each range, and on 7 d and longer also the
    per-GPU and per-host panels at a 1 h step (a panel's "Min interval" set to 1h), which
    the 1h rollup tier answers (docs/grafana.md)."""
    panels: list[tuple[int, int, tuple[Any, ...]]] = []
    for range_ms in workload.ranges_ms:
        panels.append((range_ms, grafana_step(range_ms, scrape_ms), QUERIES))
        if range_ms >= 7 * DAY_MS:
            panels.append((range_ms, HOUR_MS, QUERIES[:2]))
    return panels


if __name__ == "__main__":
    main()
