"""Per-process attribution: GPU memory and SM utilisation per pid, labelled with the process
name and the experiment/job its environment names (``proc_root/<pid>/environ``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from metricvault.collect.sources.nvml.calls import NvmlCalls, _Gpu, _read_text, _Sink, pynvml

# Environment variables of a GPU process that attribute it to an experiment or a batch job.
DEFAULT_ENV_LABELS: Mapping[str, str] = {
    "METRICVAULT_EXPERIMENT": "experiment",
    "SLURM_JOB_ID": "job",
}


class ProcessAttribution(NvmlCalls):
    """``metricvault_gpu_process_*`` series; labels cached while a pid uses a GPU."""

    _proc_root: Path
    _env_labels: dict[str, str]
    _process_labels: dict[int, dict[str, str]]
    _pids_seen: set[int]

    def _process_metrics(self, gpu: _Gpu, sink: _Sink) -> None:
        metric = "metricvault_gpu_process_memory_bytes"
        running = self._call(gpu.key, metric, "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        memory: dict[int, float] = {}
        for process in running or ():
            used = process.usedGpuMemory  # None where the driver cannot tell (e.g. WDDM)
            if used is not None:
                # A process appears once per MIG compute instance it uses: one series per pid.
                memory[int(process.pid)] = memory.get(int(process.pid), 0.0) + float(used)
        utilisation = self._process_utilisation(gpu)
        for pid in sorted(set(memory) | set(utilisation)):
            extra = self._labels_of_process(pid)
            if pid in memory:
                sink.add(metric, memory[pid], extra)
            if pid in utilisation:
                sink.add("metricvault_gpu_process_sm_util", utilisation[pid], extra)

    def _process_utilisation(self, gpu: _Gpu) -> dict[int, float]:
        """Mean SM utilisation per pid over the samples NVML took since the previous scrape."""
        # No new samples: NVML says NOT_FOUND (pynvml raises "SUCCESS" when it found none at all).
        no_samples = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS)
        samples = self._call(
            gpu.key, "metricvault_gpu_process_sm_util", "nvmlDeviceGetProcessUtilization",
            gpu.handle, gpu.process_ts, quiet=no_samples,
        )  # fmt: skip
        sums: dict[int, tuple[float, int]] = {}
        for sample in samples or ():
            if int(sample.timeStamp) <= gpu.process_ts:
                continue
            total, count = sums.get(int(sample.pid), (0.0, 0))
            sums[int(sample.pid)] = (total + float(sample.smUtil), count + 1)
        if samples:
            gpu.process_ts = max(gpu.process_ts, *(int(s.timeStamp) for s in samples))
        return {pid: total / count for pid, (total, count) in sums.items()}

    def _labels_of_process(self, pid: int) -> dict[str, str]:
        """pid, process_name and the attribution labels, cached while the pid uses a GPU."""
        self._pids_seen.add(pid)
        cached = self._process_labels.get(pid)
        if cached is not None:
            return cached
        labels = {"pid": str(pid)}
        name = _read_text(self._proc_root / str(pid) / "comm").strip()
        if name:
            labels["process_name"] = name
        environ = _read_text(self._proc_root / str(pid) / "environ")
        for entry in environ.split("\0"):
            variable, _, value = entry.partition("=")
            label = self._env_labels.get(variable)
            if label and value and label not in labels:
                labels[label] = value
        self._process_labels[pid] = labels
        return labels
