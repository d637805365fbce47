"""The exported baseline rules in a real Prometheus: `promtool check rules` accepts them, and
Debian's `prometheus`, loading them as rule_files and scraping a target where one GPU's
memory crosses its learned 28-day P99, fires the alert for that GPU only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from .conftest import free_port, http_get, stop_process, wait_http_ok

METRICVAULT = str(Path(sys.executable).with_name("metricvault"))
HOUR_MS = 3_600_000
DEADLINE_S = 90.0


def _cli(*args: str) -> str:
    done = subprocess.run(
        [METRICVAULT, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"metricvault {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture
def trained_vault(tmp_path: Path) -> Path:
    """Ten days of two GPUs' framebuffer memory (about 40 000 MiB, sigma 500)."""
    from metricvault import Vault
    from metricvault.durations import now_ms

    path = tmp_path / "vault"
    end = now_ms() // 60_000 * 60_000
    ts = np.arange(end - 10 * 24 * HOUR_MS, end, 60_000)
    rng = np.random.default_rng(5)
    frames = [
        pd.DataFrame(
            {"metric": "DCGM_FI_DEV_FB_USED", "timestamp": ts,
             "value": 40_000 + rng.normal(0, 500, ts.size), "Hostname": "node01", "gpu": gpu}
        )
        for gpu in ("0", "1")
    ]  # fmt: skip
    with Vault.open_local(str(path)) as vault:
        vault.write(pd.concat(frames, ignore_index=True))
        vault.maintain()
    return path


@pytest.fixture
def exporter() -> Iterator[tuple[str, dict[str, float]]]:
    """A scrape target serving the gauges in the returned dict."""
    values: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = "".join(
                f'DCGM_FI_DEV_FB_USED{{Hostname="node01",gpu="{gpu}"}} {v!r}\n'
                for gpu, v in sorted(values.items())
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}", values
    server.shutdown()
    server.server_close()


def test_exported_p99_rules_fire_in_prometheus(
    tmp_path: Path, trained_vault: Path, exporter: tuple[str, dict[str, float]]
) -> None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("Debian's prometheus/promtool are missing: apt-get install -y prometheus")
    _cli("baseline", "--data", str(trained_vault), "--selector", "DCGM_FI_DEV_FB_USED")
    rules = tmp_path / "baseline-rules.yml"
    _cli("baseline", "export-rules", "--data", str(trained_vault), "--for", "2s", "-o", str(rules))
    check = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    thresholds = {
        r["labels"]["gpu"]: float(r["expr"].removeprefix("vector(").removesuffix(")"))
        for g in yaml.safe_load(rules.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    assert set(thresholds) == {"0", "1"} and all(41_000 < t < 42_000 for t in thresholds.values())
    target, values = exporter
    values.update({"0": thresholds["0"] * 1.05, "1": thresholds["1"] * 0.95})

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": [target]}]}],
            }
        )
    )
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/-/ready", proc, log_path, "prometheus")
        firing: list[dict[str, Any]] = []
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            _, body = http_get(f"http://127.0.0.1:{port}/api/v1/alerts")
            alerts = json.loads(body)["data"]["alerts"]
            firing = [a for a in alerts if a["state"] == "firing"]
            if firing:
                break
            time.sleep(0.5)
        assert firing, f"no alert fired in {DEADLINE_S:.0f} s; log:\n{log_path.read_text()[-3000:]}"
        assert [(a["labels"]["alertname"], a["labels"]["gpu"]) for a in firing] == [
            ("DCGM_FI_DEV_FB_USED_above_baseline_p99", "0")
        ]
        assert float(firing[0]["value"]) == pytest.approx(thresholds["0"] * 1.05)
    finally:
        stop_process(proc)
