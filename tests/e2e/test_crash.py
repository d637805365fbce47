"""kill -9 durability: every acknowledged sample survives, exactly once, in raw and in rollups.

``tests/e2e/crash_writer.py`` writes deterministic batches (background flushes every 5000 samples,
its own ``maintain`` every 40 batches, a duplicate delivery every 7th batch) and logs each batch
after ``write`` returned. We SIGKILL it at random moments, restart it (it re-sends the batch
that may have been in flight), and finally open the vault, let it recover, and compare with the
batches the log acknowledged.
"""

from __future__ import annotations

import importlib.util
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from metricvault.store.vault import Vault

WRITER_PATH = Path(__file__).resolve().with_name("crash_writer.py")
_spec = importlib.util.spec_from_file_location("crash_writer", WRITER_PATH)
assert _spec is not None and _spec.loader is not None
cw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cw)

SEED = int(os.environ.get("CRASH_TEST_SEED", "20260101"))  # vary it to explore
N_BATCHES = 1_000_000  # never reached: every round ends with a kill
ROUNDS = 6
MAX_ROUNDS = 30  # on a slow machine, more rounds until MIN_BATCHES were acknowledged
MIN_BATCHES = 2 * cw.MAINTAIN_EVERY  # so the writer ran maintain (compaction, rollups) too
HOUR = 3_600_000
MINUTE = 60_000


