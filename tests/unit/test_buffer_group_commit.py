"""The ingest buffer's group commit: appends that queue while a commit is in progress share
the next one (one transaction, one fsync), each returns only once its batch is committed, and
a failed commit fails every batch it held and stores none of them."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from metricvault.errors import StorageError
from metricvault.model import SAMPLE_SCHEMA
from metricvault.store.buffer import IngestBuffer


def _batch(series_id: int, rows: int = 3) -> pa.Table:
    return pa.table(
        [
            pa.array([series_id] * rows, pa.int64()),
            pa.array([1_700_000_000_000 + i for i in range(rows)], pa.int64()),
            pa.array([float(i) for i in range(rows)], pa.float64()),
        ],
        schema=SAMPLE_SCHEMA,
    )


def _wait_until(condition: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _append_in_threads(
    buffer: IngestBuffer, count: int
) -> tuple[list[threading.Thread], dict[int, int | BaseException]]:
    results: dict[int, int | BaseException] = {}

    def one(i: int) -> None:
        try:
            results[i] = buffer.append(_batch(i), [(i, "m", f'{{"i":"{i}"}}', "gauge")])
        except BaseException as exc:  # recorded for the assertions
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


@pytest.mark.parametrize("writers", [2, 8])
def test_appends_queued_during_a_commit_share_the_next_commit(tmp_path: Path, writers: int):
    buffer = IngestBuffer(tmp_path / "buffer.sqlite")
    buffer.append(_batch(0), [])  # creates the file
    commits_before = buffer.commits
    with buffer._lock:  # a commit in progress: the first writer leads and waits here
        threads, results = _append_in_threads(buffer, writers)
        _wait_until(lambda: len(buffer._queue) == writers - 1, "the other writers to queue")
        assert not results  # nobody is acknowledged before its commit
    for thread in threads:
        thread.join(timeout=30)
    seqs = sorted(results.values())  # type: ignore[type-var]
    assert all(isinstance(seq, int) for seq in seqs) and len(set(seqs)) == writers
    assert buffer.commits - commits_before == 2  # the leader's own, then all the queued ones
    pending = buffer.pending(0, 10**9)
    assert pending is not None and pending.samples.num_rows == 3 * (writers + 1)
    assert sorted(pending.series["series_id"].to_pylist()) == list(range(writers))
    buffer.close()


def test_a_failed_group_commit_fails_every_batch_in_it_and_stores_none(tmp_path: Path):
    buffer = IngestBuffer(tmp_path / "buffer.sqlite")
    buffer.append(_batch(0), [])
    blocker = sqlite3.connect(tmp_path / "buffer.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the database: the commit fails
    buffer._db.execute("PRAGMA busy_timeout=50")
    with buffer._lock:
        threads, results = _append_in_threads(buffer, 4)
        _wait_until(lambda: len(buffer._queue) == 3, "the other writers to queue")
    for thread in threads:
        thread.join(timeout=30)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert len(results) == 4
    assert all(isinstance(outcome, StorageError) for outcome in results.values())
    assert buffer.last_seq() == 1  # only the batch before the failure
    assert buffer.append(_batch(9), []) == 2  # and the buffer still takes writes
    buffer.close()
