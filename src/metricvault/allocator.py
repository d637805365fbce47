"""The C allocator of a server process: freed large blocks kept for the next query.

A PromQL query over days of rollup rows fills numpy arrays of megabytes (a column of a
million rows is 8 MB). glibc's malloc serves such blocks with ``mmap`` and returns them with
``munmap`` when freed (above its mmap threshold, or trimmed off the top of the heap), so the
next query faults every page in again: on the 2-core machine of docs/benchmarks.md a 7-day
histogram panel spent 19-21 ms of its ~140 ms of CPU as system time (the OS kernel's),
~5,000 page faults a query. :func:`keep_freed_memory` raises both thresholds in a server
process (``mallopt``), so blocks up to :data:`MMAP_THRESHOLD` come from the heap and up to
:data:`TRIM_THRESHOLD` of freed heap stays mapped for the next query: faults ~0 a query, the
process's peak resident memory unchanged (what is kept was in use a moment before).
One-shot commands keep glibc's defaults. Where glibc is not the C library, or the operator
set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (glibc's own tunables), nothing
is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 << 20  # freed heap kept mapped, at most
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_TUNABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory(env: dict[str, str] | None = None) -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module's text);
    whether they were set (False: not glibc, or the operator's own tunables kept)."""
    environ = os.environ if env is None else env
    if any(name in environ for name in _TUNABLES):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
    done = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1) and done
    if not done:
        log.warning("mallopt refused the thresholds: glibc's defaults kept")
    return done
