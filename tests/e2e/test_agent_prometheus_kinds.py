"""Counters stay counters through the shipped flow, with real processes: ``metricvault agent
--simulate-gpus 2`` (simulated GPUs, every series labelled ``simulated="true"``) is scraped by
Debian's ``prometheus``, configured by ``metricvault prometheus-config --merge … --agent …``,
which remote-writes samples and, every minute, metric metadata into ``metricvault serve``.

Once Prometheus has sent metadata, the energy series are still counters (the gateway's
``/api/v1/metadata`` says so while it runs, the vault after it stopped), nothing re-kinded them,
and ``rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])`` on a minute boundary is answered from the
1m rollups. The agent used to type these counters ``unknown`` in OpenMetrics; Prometheus
forwarded that, and the gateway stored them as gauges within a minute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from .conftest import free_port, http_get, metric_sum, parse_exposition, stop_process, wait_http_ok

pytestmark = pytest.mark.e2e

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
COUNTERS = (ENERGY, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
METADATA_WAIT_S = 150  # prometheus-config sends metadata every minute


def _wait_for(check, what: str, timeout_s: float, report=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}\n{report()}")
        time.sleep(1)


def _gateway_kinds(url: str) -> dict[str, str]:
    status, body = http_get(f"{url}/api/v1/metadata")
    assert status == 200, body
    return {m: entries[0]["type"] for m, entries in json.loads(body)["data"].items()}


@pytest.mark.timeout(600)  # three real processes and whole minutes of scrapes, on a loaded machine
def test_agent_counters_stay_counters_through_prometheus_and_rate_reads_rollups(
    tmp_path: Path, gateway
) -> None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus/promtool missing: apt-get install -y prometheus")
    gw = gateway()
    agent_port = free_port()
    agent_log = tmp_path / "agent.log"
    agent_cmd = [
        str(Path(sys.executable).with_name("metricvault")),
        "agent",
        "--listen",
        f"127.0.0.1:{agent_port}",
        "--simulate-gpus",
        "2",
        "--hostname",
        "node07",
        "--state-dir",
        str(tmp_path / "agent-state"),
    ]
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    config = prom_dir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs: []\n")
    merged = subprocess.run(
        [
            str(Path(sys.executable).with_name("metricvault")),
            "prometheus-config",
            "--merge",
            str(config),
            "--agent",
            f"127.0.0.1:{agent_port}",
            "--gateway",
            gw.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert merged.returncode == 0, merged.stderr
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prom_port = free_port()
    prom_url = f"http://127.0.0.1:{prom_port}"
    prom_log = prom_dir / "prometheus.log"
    with open(agent_log, "wb") as out:
        agent = subprocess.Popen(agent_cmd, stdout=out, stderr=subprocess.STDOUT)
    prom = None
    try:
        wait_http_ok(f"http://127.0.0.1:{agent_port}/metrics", agent, agent_log, "agent")
        with open(prom_log, "wb") as out:
            prom = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={prom_dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--storage.remote.flush-deadline=1s",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=prom_dir,
            )
        wait_http_ok(f"{prom_url}/-/ready", prom, prom_log, "prometheus")

        def prom_metrics() -> dict[str, float]:
            return parse_exposition(http_get(f"{prom_url}/metrics")[1].decode())

        def report() -> str:
            lines = [f"{k} {v}" for k, v in prom_metrics().items() if "remote_storage" in k]
            return "\n".join(lines) + "\n" + prom_log.read_text()[-3000:]

        def metadata_sent() -> bool:
            values = prom_metrics()
            return metric_sum(values, "prometheus_remote_storage_metadata_total") > 0

        _wait_for(metadata_sent, "Prometheus to send metadata", METADATA_WAIT_S, report)
        assert metric_sum(prom_metrics(), "prometheus_remote_storage_metadata_failed_total") == 0
        # the type Prometheus scraped and forwarded for the agent's energy counter
        query = urllib.parse.urlencode({"metric": ENERGY})
        scraped = json.loads(http_get(f"{prom_url}/api/v1/metadata?{query}")[1])["data"]
        assert scraped[ENERGY][0]["type"] == "counter", scraped
        kinds = _gateway_kinds(gw.url)
        assert {m: kinds.get(m) for m in COUNTERS} == dict.fromkeys(COUNTERS, "counter")
        page = parse_exposition(http_get(f"{gw.url}/metrics")[1].decode())
        refused = {k: v for k, v in page.items() if 'result="refused"' in k}
        assert sum(refused.values()) == 0, refused  # no metadata asked to downgrade a counter

        # a whole minute of samples after the boundary the rate is asked at, and the one before
        boundary_ms = (int(time.time() * 1000) // 60_000) * 60_000
        _wait_for(lambda: time.time() * 1000 > boundary_ms + 12_000, "the next scrapes", 30)

        asked = [boundary_ms]  # moves a minute on while scrapes of a loaded machine fail

        def minute_stored() -> bool:  # remote_write may lag a loaded machine's scrapes
            params = urllib.parse.urlencode(
                {"query": f"count_over_time({ENERGY}[1m])", "time": str(asked[0] / 1000)}
            )
            found = json.loads(http_get(f"{gw.url}/api/v1/query?{params}")[1])["data"]["result"]
            # rows summarising fewer than two samples each are read raw (store/query.py)
            if len(found) == 2 and all(float(r["value"][1]) >= 4 for r in found):
                return True
            if time.time() * 1000 > asked[0] + 90_000:  # that minute stayed sparse: the next
                asked[0] += 60_000
            return False

        _wait_for(
            minute_stored, "a minute of samples before a boundary in the gateway", 240, report
        )
        boundary_ms = asked[0]
    finally:
        if prom is not None:
            stop_process(prom, timeout=20)
        stop_process(agent)
    gw.stop_gracefully()  # flushes: the kinds it holds are committed

    from metricvault import Vault
    from metricvault.promql import Engine

    with Vault.open_local(str(gw.data_dir)) as vault:
        maintained = vault.maintain()  # rolls up every hour with samples, the current one included
        series = vault.series(ENERGY)
        assert len(series) == 2 and set(series["kind"]) == {"counter"}
        assert set(series["simulated"]) == {"true"}
        assert [c for c in vault.kind_changes() if c.metric in COUNTERS] == []
        result = Engine(vault).evaluate(f"rate({ENERGY}[1m])", boundary_ms)
        assert len(result.series) == 2, result.series
        per_row = vault.samples_per_row("1m", boundary_ms - 60_000, boundary_ms)
        # The planner reads raw where the vault's 1m rows summarise under two samples each
        # (store/query.py): a loaded machine's failed scrapes (the whole vault's, not just
        # the minute asked) can leave that few; past the raw horizon, below, rows must answer.
        if per_row is not None and per_row >= 2:
            assert result.served_by == {"1m"}, (
                result.served_by, result.warnings, maintained, vault.horizons(), boundary_ms,
                per_row,
            )  # fmt: skip
        assert all(float(values[-1]) > 0 for _, _, values in result.series)
    # Past raw retention (the 6-day rate that answered nothing once the counters had
    # become gauges): with the raw samples behind the horizon, the counters' rate comes
    # from the 1m rows, for both series.
    later = boundary_ms + 2 * 86_400_000  # raw retention drops whole days
    with Vault.open_local(str(gw.data_dir), retention_raw="1d") as vault:
        vault.maintain(now_ms=later)
        assert vault.horizons().raw_start_ms > boundary_ms, vault.horizons()
        past = Engine(vault).evaluate(f"rate({ENERGY}[1m])", boundary_ms)
        assert past.served_by == {"1m"}, (past.served_by, past.warnings, vault.horizons())
        assert len(past.series) == 2, past.series
        assert all(float(values[-1]) > 0 for _, _, values in past.series)
