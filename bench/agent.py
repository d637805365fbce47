"""Agent resource budget: RSS and CPU of `metricvault agent` beside prometheus-node-exporter.

Both run as subprocesses on 127.0.0.1 and are scraped every ``--scrape`` seconds (5) by this
script for ``--duration`` seconds (120), like Prometheus would. The agent runs with host metrics
and ``--gpus`` (8) simulated GPUs (the simulator, labelled simulated="true": this machine has no
GPU) sampled internally at ``--hz`` (10) Hz. Measured from /proc: peak and final RSS (VmHWM,
VmRSS, including what the process imports) and CPU time (utime + stime) over the measured period
after a warm-up scrape, as a percentage of one core; plus scrape latency and size.

Targets (issue 5): RSS <= 60 MB and CPU <= 3 % of one core.

    .venv/bin/python bench/agent.py              # 2 x 2 minutes, one process after the other
    .venv/bin/python bench/agent.py --quick      # 2 x 20 s
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
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass

TARGET_RSS_MB = 60.0
TARGET_CPU_PCT = 3.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    command: str
    rss_mb: float
    peak_rss_mb: float
    cpu_pct: float
    scrape_ms: float
    scrape_kb: float
    series: int
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MB
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def scrape(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read()
    return (time.perf_counter() - began) * 1000, body


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            scrape(url)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def measure(name: str, command: list[str], url: str, duration: float, every: float) -> Result:
    print(f"measuring {name}: {' '.join(command)}", file=sys.stderr)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(url, proc)
        scrape(url)  # warm-up: imports and first collection are not the steady state
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        latencies, size, body = [], 0, b""
        next_at = t0
        while time.monotonic() - t0 < duration:
            next_at += every
            time.sleep(max(0.0, next_at - time.monotonic()))
            ms, body = scrape(url)
            latencies.append(ms)
            size = len(body)
        cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
        rss, peak = proc_status(proc.pid, "VmRSS"), proc_status(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    rate = [
        line.split()[-1] for line in lines if line.startswith("metricvault_agent_sample_rate_hz")
    ]
    note = f"sampling at {float(rate[0]):g} Hz at the end" if rate else ""
    series = len(lines)
    latencies.sort()
    return Result(
        name,
        " ".join(Path(c).name if i == 0 else c for i, c in enumerate(command)),
        rss,
        peak,
        cpu,
        latencies[len(latencies) // 2],
        size / 1024,
        series,
        note,
    )


IMPORTS = (  # what the agent's memory is made of, and what it avoids
    ("the interpreter alone", "sys"),
    ("prometheus-client (loads ssl)", "prometheus_client.exposition"),
    ("numpy (simulated GPUs)", "numpy"),
    ("psutil (host metrics)", "psutil"),
    ("the agent's modules, all of the above", "metricvault.collect.cli, metricvault.collect.agent, "
     "metricvault.collect.sources.host, metricvault.collect.sources.simulated, "
     "metricvault.collect.exposition"),
    ("not loaded by the agent: typer + rich", "typer, rich.console, rich.table"),
    ("not loaded by the agent: the store (pyarrow, DuckDB, pandas)", "metricvault.store.vault"),
)  # fmt: skip


def import_costs() -> list[tuple[str, float]]:
    """RSS (MB) of a fresh interpreter after each import, one process per line."""
    costs = []
    for label, modules in IMPORTS:
        code = (
            f"import {modules}\n"
            "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        costs.append((label, int(out.stdout.strip()) / 1024))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--scrape", type=float, default=5.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="20 s per process")
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.duration
    agent_bin = Path(sys.executable).with_name("metricvault")
    results = []
    with tempfile.TemporaryDirectory() as state:
        port = free_port()
        agent = [
            str(agent_bin),
            "agent",
            "--listen",
            f"127.0.0.1:{port}",
            "--simulate-gpus",
            str(args.gpus),
            "--sample-hz",
            str(args.hz),
            "--state-dir",
            state,
        ]
        results.append(
            measure(
                "metricvault agent",
                agent,
                f"http://127.0.0.1:{port}/metrics",
                duration,
                args.scrape,
            )
        )
    exporter = shutil.which("prometheus-node-exporter")
    if exporter is None:
        print(
            "prometheus-node-exporter not installed (apt-get install prometheus-node-exporter):"
            " peer skipped",
            file=sys.stderr,
        )
    else:
        port = free_port()
        command = [exporter, f"--web.listen-address=127.0.0.1:{port}"]
        results.append(
            measure(
                "prometheus-node-exporter",
                command,
                f"http://127.0.0.1:{port}/metrics",
                duration,
                args.scrape,
            )
        )
    report(results, args, duration)
    print("\n| imported in a fresh interpreter | RSS MB |\n|---|---:|")
    for label, mb in import_costs():
        print(f"| {label} | {mb:.1f} |")


def report(results: list[Result], args: argparse.Namespace, duration: float) -> None:
    print(
        f"\n{duration:.0f} s per process, scraped every {args.scrape:g} s; agent: host metrics + "
        f"{args.gpus} simulated GPUs sampled at {args.hz:g} Hz; {os.cpu_count()} cores; load "
        f"average at the end {os.getloadavg()[0]:.2f} (the agent samples slower above 0.9 per "
        "CPU)\n"
    )
    print(
        "| process | RSS MB (steady) | peak RSS MB (start-up) | CPU % of a core | scrape p50 ms "
        "| scrape KB | series | note |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r.name} | {r.rss_mb:.1f} | {r.peak_rss_mb:.1f} | {r.cpu_pct:.2f} | "
            f"{r.scrape_ms:.1f} | {r.scrape_kb:.1f} | {r.series} | {r.note} |"
        )
    agent = results[0]
    rss_ok = agent.rss_mb <= TARGET_RSS_MB
    cpu_ok = agent.cpu_pct <= TARGET_CPU_PCT
    print(
        f"\ntarget RSS <= {TARGET_RSS_MB:g} MB (steady state, after the measured period): "
        f"{'PASS' if rss_ok else 'MISS'} ({agent.rss_mb:.1f}; peak during start-up "
        f"{agent.peak_rss_mb:.1f}); CPU <= {TARGET_CPU_PCT:g} %: "
        f"{'PASS' if cpu_ok else 'MISS'} ({agent.cpu_pct:.2f})"
    )
    print(
        f"command: .venv/bin/python bench/agent.py --duration {duration:g} --scrape "
        f"{args.scrape:g} --gpus {args.gpus} --hz {args.hz:g}"
    )


if __name__ == "__main__":
    main()
