"""Kubernetes pod labels on the GPU series: ``namespace``, ``pod``, ``container`` (as
dcgm-exporter adds them) and ``pod_uid``, ``container_id``.

`PodLabels` wraps a GPU source (`NvmlSource`, `SimulatedGpuSource`) and adds, per scrape:

- to a GPU's series (those with a ``UUID`` label): ``namespace``, ``pod``, ``container`` of the
  one container the kubelet's pod-resources API says holds that GPU. A GPU shared by several
  containers (time-slicing, MPS) gets none: which one a reading belongs to is unknown.
- to a GPU process's series (``metricvault_gpu_process_*``, with a ``pid`` label):
  ``pod_uid`` and ``container_id`` from the process's cgroup path (`cgroup`), and, when the
  process is in a pod and its GPU has one holder, that holder's ``namespace``/``pod``/
  ``container``. The process is mapped to its pod through the GPU it uses, since the
  pod-resources API gives neither pod UIDs nor container ids.
- without the pod-resources socket (or without ``grpcio``): cgroups only. A GPU whose processes
  all run in one container gets that container's ``pod_uid`` and ``container_id``.

MIG instance series (``GPU_I_ID``) and their GPU's own series get no pod labels: pod-resources
names MIG devices by MIG UUIDs, which the GPU sources do not export (their processes still get
``pod_uid``/``container_id`` from their cgroups). Off a Kubernetes node (no socket, no process in
a ``kubepods`` cgroup) every series stays exactly as the wrapped source made it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from metricvault.collect.families import Metric
from metricvault.collect.sources import FastReading, Source
from metricvault.collect.sources.kubernetes.cgroup import CgroupRef, read_process
from metricvault.collect.sources.kubernetes.podresources import (
    DEFAULT_SOCKET,
    PodContainer,
    PodResourcesClient,
    grpc_available,
)

__all__ = ["DEFAULT_SOCKET", "KUBERNETES_LABELS", "MODES", "PodLabels", "with_pod_labels"]

log = logging.getLogger(__name__)

MODES = ("auto", "off")
KUBERNETES_LABELS = ("namespace", "pod", "container", "pod_uid", "container_id")
_UUID = "UUID"
_PID = "pid"
_MIG_ID = "GPU_I_ID"


def with_pod_labels(
    sources: Sequence[Source],
    mode: str = "auto",
    *,
    socket: Path = DEFAULT_SOCKET,
    proc_root: Path = Path("/proc"),
) -> list[Source]:
    """The GPU sources, each wrapped in `PodLabels` unless ``mode`` is ``"off"``."""
    if mode not in MODES:
        raise ValueError(f"kubernetes mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "off":
        return list(sources)
    return [PodLabels(source, socket=socket, proc_root=proc_root) for source in sources]


class PodLabels:
    """A GPU source whose series carry the pods that hold the GPUs (see the module doc)."""

    def __init__(
        self,
        inner: Source,
        *,
        socket: Path = DEFAULT_SOCKET,
        proc_root: Path = Path("/proc"),
        timeout_s: float = 2.0,
    ) -> None:
        self.name = inner.name
        self._inner = inner
        self._socket = Path(socket)
        self._proc_root = Path(proc_root)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: PodResourcesClient | None = None
        self._no_grpc_logged = False
        self._failing = False
        self._no_socket_logged = False
        self._cgroups: dict[int, CgroupRef | None] = {}
        self._device_extra: dict[str, tuple[tuple[str, str], ...]] = {}
        self._fast_cache: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}

    # -- the Source protocol ------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        families = list(self._inner.collect())
        with self._lock:
            holders = self._holders()
            self._label(families, holders)
        return families

    def fast_readings(self) -> Sequence[FastReading]:
        readings = self._inner.fast_readings()
        extra = self._device_extra
        if not extra:
            return readings
        out = []
        cache = self._fast_cache
        for reading in readings:
            pairs = cache.get(reading.labels)
            if pairs is None:
                uuid = dict(reading.labels).get(_UUID, "")
                added = extra.get(uuid, ())
                pairs = tuple(sorted({**dict(added), **dict(reading.labels)}.items()))
                cache[reading.labels] = pairs
            out.append(FastReading(reading.metric, pairs, reading.value))
        return out

    def start(self) -> None:
        starter = getattr(self._inner, "start", None)
        if callable(starter):
            starter()

    def close(self) -> None:
        self._inner.close()
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- pod-resources ------------------------------------------------------------------------

    def _holders(self) -> dict[str, set[PodContainer]]:
        """GPU UUID -> its holders per the kubelet; {} without the socket or on an error."""
        client = self._connect()
        if client is None:
            return {}
        try:
            holders = client.gpu_holders()
        except Exception as err:  # grpc.RpcError: the kubelet restarting, a denied socket
            if not self._failing:
                log.warning(
                    "pod-resources List on %s failed (%s); GPU series get pod labels from "
                    "cgroups only until it answers",
                    self._socket,
                    _rpc_message(err),
                )
            self._failing = True
            return {}
        if self._failing:
            log.warning("pod-resources on %s answers again", self._socket)
        self._failing = False
        return holders

    def _connect(self) -> PodResourcesClient | None:
        if self._client is not None:
            return self._client
        if not self._socket.exists():
            return None
        if not grpc_available():
            if not self._no_grpc_logged:
                log.warning(
                    "the kubelet's pod-resources socket %s is there but grpcio is not installed "
                    "(pip install 'metricvault[kubernetes]'): GPU series get pod_uid and "
                    "container_id from cgroups only, no namespace/pod/container",
                    self._socket,
                )
                self._no_grpc_logged = True
            return None
        self._client = PodResourcesClient(self._socket, timeout_s=self._timeout_s)
        return self._client

    # -- labelling ----------------------------------------------------------------------------

    def _label(self, families: list[Metric], holders: Mapping[str, set[PodContainer]]) -> None:
        seen: dict[int, CgroupRef | None] = {}
        on_gpu: dict[str, set[CgroupRef | None]] = {}  # UUID -> containers of its processes
        mig: set[str] = set()
        for family in families:
            for sample in family.samples:
                uuid = sample.labels.get(_UUID, "")
                if _MIG_ID in sample.labels:
                    mig.add(uuid)
                pid = _pid(sample.labels)
                if pid is not None:
                    ref = seen[pid] = self._cgroup(pid)
                    on_gpu.setdefault(uuid, set()).add(ref)
        self._cgroups = {pid: ref for pid, ref in self._cgroups.items() if pid in seen}
        self._warn_without_socket(seen)
        device = _device_labels(holders, on_gpu, mig)
        for family in families:
            family.samples = [
                sample._replace(labels=self._sample_labels(sample.labels, device, holders, mig))
                for sample in family.samples
            ]
        pairs = {uuid: tuple(sorted(extra.items())) for uuid, extra in device.items()}
        if pairs != self._device_extra:
            self._device_extra = pairs
            self._fast_cache = {}

    def _sample_labels(
        self,
        labels: dict[str, str],
        device: Mapping[str, dict[str, str]],
        holders: Mapping[str, set[PodContainer]],
        mig: set[str],
    ) -> dict[str, str]:
        uuid = labels.get(_UUID, "")
        pid = _pid(labels)
        if pid is not None:
            ref = self._cgroups.get(pid)
            if ref is None:
                return labels  # not in a pod (or gone): a host process keeps its labels
            extra = ref.labels()
            holder = _one(holders.get(uuid))
            if holder is not None and uuid not in mig:
                extra.update(holder.labels())
        elif _MIG_ID in labels:
            return labels
        else:
            extra = dict(device.get(uuid, {}))
        if not extra:
            return labels
        return {**extra, **labels}  # a label the source set itself is never overwritten

    def _cgroup(self, pid: int) -> CgroupRef | None:
        if pid not in self._cgroups:
            self._cgroups[pid] = read_process(self._proc_root, pid)
        return self._cgroups[pid]

    def _warn_without_socket(self, seen: Mapping[int, CgroupRef | None]) -> None:
        if self._no_socket_logged or self._client is not None or self._no_grpc_logged:
            return
        if any(ref is not None for ref in seen.values()):
            log.warning(
                "GPU processes run in Kubernetes pods but the kubelet's pod-resources socket %s "
                "is not mounted: they are labelled with pod_uid and container_id only",
                self._socket,
            )
            self._no_socket_logged = True

    # The wrapped source's own methods (e.g. NvmlSource's) stay reachable.
    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _device_labels(
    holders: Mapping[str, set[PodContainer]],
    on_gpu: Mapping[str, set[CgroupRef | None]],
    mig: set[str],
) -> dict[str, dict[str, str]]:
    """UUID -> the pod labels of that GPU's own series."""
    device: dict[str, dict[str, str]] = {}
    for uuid in set(holders) | set(on_gpu):
        if uuid in mig:
            continue
        holder = _one(holders.get(uuid))
        if holder is not None:
            device[uuid] = holder.labels()
            continue
        if uuid in holders:
            continue  # shared by several containers: which one a reading is of is unknown
        ref = _one(on_gpu.get(uuid))
        if ref is not None:
            device[uuid] = ref.labels()
    return device


def _rpc_message(err: Exception) -> str:
    """A gRPC error's status and details ("UNAVAILABLE: connect failed"), else its text."""
    code, details = getattr(err, "code", None), getattr(err, "details", None)
    if callable(code) and callable(details):
        return f"{getattr(code(), 'name', code())}: {details()}"
    return str(err)


def _pid(labels: Mapping[str, str]) -> int | None:
    pid = labels.get(_PID)
    return int(pid) if pid is not None and pid.isdigit() else None


def _one(items: set[Any] | None) -> Any:
    if items is not None and len(items) == 1:
        return next(iter(items))
    return None
