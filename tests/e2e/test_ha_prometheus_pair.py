"""End to end: an HA Prometheus pair, deduplicated at ingest by two gateways on one vault.

Two real Debian Prometheus processes scrape one target (a tiny exposition served by the test)
with ``external_labels: {cluster: c1, __replica__: r1 | r2}``; each remote-writes to a
different ``metricvault serve`` process, both on the same vault directory, so the election is
only shared through the vault's ``ha/`` records. The vault holds one series per target,
without ``__replica__``; after ``kill -9`` of the elected replica's Prometheus, the other's
samples are stored once the failover window has passed, and the series' gap is bounded by it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from .conftest import PROMETHEUS_QUEUE_CONFIG, http_get, parse_exposition

pytestmark = pytest.mark.e2e

FAILOVER_S = 6
SCRAPE_S = 1  # the prometheus fixture's scrape_interval
HA_SETTINGS = (
    f"ha_failover_timeout={FAILOVER_S}s",
    "ha_update_timeout=2s",
    "ha_cache_ttl=1s",
    "gateway_workers=1",
)
WAIT_S = 40.0


class _Exposition(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"# TYPE ha_probe gauge\nha_probe 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def probe_series(url: str) -> list[dict[str, str]]:
    query = urllib.parse.urlencode({"match[]": "ha_probe", "start": "0", "end": time.time() + 60})
    status, body = http_get(f"{url}/api/v1/series?{query}")
    assert status == 200, body[:300]
    return list(json.loads(body)["data"])


def probe_times(url: str) -> list[float]:
    """Every stored sample's timestamp (s) of ha_probe, from the raw samples of a range."""
    query = urllib.parse.urlencode({"query": "ha_probe[5m]", "time": time.time()})
    status, body = http_get(f"{url}/api/v1/query?{query}")
    assert status == 200, body[:300]
    result = json.loads(body)["data"]["result"]
    return sorted(float(ts) for series in result for ts, _ in series["values"])


def ha_counters(url: str) -> dict[str, float]:
    status, body = http_get(f"{url}/metrics")
    assert status == 200
    return {k: v for k, v in parse_exposition(body.decode()).items() if "_ha_" in k}


def wait_until(what: str, check: Callable[[], bool], procs: list[Any]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"a process exited with {proc.returncode} ({what})"
        if check():
            return
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {WAIT_S:.0f} s")


def test_ha_pair_is_stored_once_and_fails_over_when_the_elected_replica_dies(
    tmp_path, gateway, prometheus, target
):
    vault = tmp_path / "vault"
    gateways = [gateway(data_dir=vault, settings=HA_SETTINGS) for _ in range(2)]
    proms = [
        prometheus(
            f"{gw.url}/api/v1/write",
            {"probe": [target]},
            external_labels={"cluster": "c1", "__replica__": replica},
        )
        for gw, replica in zip(gateways, ("r1", "r2"), strict=True)
    ]
    procs = [*(gw.proc for gw in gateways), *(p.proc for p in proms)]
    dropped = {
        replica: f'metricvault_ha_dropped_samples_total{{cluster="c1",replica="{replica}"}}'
        for replica in ("r1", "r2")
    }

    def loser() -> int | None:
        """The index of the replica whose samples its gateway drops, once one does."""
        for i, (gw, replica) in enumerate(zip(gateways, ("r1", "r2"), strict=True)):
            if ha_counters(gw.url).get(dropped[replica], 0) > 0:
                return i
        return None

    wait_until("one replica's samples are dropped", lambda: loser() is not None, procs)
    standby = loser()
    assert standby is not None
    elected = 1 - standby
    wait_until("samples are stored", lambda: len(probe_times(gateways[0].url)) >= 5, procs)

    # one series per target, the cluster label kept and the replica label gone
    series = probe_series(gateways[standby].url)
    assert len(series) == 1, series
    assert series[0]["cluster"] == "c1" and "__replica__" not in series[0]
    assert series[0]["job"] == "probe" and series[0]["instance"] == target
    # only one replica's samples: one per scrape interval, never both replicas' interleaved
    before = probe_times(gateways[0].url)
    span = before[-1] - before[0]
    assert len(before) <= span / SCRAPE_S + 2, (len(before), span)

    proms[elected].proc.kill()  # kill -9 the elected replica's Prometheus
    proms[elected].proc.wait(timeout=10)
    killed_at = time.time()
    procs = [*(gw.proc for gw in gateways), proms[standby].proc]
    failovers = 'metricvault_ha_failovers_total{cluster="c1"}'
    wait_until(
        "the standby replica is elected",
        lambda: ha_counters(gateways[standby].url).get(failovers, 0) >= 1,
        procs,
    )
    wait_until(
        "the new leader's samples are stored",
        lambda: len([t for t in probe_times(gateways[0].url) if t > killed_at]) >= 3,
        procs,
    )
    times = probe_times(gateways[0].url)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # the samples the standby sent during the failover window were dropped (their copies died
    # with the elected replica): the gap is the window, plus a scrape interval and the standby's
    # send deadline before its first request after the window arrives; the window starts at
    # the dead replica's last request, which a loaded machine delivers up to a send deadline
    # after its last sample was scraped
    deadline_s = float(PROMETHEUS_QUEUE_CONFIG["batch_send_deadline"].removesuffix("s"))
    bound = FAILOVER_S + SCRAPE_S + 2 * deadline_s
    assert max(gaps) <= bound, (max(gaps), bound)
    assert max(gaps) >= FAILOVER_S - 2 - SCRAPE_S  # a failover did happen, and no sooner
    assert len(probe_series(gateways[0].url)) == 1  # still one series, now the standby's
    # after the failover the standby's samples are no longer dropped
    settled = ha_counters(gateways[standby].url).get(dropped[("r1", "r2")[standby]], 0)
    time.sleep(2 * SCRAPE_S + 1)
    assert ha_counters(gateways[standby].url).get(dropped[("r1", "r2")[standby]], 0) == settled
