"""Calling NVML: one place that turns every failure into "left out, logged once".

A failing call returns None and logs one line per (what, GPU) for the life of the source; a
GPU that NVML reports lost raises `_GpuLost`, which the scrape turns into
``metricvault_gpu_lost 1``. Also the per-GPU state (`_Gpu`) and one scrape's samples (`_Sink`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metricvault.collect.sources._labels import label_pairs

try:
    import pynvml as pynvml  # type: ignore[import-untyped]  # the one import: modules share it
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency; the constructor says so
    pynvml = None

log = logging.getLogger(__name__)


class _GpuLost(Exception):
    """NVML said NVML_ERROR_GPU_IS_LOST: the GPU's other metrics are left out of this scrape."""


@dataclass
class _Gpu:
    index: int
    handle: Any  # None when NVML could not give one (the GPU was lost at start)
    key: str  # "GPU 0 (GPU-8a1c...)", for log lines
    labels: dict[str, str]
    pairs: tuple[tuple[str, str], ...] = ()
    process_ts: int = 0  # newest per-process utilisation sample seen (NVML µs timestamp)

    def __post_init__(self) -> None:
        self.pairs = label_pairs(self.labels)


@dataclass
class _Sink:
    """One GPU's samples for one scrape; kept apart until the scrape knows the GPU is not lost."""

    labels: Mapping[str, str]
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, metric: str, value: float, extra: Mapping[str, str] | None = None) -> None:
        labels = {**self.labels, **extra} if extra else dict(self.labels)
        self.samples.append((metric, labels, float(value)))


class NvmlCalls:
    """``_call`` and ``_skip_once``, shared by discovery, readings, processes and XID events."""

    def __init__(self) -> None:
        self._skip_lock = threading.Lock()
        self._skipped: set[tuple[str, str]] = set()

    def _call(
        self, key: str, what: str, function: str, *args: Any, quiet: bool | Collection[int] = False
    ) -> Any:
        """``pynvml.<function>(*args)``, or None if it fails; raises `_GpuLost` for a lost GPU.

        A failure is logged once per (what, key), except where ``quiet`` says it is normal:
        ``True`` for any error (a probe with a fallback), or the NVML_ERROR_* codes that are.
        """
        try:
            return getattr(pynvml, function)(*args)
        except Exception as err:  # NVMLError, NVMLLibraryMismatchError, a missing binding
            code = _code(err)
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(key) from err
            if quiet is not True and (quiet is False or code not in quiet):
                self._skip_once(what, key, function, err)
            return None

    def _skip_once(self, what: str, key: str, function: str, err: object) -> None:
        with self._skip_lock:  # scrapes, fast readings and the XID thread all get here
            if (what, key) in self._skipped:
                return
            self._skipped.add((what, key))
        expected = _code(err) in (
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        )
        log.log(
            logging.INFO if expected else logging.WARNING,
            "%s: %s left out: %s failed: %s (logged once; tried again at every scrape)",
            key, what, function, _describe(err),
        )  # fmt: skip


def _code(err: object) -> int | None:
    """The NVML_ERROR_* code of an NVMLError; None for other exceptions."""
    if pynvml is not None and isinstance(err, pynvml.NVMLError):
        return int(err.value)
    return None


def _describe(err: object) -> str:
    try:
        return str(err) or type(err).__name__
    except Exception:  # NVMLError.__str__ asks the library, which may be gone
        return repr(err)


def _init_failure(err: Exception) -> str:
    hints = {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "no NVIDIA kernel driver is loaded",
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
            "the NVML library and the kernel driver have different versions "
            "(was the driver updated without a reboot?)"
        ),
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices",
    }
    hint = hints.get(_code(err) or -1, "")
    detail = f"{hint}: {_describe(err)}" if hint else _describe(err)
    return f"NVML is not available ({detail}); no GPU metrics from NVML"


def _shutdown_quietly() -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception as err:
        log.debug("nvmlShutdown failed: %s", _describe(err))


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _read_text(path: Path) -> str:
    """A /proc file's text, or "" where it is gone or not ours to read."""
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""
