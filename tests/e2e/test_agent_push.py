"""End-to-end: the agent's push client rides out a 20 s gateway outage (and an agent restart in
the middle of it) and every sample it was given ends up in the vault exactly once.

A thread submits one request of 50 series x 1 sample every 100 ms, each request at a timestamp
of its own, to a :class:`PushClient` over a real ``metricvault serve``. The gateway is stopped
for 20 s while the submissions go on, so they pile up in the spool; halfway through, the agent
itself is restarted on the same spool directory. Then the gateway comes back, the spool drains,
and the vault must hold exactly the submitted samples, each once, with its value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metricvault.collect.push import PushClient, SampleTuple
from metricvault.collect.spool import Spool
from metricvault.store.vault import Vault

from .conftest import GatewayProcess

pytestmark = pytest.mark.e2e

METRIC = "mv_agent_push"
SERIES = 50
PERIOD_S = 0.1
STEP_MS = 100
OUTAGE_S = 20.0
WAIT_S = 20.0
SPOOL_BYTES = 64 * 1024**2


def request(t0_ms: int, r: int) -> list[SampleTuple]:
    return [
        (METRIC, {"job": "agent-e2e", "series": f"s{s:02d}"}, t0_ms + r * STEP_MS, value(r, s))
        for s in range(SERIES)
    ]


def value(r: int, s: int) -> float:
    return r + s / 64  # exact in binary: a changed value is a real difference


class Pusher:
    """Submits request 0, 1, 2, ... every PERIOD_S to ``client`` (swappable under ``lock``)."""

    def __init__(self, client: PushClient, t0_ms: int) -> None:
        self.client = client
        self.t0_ms = t0_ms
        self.submitted = 0
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                with self.lock:
                    self.client.submit(request(self.t0_ms, self.submitted))
                    self.submitted += 1
                next_at += PERIOD_S
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            yield

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        assert self.error is None, f"submitting failed: {self.error!r}"
        return self.submitted


def make_client(gw: GatewayProcess, spool_dir: Path) -> PushClient:
    client = PushClient(
        f"{gw.url}/api/v1/write",
        Spool(spool_dir, SPOOL_BYTES),
        timeout_s=5.0,
        min_backoff_s=0.05,
        max_backoff_s=1.0,
        # the offset is estimated against the real gateway, but never applied here: the test
        # checks the timestamps exactly as submitted
        correct_clock_above_s=None,
    )
    client.start()
    return client


def wait_for(condition: Callable[[], bool], what: str, context: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {WAIT_S:.0f} s\n{context()}")
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_push_client_rides_out_a_gateway_outage_and_an_agent_restart(
    gateway: Any, tmp_path: Path
) -> None:
    gw: GatewayProcess = gateway()
    spool_dir = tmp_path / "spool"
    t0_ms = (time.time_ns() // 1_000_000 - 600_000) // 1000 * 1000
    clients = [make_client(gw, spool_dir)]
    pusher = Pusher(clients[0], t0_ms)

    def context() -> str:
        c = clients[-1]
        return (
            f"submitted {pusher.submitted}; client sent {c.sent_requests} requests, failed "
            f"attempts {c.failed_attempts}, rejected {c.rejected_requests}; spool "
            f"{c.spool.count}\ngateway output:\n{gw.log_tail()}"
        )

    try:
        wait_for(lambda: clients[0].sent_requests >= 20, "no request delivered", context)
        gw.stop_gracefully()
        down_at = time.monotonic()
        time.sleep(OUTAGE_S / 2)
        with pusher.paused():  # the agent restarts: a new client over the same spool
            assert clients[0].stop(flush_timeout_s=0.5) is False
            clients[0].spool.close()
            clients.append(make_client(gw, spool_dir))
            pusher.client = clients[-1]
            queued = clients[-1].spool.count
        time.sleep(max(0.0, down_at + OUTAGE_S - time.monotonic()))
        spooled = clients[-1].spool.count
        assert spooled > queued > 50, f"the spool did not fill: {queued}, {spooled}"
        assert clients[-1].failed_attempts > 0 and clients[-1].sent_requests == 0
        gw.start()
        wait_for(lambda: clients[-1].spool.count <= 2, "the spool did not drain", context)
        time.sleep(1.0)  # and live pushing goes on
    finally:
        submitted = pusher.stop()
    drained = clients[-1].stop(flush_timeout_s=15)
    clients[-1].spool.close()
    assert drained, f"the spool did not drain on stop\n{context()}"
    gw.stop_gracefully()

    total = submitted * SERIES
    assert sum(c.sent_samples for c in clients) == total
    assert sum(c.rejected_requests for c in clients) == 0
    assert clients[-1].spool.dropped_samples == 0
    offset = clients[0].clock_offset_s
    assert offset is not None and abs(offset) < 3, f"clock offset to the gateway: {offset}"

    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        table = vault.query(METRIC, t0_ms - 3_600_000, t0_ms + 3_600_000, output="arrow")
        physical = vault.sql("SELECT count(*) AS rows FROM raw")["rows"].iloc[0]
    ts_column = table["timestamp"].cast(pa.int64())
    ts = ts_column.to_pylist()
    got = list(zip(table["series"].to_pylist(), ts, table["value"].to_pylist(), strict=True))
    expected = sorted(
        (f"s{s:02d}", t0_ms + r * STEP_MS, value(r, s))
        for s in range(SERIES)
        for r in range(submitted)
    )
    keys = pc.value_counts(
        pc.binary_join_element_wise(table["series"], pc.cast(ts_column, pa.string()), "@")
    )
    assert pc.max(keys.field("counts")).as_py() == 1, "a sample is stored more than once"
    assert table.num_rows == total, f"{table.num_rows} samples stored of {total}\n{context()}"
    missing = sorted(set(expected) - set(got))
    assert not missing, f"{len(missing)} samples lost, e.g. {missing[:5]}"
    assert got == expected  # every sample once, per series in time order, with its value
    print(
        f"{submitted} requests ({total} samples) submitted, {spooled} spooled during the "
        f"outage; {sum(c.failed_attempts for c in clients)} failed attempts; raw rows "
        f"{physical} (re-sent duplicates go at compaction)"
    )
