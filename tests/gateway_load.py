"""Remote-write 1.0 load generator for tests/e2e/test_gateway_crash.py.

Usage: ``python tests/gateway_load.py URL OUT_DIR T0_MS [--series N] [--max-requests N]``

Sends request ``r = 0, 1, 2, ...`` to ``URL`` (``.../api/v1/write``), one at a time: a
``prometheus.WriteRequest`` (snappy block, the headers Prometheus sends) holding one sample for
each of ``--series`` series ``mv_load_value{job="mv-load",series="sNNN"}``, all at
``timestamp(r) = T0_MS + r * STEP_MS``, with the values :func:`value` gives. The same ``r``
always gives the same bytes.

Retries follow the remote-write spec, always with the same payload: connection errors,
timeouts, 5xx and 429 are retried with exponential backoff (``Retry-After`` honoured, capped);
any other non-2xx is a bug here, so it is written to ``OUT_DIR/error.txt`` and the generator
exits with status 3. A request that cannot be delivered within ``GIVE_UP_S`` exits with 4.

Logs, one request id per line, each line fsynced before the next step:

- ``OUT_DIR/sent.log``: before the first attempt of a request (it may be stored from then on);
- ``OUT_DIR/acked.log``: after a 2xx (the gateway promised it is durable).

SIGTERM stops it after the request in flight is acknowledged (so at a clean stop every sent
request is acknowledged); ``OUT_DIR/stats.json`` then holds counts of requests, retries and
errors by kind. Prints ``ready`` once it is running.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

import cramjam

from metricvault.wire.proto import messages

STEP_MS = 1_000
METRIC = "mv_load_value"
JOB = "mv-load"
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "metricvault-gateway-load/1",
}
TIMEOUT_S = 5.0
MIN_BACKOFF_S = 0.03
MAX_BACKOFF_S = 1.0
GIVE_UP_S = 45.0


def series_label(s: int) -> str:
    return f"s{s:03d}"


def timestamp(t0_ms: int, r: int) -> int:
    return t0_ms + r * STEP_MS


def value(r: int, s: int) -> float:
    """Sample value of series ``s`` in request ``r``: two decimals for even series (the store
    may keep those as scaled integers), full 53-bit floats for odd ones."""
    if s % 2 == 0:
        return ((r * 7919 + s * 104729) % 1_000_000) / 100
    return math.sin(r * 1_000.0 + s) * 1e3


def payload(t0_ms: int, r: int, n_series: int) -> bytes:
    request = messages.WriteRequest()
    ts = timestamp(t0_ms, r)
    for s in range(n_series):
        series = request.timeseries.add()
        # sorted by name, as the spec requires
        series.labels.add(name="__name__", value=METRIC)
        series.labels.add(name="job", value=JOB)
        series.labels.add(name="series", value=series_label(s))
        series.samples.add(value=value(r, s), timestamp=ts)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


class Log:
    """An append-only id log whose every line is on disk before ``append`` returns."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = open(path, "a")  # noqa: SIM115

    def append(self, r: int) -> None:
        self.file.write(f"{r}\n")
        self.file.flush()
        os.fsync(self.file.fileno())


class Sender:
    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path
        self.conn: http.client.HTTPConnection | None = None
        self.stats: dict[str, Any] = {"requests": 0, "attempts": 0, "retries": {}}

    def _retry(self, kind: str) -> None:
        self.stats["retries"][kind] = self.stats["retries"].get(kind, 0) + 1
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def send(self, body: bytes) -> tuple[int, str] | None:
        """Deliver ``body``: None once acknowledged, else (status, text) of a non-retryable
        answer. Raises TimeoutError after GIVE_UP_S of retrying."""
        backoff, deadline = MIN_BACKOFF_S, time.monotonic() + GIVE_UP_S
        while True:
            self.stats["attempts"] += 1
            wait = backoff
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
                self.conn.request("POST", self.path, body=body, headers=HEADERS)
                resp = self.conn.getresponse()
                text = resp.read().decode(errors="replace")
                if 200 <= resp.status < 300:
                    self.stats["requests"] += 1
                    return None
                if resp.status != 429 and resp.status < 500:
                    return resp.status, text
                self._retry(f"http_{resp.status}")
                retry_after = resp.getheader("Retry-After")
                if retry_after and retry_after.isdigit():
                    wait = max(wait, min(float(retry_after), MAX_BACKOFF_S))
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, timeout
                self._retry(type(exc).__name__)
            if time.monotonic() + wait > deadline:
                raise TimeoutError(f"request not delivered within {GIVE_UP_S} s")
            time.sleep(wait)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("t0_ms", type=int)
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--max-requests", type=int, default=10**9)
    args = parser.parse_args(argv)

    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    sent, acked = Log(args.out_dir / "sent.log"), Log(args.out_dir / "acked.log")
    sender = Sender(args.url)
    status = 0
    print("ready", flush=True)
    r = 0
    while not stopping and r < args.max_requests:
        body = payload(args.t0_ms, r, args.series)
        sent.append(r)
        try:
            refused = sender.send(body)
        except TimeoutError as exc:
            (args.out_dir / "error.txt").write_text(f"request {r}: {exc}\n")
            status = 4
            break
        if refused is not None:
            (args.out_dir / "error.txt").write_text(f"request {r}: HTTP {refused[0]}: {refused[1]}")
            status = 3
            break
        acked.append(r)
        r += 1
    (args.out_dir / "stats.json").write_text(json.dumps(sender.stats, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
