"""Write deterministic batches into a vault until killed; used by tests/e2e/test_crash.py.

Usage: ``python tests/e2e/crash_writer.py VAULT_DIR SEED N``

Writes batches ``start .. N-1``, where ``start`` is one past the last batch named in the
acknowledgement log ``VAULT_DIR.acked`` (so a restarted writer re-sends the batch that may have
been in flight when it was killed). After each ``vault.write`` returns, the batch number is
appended to the log and fsynced: a line there means "the store acknowledged this batch".
Every ``RESEND_EVERY``-th batch also re-sends batch ``b - RESEND_LAG`` (a duplicate delivery)
before it is acknowledged, and every ``MAINTAIN_EVERY`` batches the writer runs ``maintain``
(compaction and rollups) itself, alternating its ``now``. Prints ``ready`` once the vault is open.

Batch ``b`` holds 100..1000 samples with distinct ``(series, ts)`` keys, in random order, all
inside its own 5-minute window ``[T0 + b * WINDOW_MS, T0 + (b + 1) * WINDOW_MS)``; the same
``(SEED, b)`` always gives the same samples.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW_MS = 300_000
SLOT_MS = 100
N_SERIES = 8  # series s: metric "load" (gauge) for even s, "work_total" (counter) for odd s
RESEND_EVERY = 7
RESEND_LAG = 3
MAINTAIN_EVERY = 40
# maintain's "now": alternately T0 (every day still open: compaction merges small files only)
# and T0 + 10 d (days closed: merged whole); raw retention (30 d) keeps everything either way
MAINTAIN_NOWS = (T0, T0 + 10 * 86_400_000)
FLUSH_MAX_SAMPLES = 5_000


def series_name(s: int) -> tuple[str, str]:
    return ("work_total" if s % 2 else "load", f"node{s:02d}")


def batch_arrays(seed: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(series index, ts ms, value) of batch ``b``."""
    rng = np.random.default_rng([seed, b])
    size = int(rng.integers(100, 1001))
    slots = rng.choice(N_SERIES * (WINDOW_MS // SLOT_MS), size=size, replace=False)
    series = (slots % N_SERIES).astype(np.int64)
    ts = T0 + b * WINDOW_MS + (slots // N_SERIES).astype(np.int64) * SLOT_MS
    values = np.round(rng.normal(0, 1000, size), int(rng.integers(0, 5)))
    return series, ts, values


def batch_table(seed: int, b: int) -> pa.Table:
    series, ts, values = batch_arrays(seed, b)
    names = [series_name(int(s)) for s in series]
    return pa.table(
        {
            "metric": pa.array([m for m, _ in names], pa.string()),
            "host": pa.array([h for _, h in names], pa.string()),
            "timestamp": pa.array(ts, pa.int64()),
            "value": pa.array(values, pa.float64()),
        }
    )


def ack_path(vault_dir: str) -> Path:
    return Path(f"{vault_dir.rstrip('/')}.acked")


def acked_batches(vault_dir: str) -> list[int]:
    """Batch numbers in the log; a torn last line (no newline) is not an acknowledgement."""
    path = ack_path(vault_dir)
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1]  # the part after the last newline is incomplete
    return [int(line) for line in lines if line]


def main(vault_dir: str, seed: int, n: int) -> None:
    from metricvault.store.vault import Vault

    done = acked_batches(vault_dir)
    start = done[-1] + 1 if done else 0
    vault = Vault.open_local(vault_dir, flush_max_samples=FLUSH_MAX_SAMPLES)
    print("ready", start, flush=True)
    fd = os.open(ack_path(vault_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for b in range(start, n):
        vault.write(batch_table(seed, b))
        if b % RESEND_EVERY == 0 and b >= RESEND_LAG:
            vault.write(batch_table(seed, b - RESEND_LAG))
        os.write(fd, f"{b}\n".encode())
        os.fsync(fd)
        if b % MAINTAIN_EVERY == MAINTAIN_EVERY - 1:
            vault.maintain(now_ms=MAINTAIN_NOWS[b // MAINTAIN_EVERY % 2])
    os.close(fd)
    vault.close()
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
