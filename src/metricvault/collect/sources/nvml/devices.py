"""Device discovery: each GPU's handle and its constant dcgm-exporter labels, read once."""

from __future__ import annotations

from metricvault.collect.sources._labels import gpu_labels
from metricvault.collect.sources.nvml.calls import NvmlCalls, _Gpu, _GpuLost, _text, log, pynvml


class DeviceDiscovery(NvmlCalls):
    """Finds the GPUs (``_discover``); needs ``_hostname`` and ``_hostname_label``."""

    _hostname: str
    _hostname_label: str

    def _discover(self) -> list[_Gpu]:
        gpus = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            gpu = self._describe(index)
            if gpu is not None:
                gpus.append(gpu)
        return gpus

    def _describe(self, index: int) -> _Gpu | None:
        """The GPU's handle and its constant labels, read once."""
        key = f"GPU {index}"
        labels = self._labels(index, "", "", "")
        try:
            handle = self._call(key, "device handle", "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                return None  # logged; without a handle there is nothing to read
            uuid = self._call(key, "UUID label", "nvmlDeviceGetUUID", handle)
            model = self._call(key, "modelName label", "nvmlDeviceGetName", handle)
            pci = self._call(key, "pci_bus_id label", "nvmlDeviceGetPciInfo", handle)
        except _GpuLost:
            # Handles of a lost GPU stay invalid until a reset and a driver reload.
            log.warning("%s is lost (fallen off the bus); it reports metricvault_gpu_lost", key)
            return _Gpu(index, None, key, labels)
        bus_id = _text(pci.busId) if pci is not None else ""
        labels = self._labels(index, _text(uuid), bus_id, _text(model))
        if uuid:
            key = f"{key} ({_text(uuid)})"
        return _Gpu(index, handle, key, labels)

    def _labels(self, index: int, uuid: str, bus_id: str, model: str) -> dict[str, str]:
        return gpu_labels(
            index=index,
            uuid=uuid,
            pci_bus_id=bus_id,
            model_name=model,
            hostname=self._hostname,
            hostname_label=self._hostname_label,
        )
