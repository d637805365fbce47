"""Modules compiled with numba, loaded on a thread: until one is ready its callers use numpy.

A module named here defines its functions with ``numba.njit(cache=True)`` and a ``warm()``
that calls each once. :func:`start` imports and warms it on a background thread (numba
compiles, or loads its on-disk cache: ~1 s, ~5 s the first time on a machine) and returns the
module once that has finished, None before (and forever where numba cannot load, with one
warning in the log), so no caller waits for the compiler and every caller keeps a numpy path.
Servers start their modules when they start; a one-shot command never imports numba.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import threading
from types import ModuleType

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_READY: dict[str, ModuleType] = {}
_THREADS: dict[str, threading.Thread] = {}


def _load(name: str) -> None:
    try:
        module = importlib.import_module(name)
        module.warm()
    except Exception as exc:  # no numba here, its compiler failed, no file descriptor left
        log.warning("%s is not available (%s): numpy computes instead", name, exc)
        return
    _READY[name] = module


def ready(name: str) -> ModuleType | None:
    """The compiled module ``name`` if a :func:`start` has loaded it, else None (loads
    nothing: a one-shot command never waits for, nor pays for, the compiler)."""
    return _READY.get(name)


def start(name: str, wait: bool = False) -> ModuleType | None:
    """The compiled module ``name`` if it is ready, else None (its loading started on a
    thread the first time); ``wait``: block until it is loaded or has failed."""
    ready = _READY.get(name)
    if ready is not None:
        return ready
    with _LOCK:
        thread = _THREADS.get(name)
        if thread is None:
            thread = _THREADS[name] = threading.Thread(
                target=_load, args=(name,), name=f"compile-{name.rsplit('.', 1)[-1]}", daemon=True
            )
            thread.start()
            # a daemon thread still inside LLVM when the interpreter finalizes can crash it:
            # an exit waits for the compiler (seconds, bounded)
            atexit.register(thread.join, 60)
    if wait:
        thread.join()
    return _READY.get(name)