def _start_writer(vault_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(WRITER_PATH), str(vault_dir), str(SEED), str(N_BATCHES)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    assert line.startswith(b"ready"), f"writer did not start: {line!r}\n{log.read_text()}"


def _kill(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        pytest.fail(f"writer exited on its own with {proc.returncode}:\n{log.read_text()}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    if proc.stdout is not None:
        proc.stdout.close()


def _last_acked(vault_dir: Path) -> int:
    acked = cw.acked_batches(str(vault_dir))
    return acked[-1] if acked else -1


def _keys(series: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """One int per (series, ts): unique because 0 <= series < N_SERIES."""
    return np.asarray(ts * cw.N_SERIES + series)


def _batch_of(ts: np.ndarray) -> np.ndarray:
    return np.asarray((ts - cw.T0) // cw.WINDOW_MS)


def _expected(batches: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(keys, values) of the given batches, sorted by key."""
    parts = [cw.batch_arrays(SEED, b) for b in batches]
    keys = np.concatenate([_keys(s, t) for s, t, _ in parts])
    values = np.concatenate([v for _, _, v in parts])
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def _series_index(metric: list[str], host: list[str]) -> np.ndarray:
    lookup = {cw.series_name(s): s for s in range(cw.N_SERIES)}
    return np.array([lookup[(m, h)] for m, h in zip(metric, host, strict=True)], np.int64)


def test_kill_9_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    vault_dir = tmp_path / "vault"
    log = tmp_path / "writer.log"
    rng = random.Random(SEED)
    in_flight: set[int] = set()  # batches that may have been written but not acknowledged
    started = time.monotonic()
    round_no = 0
    while round_no < ROUNDS or (_last_acked(vault_dir) < MIN_BATCHES and round_no < MAX_ROUNDS):
        proc = _start_writer(vault_dir, log)
        if round_no == 1:
            time.sleep(rng.uniform(0.05, 1.0))  # may land in start-up / Vault.open / recovery
        else:
            _wait_ready(proc, log)
            # past ROUNDS the machine is slow (too few batches yet): longer runs between kills
            time.sleep(rng.uniform(0.2, 2.0) if round_no < ROUNDS else rng.uniform(2.0, 6.0))
        _kill(proc, log)
        in_flight.add(_last_acked(vault_dir) + 1)
        round_no += 1
    acked = cw.acked_batches(str(vault_dir))
    assert acked == list(range(len(acked))), "the writer re-sent or skipped a batch"
    last = acked[-1]
    assert last >= MIN_BATCHES, f"only {last + 1} batches acknowledged: too few to test"

    vault = Vault.open_local(str(vault_dir))
    try:
        left_in_buffer = vault.buffer.depth()[0]
        vault.flush()  # take over what the killed writer left in the durable buffer
        _check_files_hold_each_key_once(vault, in_flight, last)
        report = vault.maintain(now_ms=cw.MAINTAIN_NOWS[1])
        assert report["rollup_pending_hours"] == 0
        assert vault.buffer.depth() == (0, 0)
        series, ts = _check_raw_matches_acknowledged(vault, last)
        _check_rollup_counts(vault, series, ts)
    finally:
        vault.close()
    elapsed = time.monotonic() - started
    print(
        f"\ncrash test: {last + 1} batches / {len(ts)} samples acknowledged over {round_no} kills; "
        f"{left_in_buffer} samples recovered from the buffer, "
        f"in flight at kills: {sorted(in_flight)}; {elapsed:.1f}s"
    )


def _check_files_hold_each_key_once(vault: Vault, in_flight: set[int], last: int) -> None:
    """Before compaction: no flush was applied twice. A key may sit in two files only if it
    was legitimately written twice (a re-sent in-flight batch or a deliberate duplicate)."""
    resent = {b - cw.RESEND_LAG for b in range(last + 2) if b % cw.RESEND_EVERY == 0}
    allowed = np.array(sorted(in_flight | resent), np.int64)
    tables = [
        pq.read_table(f.path, columns=["series_id", "ts"])
        for f in vault.snapshot().tier_files("raw")
    ]
    assert tables, "no raw files"
    sid = np.concatenate([t["series_id"].to_numpy() for t in tables])
    ts = np.concatenate([t["ts"].to_numpy() for t in tables])
    _, first, counts = np.unique(
        np.stack([sid, ts], axis=1), axis=0, return_index=True, return_counts=True
    )
    twice = ts[first[counts > 1]]
    bad = np.setdiff1d(np.unique(_batch_of(twice)), allowed)
    assert bad.size == 0, f"keys of batches {bad[:10]} are stored twice: a flush was repeated"


def _check_raw_matches_acknowledged(vault: Vault, last: int) -> tuple[np.ndarray, np.ndarray]:
    """The raw samples are exactly the acknowledged batches (plus, whole or not at all, the
    batch in flight at the last kill), each (series, ts) once, values bit-exact."""
    end = cw.T0 + (last + 2) * cw.WINDOW_MS
    got = vault.query('{__name__=~"load|work_total"}', cw.T0, end, output="arrow")
    series = _series_index(got["metric"].to_pylist(), got["host"].to_pylist())
    ts = pc.cast(got["timestamp"], "int64").to_numpy()
    keys = _keys(series, ts)
    values = got["value"].to_numpy()
    _, counts = np.unique(keys, return_counts=True)
    assert (counts == 1).all(), f"{int((counts > 1).sum())} keys returned more than once"
    extra = np.unique(_batch_of(ts[_batch_of(ts) > last]))
    assert set(extra.tolist()) <= {last + 1}, f"unacknowledged batches {extra} are stored"
    batches = list(range(last + 1)) + ([last + 1] if extra.size else [])
    want_keys, want_values = _expected(batches)
    missing = np.setdiff1d(want_keys, keys)
    assert missing.size == 0, (
        f"{missing.size} acknowledged samples lost, e.g. in batches "
        f"{np.unique(_batch_of(missing // cw.N_SERIES))[:10]}"
    )
    order = np.argsort(keys, kind="stable")
    assert np.array_equal(keys[order], want_keys), "stored keys differ from written keys"
    assert np.array_equal(values[order].view(np.int64), want_values.view(np.int64)), (
        "stored values differ from written values"
    )
    return series, ts


def _check_rollup_counts(vault: Vault, series: np.ndarray, ts: np.ndarray) -> None:
    """Per (series, minute) and (series, hour), rollup counts equal the raw sample counts."""
    start, end = cw.T0, -(-(int(ts.max()) + 1) // HOUR) * HOUR
    for step, width in (("1m", MINUTE), ("1h", HOUR)):
        want_keys, want_counts = np.unique(
            np.stack([series, ts // width * width], axis=1), axis=0, return_counts=True
        )
        got = vault.query(
            '{__name__=~"load|work_total"}', start, end, step=step, aggs=("count",), output="arrow"
        )
        got_series = _series_index(got["metric"].to_pylist(), got["host"].to_pylist())
        got_ts = pc.cast(got["timestamp"], "int64").to_numpy()
        order = np.lexsort((got_ts, got_series))
        got_keys = np.stack([got_series[order], got_ts[order]], axis=1)
        assert np.array_equal(got_keys, want_keys), f"{step}: rollup buckets differ from raw"
        got_counts = got["count"].to_numpy()[order]
        assert np.array_equal(got_counts, want_counts), f"{step}: rollup counts differ from raw"
    total = len(ts)
    tiers = vault.sql(
        "SELECT (SELECT count(*) FROM raw) AS raw, (SELECT sum(count) FROM rollup_1m) AS m, "
        "(SELECT sum(count) FROM rollup_1h) AS h",
        output="arrow",
    ).to_pylist()[0]
    assert tiers == {"raw": total, "m": total, "h": total}, f"stored rows per tier: {tiers}"
