"""End-to-end: ``kill -9`` of the gateway loses no acknowledged sample (issue 3, test 3).

A load generator in a process of its own (``tests/gateway_load.py``) sends remote-write 1.0
requests of 200 series x 1 sample, each request at its own timestamp, logging every request
before it is sent and after it is acknowledged (204), and retrying connection errors, 5xx and
429 with backoff and the same payload, as the spec says. Meanwhile the test SIGKILLs the
gateway twice at random moments and restarts it on the same directory and port.

At the end the vault must hold every acknowledged sample exactly once with its value, and
nothing else: no sample of a request that was never sent, no other series. A request that was
in flight at a kill may have been stored before the crash and then stored again by the retry;
it must still be there once.

``GATEWAY_CRASH_SEED`` changes the kill moments (the seed is printed on failure).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metricvault.store.vault import Vault

from .conftest import GatewayProcess

pytestmark = pytest.mark.e2e

LOAD_PATH = Path(__file__).resolve().parents[1] / "gateway_load.py"
_spec = importlib.util.spec_from_file_location("gateway_load", LOAD_PATH)
assert _spec is not None and _spec.loader is not None
load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load)

SEED = int(os.environ.get("GATEWAY_CRASH_SEED", "20260302"))
N_SERIES = 200
KILLS = 2
PROGRESS = 20  # requests acknowledged before the first kill and after each restart
PROGRESS_WAIT_S = 25.0
HOUR_MS = 3_600_000


def count_lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def read_ids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().splitlines()]


def wait_for(condition: Callable[[], bool], what: str, context: Callable[[], str]) -> None:
    deadline = time.monotonic() + PROGRESS_WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {PROGRESS_WAIT_S:.0f} s\n{context()}")
        time.sleep(0.05)


def expected_table(t0_ms: int, n_requests: int) -> dict[tuple[str, int], float]:
    return {
        (load.series_label(s), load.timestamp(t0_ms, r)): load.value(r, s)
        for r in range(n_requests)
        for s in range(N_SERIES)
    }


def test_sigkill_twice_under_load_loses_and_duplicates_nothing(
    gateway: Any, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    gw: GatewayProcess = gateway()
    out = tmp_path / "load"
    t0_ms = (time.time_ns() // 1_000_000 - 2 * HOUR_MS) // 1000 * 1000
    load_log = tmp_path / "load.out"
    acked_log = out / "acked.log"

    def context() -> str:
        error = out / "error.txt"
        return (
            f"seed {SEED}; load generator output:\n{load_log.read_text()}"
            f"\nerror.txt: {error.read_text() if error.exists() else '-'}"
            f"\ngateway output:\n{gw.log_tail()}"
        )

    command = [sys.executable, str(LOAD_PATH), f"{gw.url}/api/v1/write", str(out), str(t0_ms)]
    with open(load_log, "wb") as log:
        loader = subprocess.Popen(
            [*command, "--series", str(N_SERIES)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: count_lines(acked_log) >= PROGRESS, "no load acknowledged", context)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 3.0))
            gw.kill()
            acked_at_kill = count_lines(acked_log)
            time.sleep(rng.uniform(0.1, 1.0))
            gw.start()

            def recovered(n: int = acked_at_kill) -> bool:
                return count_lines(acked_log) >= n + PROGRESS

            wait_for(
                recovered,
                "the load generator did not recover after a restart",
                context,
            )
        time.sleep(rng.uniform(0.2, 1.0))
        loader.send_signal(signal.SIGTERM)
        status = loader.wait(timeout=60)
    finally:
        if loader.poll() is None:
            loader.kill()
            loader.wait(timeout=10)
    assert status == 0, f"load generator exited with {status}\n{context()}"
    gw.stop_gracefully()

    sent, acked = read_ids(out / "sent.log"), read_ids(acked_log)
    stats = json.loads((out / "stats.json").read_text())
    n = len(acked)
    assert acked == list(range(n)), "acknowledgements out of order"
    assert sent == acked, f"a clean stop leaves nothing unacknowledged: {sent[-3:]} {acked[-3:]}"
    assert stats["retries"], f"no retry happened: the kills missed the load? {stats}"

    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        assert vault.buffer.depth()[0] == 0, f"SIGTERM left {vault.buffer.depth()} buffered"
        series = vault.series(output="arrow")
        # everything, however old or new: nothing that was never sent may be there
        table = vault.query("{__name__=~'.+'}", t0_ms - 400 * 86_400_000, "now", output="arrow")
        physical = vault.sql(
            "SELECT count(*) AS rows, count(DISTINCT (series_id, ts)) AS keys FROM raw"
        )

    assert series.num_rows == N_SERIES, f"{series.num_rows} series in the vault: {series}"
    assert set(series["metric"].to_pylist()) == {load.METRIC}
    labels = table["series"].to_numpy(zero_copy_only=False)
    ts = table["timestamp"].cast(pa.int64()).to_numpy()
    values = table["value"].to_numpy()
    keys = pc.binary_join_element_wise(
        table["series"], pc.cast(table["timestamp"], pa.string()), "@"
    )
    counts = pc.value_counts(keys)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    assert len(repeated) == 0, f"samples stored more than once: {repeated[:10]}\n{context()}"

    expected = expected_table(t0_ms, n)
    got = {(str(s), int(t)): float(v) for s, t, v in zip(labels, ts, values, strict=True)}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not missing, (
        f"{len(missing)} acknowledged samples lost (of {len(expected)}; requests "
        f"{sorted({(t - t0_ms) // load.STEP_MS for _, t in missing})[:20]}); stats {stats}\n"
        f"{context()}"
    )
    assert not extra, (
        f"{len(extra)} samples never sent are in the vault, e.g. {extra[:5]}; requests "
        f"{sorted({(t - t0_ms) // load.STEP_MS for _, t in extra})[:20]}\n{context()}"
    )
    wrong = [(k, expected[k], got[k]) for k in expected if got[k] != expected[k]]
    assert not wrong, f"{len(wrong)} values differ, e.g. {wrong[:5]}"
    assert len(got) == table.num_rows == n * N_SERIES
    assert np.isfinite(values).all()
    print(
        f"seed {SEED}: {n} requests ({n * N_SERIES} samples) acknowledged, retries "
        f"{stats['retries']}, {KILLS} kills; physical raw rows {physical['rows'].iloc[0]} for "
        f"{physical['keys'].iloc[0]} keys (duplicates go at compaction)"
    )
