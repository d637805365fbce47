"""Handing freed heap pages back to the OS (glibc's ``malloc_trim``).

CPython frees a query's numpy arrays at once, but glibc keeps the pages in its arenas, so a
worker's RSS stays at its largest query's peak for the rest of its life. A long-lived process
(the agent after start-up, a gateway worker after a query refused by its budget) calls
:func:`release_freed_memory` to give them back. A no-op where libc has no ``malloc_trim``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:  # not glibc: nothing to trim with
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> None:
    """Collect cycles, then return the free pages of every malloc arena to the OS."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
