"""CLI start-up: wall time of `metricvault --help`, `stats`, `series` and a small `query`,
beside `promtool query instant` against a real Prometheus on loopback.

Each command runs ``--runs`` times (15) after one warm-up; the table shows the median and the
min/max (hyperfine-style). The vault is a fresh one with
4 series x 1 day at 5 s (maintained); the Prometheus is Debian's `prometheus`, started by this
script on 127.0.0.1 with an empty TSDB and scraping itself, queried for `up`.

    .venv/bin/python bench/cli_startup.py            # 15 runs each
    .venv/bin/python bench/cli_startup.py --runs 5

Target (issue 11): <= 0.4 s for --help, stats, series and a small query.
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
import statistics
import subprocess
import tempfile
import time
import urllib.request

from bench.peers import free_port

T0 = 1_767_225_600_000
METRICVAULT = [sys.executable, "-m", "metricvault.cli"]


def make_vault(path: Path) -> None:
    from metricvault import Vault

    with Vault.open(str(path), create=True) as v:
        v.write(
            [
                ("gpu_util", {"gpu": str(g)}, T0 + i * 5000, float(i % 100))
                for g in range(4)
                for i in range(17_280)
            ]
        )
        v.maintain(now_ms=T0 + 2 * 86_400_000)


def measure(cmd: list[str], runs: int) -> tuple[float, float, float]:
    """(median, min, max) wall seconds."""
    subprocess.run(cmd, check=True, capture_output=True)  # warm the page cache
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times), max(times)


def start_prometheus(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: self\n    static_configs: [{{targets: "
        f"['127.0.0.1:{port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("prometheus did not become ready in 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        vault = str(work / "v")
        make_vault(work / "v")
        mv = [*METRICVAULT]
        q = [
            *mv,
            "query",
            "gpu_util",
            "-d",
            vault,
            "--start",
            str(T0),
            "--end",
            str(T0 + 3_600_000),
        ]
        commands = {
            "metricvault --help": [*mv, "--help"],
            "metricvault --version": [*mv, "--version"],
            "metricvault stats": [*mv, "stats", "-d", vault],
            "metricvault series": [*mv, "series", "-d", vault],
            "metricvault query (1 h, step 1h)": [*q, "--step", "1h"],
            "metricvault query (1 h raw, 2880 rows)": q,
            "metricvault sql (typer path)": [*mv, "sql", "SELECT count(*) FROM raw", "-d", vault],
        }
        rows = []
        prometheus = None
        if shutil.which("prometheus") and shutil.which("promtool"):
            prometheus, url = start_prometheus(work)
            commands["promtool query instant (peer)"] = ["promtool", "query", "instant", url, "up"]
        try:
            for name, cmd in commands.items():
                rows.append((name, *measure(cmd, args.runs)))
        finally:
            if prometheus:
                prometheus.terminate()
                prometheus.wait(timeout=30)
    load = os.getloadavg()  # the machine is shared: read the times beside it
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores\n")
    print(f"| command ({args.runs} runs) | median s | min s | max s |")
    print("|---|---|---|---|")
    for name, median, low, high in rows:
        print(f"| `{name}` | {median:.3f} | {low:.3f} | {high:.3f} |")


if __name__ == "__main__":
    main()
