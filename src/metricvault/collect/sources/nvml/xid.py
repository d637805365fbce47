"""XID errors: NVML events waited for on a background thread, counted per GPU and XID."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from metricvault.collect.sources.nvml.calls import (
    NvmlCalls,
    _code,
    _describe,
    _Gpu,
    _GpuLost,
    _Sink,
    _text,
    log,
    pynvml,
)

XID_WAIT_MS = 500  # how long the event thread blocks in NVML before checking for close()


class _XidWatcher:
    """Waits for XID events on a thread; keeps the last XID per GPU and counts them by XID."""

    def __init__(self, source: NvmlCalls, gpus: Sequence[_Gpu]) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._last: dict[int, int] = {}  # GPU index -> last XID (0 until one happens)
        self._counts: dict[tuple[int, int], int] = {}  # (GPU index, XID) -> events
        self._by_uuid = {gpu.labels.get("UUID", ""): gpu.index for gpu in gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._events = source._call("NVML", "XID events", "nvmlEventSetCreate")
        except _GpuLost:
            self._events = None
        if self._events is None:
            return
        for gpu in gpus:
            if gpu.handle is not None and self._register(gpu):
                self._last[gpu.index] = 0
        if not self._last:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _register(self, gpu: _Gpu) -> bool:
        try:
            pynvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, self._events
            )
        except Exception as err:  # e.g. NVML_ERROR_NOT_SUPPORTED: the metric is absent
            self._source._skip_once(
                "DCGM_FI_DEV_XID_ERRORS", gpu.key, "nvmlDeviceRegisterEvents", err
            )
            return False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = pynvml.nvmlEventSetWait_v2(self._events, XID_WAIT_MS)
            except Exception as err:
                if _code(err) != pynvml.NVML_ERROR_TIMEOUT:
                    self._source._skip_once("XID events", "NVML", "nvmlEventSetWait_v2", err)
                    self._stop.wait(1.0)  # a persistent error must not spin
                continue
            if int(event.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                self._record(event)

    def _record(self, event: Any) -> None:
        index = self._gpu_of(event.device)
        if index is None:
            return  # an event of a device this source does not export
        xid = int(event.eventData)
        log.warning("GPU %d: XID %d (see NVIDIA's XID catalogue for what it means)", index, xid)
        with self._lock:
            self._last[index] = xid
            self._counts[(index, xid)] = self._counts.get((index, xid), 0) + 1

    def _gpu_of(self, device: Any) -> int | None:
        """The index of the GPU an event came from; handles are pointers, so match the UUID.

        An event of a MIG instance may carry the instance's handle ("MIG-..." UUID): its
        parent GPU is the one to count it on.
        """
        try:
            index = self._by_uuid.get(_text(pynvml.nvmlDeviceGetUUID(device)))
            if index is not None:
                return index
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
            return self._by_uuid.get(_text(pynvml.nvmlDeviceGetUUID(parent)))
        except Exception:
            return None

    def export(self, gpu: _Gpu, sink: _Sink) -> None:
        with self._lock:
            if gpu.index not in self._last:
                return  # events are not supported on this GPU: the metric is absent
            sink.add("DCGM_FI_DEV_XID_ERRORS", self._last[gpu.index])
            counts = [(xid, n) for (index, xid), n in self._counts.items() if index == gpu.index]
        for xid, n in sorted(counts):
            sink.add("metricvault_gpu_xid_errors_total", n, {"xid": str(xid)})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=XID_WAIT_MS / 1000 + 2.0)
            if self._thread.is_alive():
                return  # still inside NVML: freeing the set under it would be worse than a leak
        self._free()

    def _free(self) -> None:
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except Exception as err:
                log.debug("nvmlEventSetFree failed: %s", _describe(err))
            self._events = None
