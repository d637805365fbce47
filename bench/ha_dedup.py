"""HA Prometheus pairs: what deduplication at ingest costs a gateway worker.

One gateway app in-process (Starlette's TestClient over a real vault in a temp dir: decoding,
the HA election and the durable write, as a worker does them) receives the same remote_write
requests four ways, in one run, interleaved round by round so load on the machine hits every
case alike:

- ``ha_off``: no HA labels, deduplication off (``ha_replica_label = ""``): the peer;
- ``no_ha_labels``: no HA labels, deduplication on (the default): what every other sender pays;
- ``ha_elected``: both labels, the elected replica: election looked up, replica label removed;
- ``ha_standby``: both labels, the other replica: looked up, every sample dropped (202).

Each request holds SERIES series with one sample each (what Prometheus sends at low load),
dcgm-exporter-like labels plus ``cluster``/``__replica__`` external labels. It prints samples/s
per case and the ratio to ``ha_off`` beside the machine's load average.

Run from the repository root::

    .venv/bin/python bench/ha_dedup.py            # 60 rounds x 2000 series (~1 min)
    .venv/bin/python bench/ha_dedup.py --quick    # 10 rounds x 500 series (seconds)
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):  # run as a script from a checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import os
import tempfile
import time

from starlette.testclient import TestClient

import metricvault.wire.remote_write as wire
from metricvault.config import Settings
from metricvault.server.app import create_app
from metricvault.store.vault import Vault

RW1 = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
T0 = 1_767_225_600_000
CASES = ("ha_off", "no_ha_labels", "ha_elected", "ha_standby")


def body(series: int, ts: int, replica: str | None) -> bytes:
    samples = []
    for i in range(series):
        labels = {"Hostname": f"node{i // 8:04d}", "gpu": str(i % 8), "job": "dcgm"}
        if replica is not None:
            labels |= {"cluster": "c1", "__replica__": replica}
        samples.append(("DCGM_FI_DEV_GPU_UTIL", labels, ts, float(i % 100)))
    return wire.encode_write_request(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 rounds x 500 series")
    args = parser.parse_args()
    rounds, series = (10, 500) if args.quick else (60, 2000)
    # Prometheus sends __replica__ as an external label; the test encoder refuses reserved
    # names as the gateway does for every other one, so let it write this one
    wire.label_name_problem = lambda name: None  # type: ignore[assignment]
    load_before = os.getloadavg()
    spent = dict.fromkeys(CASES, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        clients = {}
        for case in CASES:
            overrides = {"ha_replica_label": ""} if case == "ha_off" else {}
            settings = Settings.load(env={}, gateway_maintain=False, **overrides)
            vault = Vault.open_local(str(Path(tmp) / case), settings)
            client = TestClient(create_app(vault, settings))
            client.__enter__()
            clients[case] = (client, vault)
        # the election: r1 first, so r2 is the standby
        clients["ha_elected"][0].post("/api/v1/write", content=body(1, T0, "r1"), headers=RW1)
        clients["ha_standby"][0].post("/api/v1/write", content=body(1, T0, "r1"), headers=RW1)
        for n in range(rounds):
            ts = T0 + (n + 1) * 1000
            # the elected replica keeps sending (untimed), or r2 would take over after 30 s
            keep = body(1, ts, "r1")
            clients["ha_standby"][0].post("/api/v1/write", content=keep, headers=RW1)
            for case in CASES:
                replica = {"ha_elected": "r1", "ha_standby": "r2"}.get(case)
                payload = body(series, ts, replica)
                client = clients[case][0]
                started = time.perf_counter()
                status = client.post("/api/v1/write", content=payload, headers=RW1).status_code
                spent[case] += time.perf_counter() - started
                assert status == (202 if case == "ha_standby" else 204), (case, status)
        for client, vault in clients.values():
            client.__exit__(None, None, None)
            vault.close()
    load_after = os.getloadavg()
    samples = rounds * series
    print(f"HA dedup at ingest: {rounds} requests x {series} series per case")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"{'case':<14}{'samples/s':>12}{'vs ha_off':>11}")
    base = samples / spent["ha_off"]
    for case in CASES:
        rate = samples / spent[case]
        print(f"{case:<14}{rate:>12,.0f}{rate / base:>10.2f}x")


if __name__ == "__main__":
    main()
