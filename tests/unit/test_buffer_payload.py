"""The ingest buffer's batches: lz4-compressed Arrow IPC, read back exactly, also batches
written uncompressed; and the payload bytes the write path's backpressure check uses
(``approx_bytes``) follow appends and flushes without summing the file on every write."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from metricvault.model import SAMPLE_SCHEMA
from metricvault.store.buffer import IngestBuffer


def _batch(series_id: int, rows: int = 100) -> pa.Table:
    return pa.table(
        [
            pa.array([series_id] * rows, pa.int64()),
            pa.array([1_700_000_000_000 + i for i in range(rows)], pa.int64()),
            pa.array([float(i % 7) for i in range(rows)], pa.float64()),
        ],
        schema=SAMPLE_SCHEMA,
    )


def _plain_payload(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=None)
    with ipc.new_stream(sink, SAMPLE_SCHEMA, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_batches_are_stored_compressed_and_uncompressed_batches_read_too(tmp_path: Path) -> None:
    buffer = IngestBuffer(tmp_path / "buffer.sqlite")
    buffer.append(_batch(1), [])
    with sqlite3.connect(tmp_path / "buffer.sqlite") as db:
        (payload,) = db.execute("SELECT payload FROM batches").fetchone()
        reader = ipc.open_stream(pa.py_buffer(payload))
        assert reader.read_all().equals(_batch(1))
        assert len(payload) < len(_plain_payload(_batch(1)))
        db.execute(
            "INSERT INTO batches (samples, payload) VALUES (?, ?)", (100, _plain_payload(_batch(2)))
        )
    pending = buffer.pending(0, 10_000)
    assert pending is not None
    assert pending.samples.equals(pa.concat_tables([_batch(1), _batch(2)]))
    buffer.close()


def test_approx_bytes_follows_appends_and_flushes(tmp_path: Path) -> None:
    buffer = IngestBuffer(tmp_path / "buffer.sqlite")
    assert buffer.approx_bytes() == 0
    buffer.append(_batch(1), [])
    buffer.append(_batch(2), [])
    assert buffer.approx_bytes() == buffer.depth()[1] > 0
    seq = buffer.append(_batch(3), [])
    assert buffer.approx_bytes() == buffer.depth()[1]
    buffer.discard_through(seq - 1)
    assert buffer.approx_bytes() == buffer.depth()[1] > 0
    buffer.discard_through(seq)
    assert buffer.approx_bytes() == buffer.depth()[1] == 0
    buffer.close()
