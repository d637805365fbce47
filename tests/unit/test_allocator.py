"""A server process keeps the large blocks its queries free (metricvault.allocator): the
next query's arrays of megabytes reuse them instead of faulting every page in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from metricvault import allocator

# a child process: arrays of 8 MB filled and freed 20 times, the page faults of the last 10
CHILD = """
import json, resource, sys
import numpy as np
from metricvault import allocator
kept = allocator.keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for i in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(1 << 20)
    a[:] = i
    b = np.empty(1 << 20)
    b[:] = a
    del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": sum(faults[10:])}))
"""


def _child(mode: str, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60,
        check=True, env=env,
    )  # fmt: skip
    out: dict[str, object] = json.loads(done.stdout)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    default = _child("default")
    kept = _child("keep")
    assert kept["kept"] is True
    # 10 rounds of two 8 MB arrays: ~10,000 faults with glibc's defaults (blocks mmapped and
    # unmapped, or trimmed off the heap), none once the thresholds keep them
    assert isinstance(default["faults"], int) and default["faults"] > 5_000
    assert isinstance(kept["faults"], int) and kept["faults"] < 1_000


def test_the_operators_own_malloc_tunables_are_left_as_they_are() -> None:
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        assert allocator.keep_freed_memory(env={name: "1"}) is False
