"""Agent resource budget: RSS and CPU of `metricvault agent` (full and --profile edge) beside
prometheus-node-exporter, all three in the same run, side by side.

The three run at once as subprocesses on 127.0.0.1 for ``--duration`` seconds (300; 120 with
``--quick``) after a warm-up:

- the full agent, with host metrics and ``--gpus`` (8) simulated GPUs sampled internally at
  ``--hz`` (10) Hz, scraped every ``--scrape`` seconds (5) by this script as Prometheus would;
- the edge agent (``--profile edge``), the same host metrics and simulated GPUs (its numpy-free
  simulator) collected every ``--edge-interval`` seconds (10) and pushed every 30 s to a
  receiver in this script (it answers 204 like a gateway and counts what arrives);
- prometheus-node-exporter (host metrics only), scraped like the full agent.

Measured from /proc: RSS at the end (steady state) and the highest RSS seen during the measured
period (VmRSS, shared libraries included, sampled every second), PSS at the end (shared pages
divided among the processes mapping them), CPU time (utime + stime) over the measured period
as a percentage of one core. Then, one fresh interpreter per line, the RSS of the interpreter
itself and of what each import adds (the floor under any Python agent).

Targets: full agent (issue 5) RSS <= 60 MB, CPU <= 3 % of a core; edge agent (issue 14) RSS
<= 25 MB, CPU <= 1 % of a core at 10 s sampling.

    .venv/bin/python bench/agent.py              # 300 s measured
    .venv/bin/python bench/agent.py --quick      # 120 s measured (under 3 min in all)
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
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TARGETS = {  # process name -> (RSS MB, CPU % of a core)
    "metricvault agent": (60.0, 3.0),
    "metricvault agent --profile edge": (25.0, 1.0),
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARMUP_S = 15.0  # imports, the simulator's warm-up hour, the first push


@dataclass
class Process:
    """One measured process: how to start it, and what was seen of it."""

    name: str
    command: list[str]
    url: str = ""  # scraped (empty: the edge agent, which serves nothing)
    proc: subprocess.Popen[bytes] | None = None
    cpu0: float = 0.0
    peak_rss_mb: float = 0.0
    latencies: list[float] = field(default_factory=list)
    body: bytes = b""


@dataclass
class Result:
    name: str
    command: str
    rss_mb: float
    peak_rss_mb: float
    pss_mb: float
    cpu_pct: float
    scrape_ms: float | None
    scrape_kb: float | None
    series: int | None
    note: str = ""


class Receiver:
    """A remote-write receiver for the edge agent: answers 204 and counts requests and bytes
    (and GET /-/healthy with the server-time header, for the agent's clock check)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                receiver.requests += 1
                receiver.bytes += length
                self.send_response(204)
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("X-Metricvault-Server-Time-Ms", str(time.time_ns() // 10**6))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int, name: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) / 1024  # kB -> MB
    return float("nan")


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def scrape(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read()
    return (time.perf_counter() - began) * 1000, body


def wait_up(p: Process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    assert p.proc is not None
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise SystemExit(f"{p.name}: the process exited with {p.proc.returncode}")
        if not p.url:
            return
        try:
            scrape(p.url)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{p.url} did not answer within {timeout} s")


def measure(processes: list[Process], duration: float, every: float) -> list[Result]:
    """Run every process at once; scrape those with a URL every ``every`` s; sample RSS every
    second; read CPU time over the measured period."""
    for p in processes:
        print(f"starting {p.name}: {' '.join(p.command)}", file=sys.stderr)
        p.proc = subprocess.Popen(p.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for p in processes:
            wait_up(p)
        time.sleep(WARMUP_S)
        for p in processes:
            if p.url:
                scrape(p.url)  # warm-up: the first collection is not the steady state
        t0 = time.monotonic()
        for p in processes:
            assert p.proc is not None
            p.cpu0 = cpu_seconds(p.proc.pid)
        next_scrape = t0
        while (now := time.monotonic()) - t0 < duration:
            for p in processes:
                assert p.proc is not None
                if p.proc.poll() is not None:
                    raise SystemExit(f"{p.name} exited with {p.proc.returncode}")
                p.peak_rss_mb = max(p.peak_rss_mb, proc_status(p.proc.pid, "VmRSS"))
            if now >= next_scrape:
                next_scrape += every
                for p in processes:
                    if p.url:
                        ms, p.body = scrape(p.url)
                        p.latencies.append(ms)
            time.sleep(min(1.0, max(0.0, next_scrape - time.monotonic())))
        elapsed = time.monotonic() - t0
        return [result(p, elapsed) for p in processes]
    finally:
        for p in processes:
            if p.proc is not None:
                p.proc.terminate()
                try:
                    p.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.proc.kill()


def result(p: Process, elapsed: float) -> Result:
    assert p.proc is not None
    pid = p.proc.pid
    cpu = (cpu_seconds(pid) - p.cpu0) / elapsed * 100
    rss = proc_status(pid, "VmRSS")
    command = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(p.command))
    if not p.url:
        return Result(p.name, command, rss, max(p.peak_rss_mb, rss), pss_mb(pid), cpu,
                      None, None, None)  # fmt: skip
    lines = [line for line in p.body.decode().splitlines() if line and not line.startswith("#")]
    rate = [
        line.split()[-1] for line in lines if line.startswith("metricvault_agent_sample_rate_hz")
    ]
    note = f"sampling at {float(rate[0]):g} Hz at the end" if rate else ""
    p.latencies.sort()
    return Result(
        p.name, command, rss, max(p.peak_rss_mb, rss), pss_mb(pid), cpu,
        p.latencies[len(p.latencies) // 2], len(p.body) / 1024, len(lines), note,
    )  # fmt: skip


FLOOR = (  # (what, python -c code): the interpreter's own floor, measured from outside
    ("python -c 'import time; time.sleep(5)'", "import time; time.sleep(5)"),
    ("... with prometheus_client imported", "import prometheus_client, time; time.sleep(5)"),
    ("... with google.protobuf.message imported (upb loads with a class)",
     "import google.protobuf.message, time; "
     "time.sleep(5)"),
    ("... with the remote-write message classes built (protobuf)",
     "import metricvault.wire.proto.messages, time; time.sleep(5)"),
)  # fmt: skip

IMPORTS = (  # what the agents' memory is made of, and what they avoid
    ("the interpreter alone", "sys"),
    ("import metricvault (the package, lazy)", "metricvault"),
    ("http.client without ssl (the edge agent over http)",
     "sys; sys.modules['ssl'] = None; import http.client"),
    ("ssl (libssl + libcrypto)", "ssl"),
    ("psutil (host metrics)", "psutil"),
    ("cramjam (snappy)", "cramjam"),
    ("nvidia-ml-py (NVML)", "pynvml"),
    ("prometheus-client (loads ssl, http.server)", "prometheus_client.exposition"),
    ("the remote-write message classes (protobuf; only the gateway)",
     "metricvault.wire.proto.messages"),
    ("numpy (the full agent's simulated GPUs)", "numpy"),
    ("the edge agent's modules, all it imports over http",
     "metricvault.collect.edge; metricvault.collect.edge.import_http_client(False); "
     "import metricvault.collect.cli, metricvault.collect.push, metricvault.collect.sources.host, "
     "metricvault.collect.sources.simulated_light, metricvault.collect.sources.nvml"),
    ("the full agent's modules", "metricvault.collect.cli, metricvault.collect.agent, "
     "metricvault.collect.sources.host, metricvault.collect.sources.simulated, "
     "metricvault.collect.exposition, metricvault.collect.push, prometheus_client"),
    ("not loaded by either: typer + rich", "typer, rich.console, rich.table"),
    ("not loaded by either: the store (pyarrow, DuckDB, pandas)", "metricvault.store.vault"),
)  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}


def import_costs() -> list[tuple[str, float]]:
    """RSS (MB) of a fresh interpreter after each import, one process per line."""
    costs = []
    for label, modules in IMPORTS:
        code = (
            f"import {modules}\n"
            "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env()
        )
        costs.append((label, int(out.stdout.strip()) / 1024))
    return costs


def floor() -> list[tuple[str, float, float]]:
    """(what, RSS MB, PSS MB) of each sleeping interpreter, read from outside after 2 s."""
    out = []
    for label, code in FLOOR:
        proc = subprocess.Popen([sys.executable, "-c", code], env=_env())
        try:
            time.sleep(2)
            out.append((label, proc_status(proc.pid, "VmRSS"), pss_mb(proc.pid)))
        finally:
            proc.kill()
            proc.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="measured seconds")
    parser.add_argument("--scrape", type=float, default=5.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--edge-interval", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="120 s measured")
    args = parser.parse_args()
    duration = 120.0 if args.quick else args.duration
    agent_bin = str(Path(sys.executable).with_name("metricvault"))
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as full_state, tempfile.TemporaryDirectory() as edge:
        port = free_port()
        processes = [
            Process(
                "metricvault agent",
                [agent_bin, "agent", "--listen", f"127.0.0.1:{port}", "--simulate-gpus",
                 str(args.gpus), "--sample-hz", str(args.hz), "--state-dir", full_state],
                f"http://127.0.0.1:{port}/metrics",
            ),
            Process(
                "metricvault agent --profile edge",
                [agent_bin, "agent", "--profile", "edge", "--simulate-gpus", str(args.gpus),
                 "--sample-interval", str(args.edge_interval), "--push", receiver.url,
                 "--state-dir", edge],
            ),
        ]  # fmt: skip
        exporter = shutil.which("prometheus-node-exporter")
        if exporter is None:
            print(
                "prometheus-node-exporter not installed (make system-deps): peer skipped",
                file=sys.stderr,
            )
        else:
            port = free_port()
            processes.append(
                Process(
                    "prometheus-node-exporter",
                    [exporter, f"--web.listen-address=127.0.0.1:{port}"],
                    f"http://127.0.0.1:{port}/metrics",
                )
            )
        try:
            results = measure(processes, duration, args.scrape)
        finally:
            with contextlib.suppress(Exception):
                receiver.close()
    if receiver.requests:
        results[1].note = (
            f"{receiver.requests} pushes received, {receiver.bytes / receiver.requests / 1024:.1f}"
            " KB each (snappy)"
        )
    report(results, args, duration)
    print("\n| the interpreter's floor (a sleeping process) | RSS MB | PSS MB |\n|---|---:|---:|")
    for label, rss, pss in floor():
        print(f"| `{label}` | {rss:.1f} | {pss:.1f} |")
    print("\n| imported in a fresh interpreter | RSS MB |\n|---|---:|")
    for label, mb in import_costs():
        print(f"| {label} | {mb:.1f} |")


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def report(results: list[Result], args: argparse.Namespace, duration: float) -> None:
    print(
        f"\n{duration:.0f} s measured, all processes at once after a {WARMUP_S:g} s warm-up; "
        f"full agent: host metrics + {args.gpus} simulated GPUs sampled at {args.hz:g} Hz, "
        f"scraped every {args.scrape:g} s; edge agent: host metrics + {args.gpus} simulated GPUs "
        f"collected every {args.edge_interval:g} s, pushed every 30 s; {os.cpu_count()} cores; "
        f"load average at the end {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| process | RSS MB (steady) | peak RSS MB | PSS MB | CPU % of a core | scrape p50 ms "
        "| scrape KB | series | note |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r.name} | {r.rss_mb:.1f} | {r.peak_rss_mb:.1f} | {r.pss_mb:.1f} | "
            f"{r.cpu_pct:.2f} | {_cell(r.scrape_ms, '.1f')} | {_cell(r.scrape_kb, '.1f')} | "
            f"{_cell(r.series, 'd')} | {r.note} |"
        )
    print()
    for r in results:
        if r.name in TARGETS:
            rss_target, cpu_target = TARGETS[r.name]
            rss_ok, cpu_ok = r.rss_mb <= rss_target, r.cpu_pct <= cpu_target
            print(
                f"{r.name}: RSS <= {rss_target:g} MB {'PASS' if rss_ok else 'MISS'} "
                f"({r.rss_mb:.1f} steady, {r.peak_rss_mb:.1f} peak); CPU <= {cpu_target:g} % "
                f"{'PASS' if cpu_ok else 'MISS'} ({r.cpu_pct:.2f})"
            )
    print(
        f"command: .venv/bin/python bench/agent.py --duration {duration:g} --scrape "
        f"{args.scrape:g} --gpus {args.gpus} --hz {args.hz:g} --edge-interval "
        f"{args.edge_interval:g}"
    )


if __name__ == "__main__":
    main()
