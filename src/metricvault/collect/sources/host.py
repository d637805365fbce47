"""Host metrics through psutil, under node_exporter's names and labels.

The names match node_exporter's so its dashboards mostly work unchanged. Like node_exporter,
no host label is added: Prometheus adds ``instance`` when it scrapes. In push mode the agent
passes ``extra_labels`` (e.g. ``{"Hostname": "node01"}``), appended to every series.

Each group (cpu, memory, disk I/O, filesystems, network) is read separately: a group psutil
cannot read on this platform is absent, with one log line, and never breaks the others.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import psutil

from metricvault.collect.families import CounterMetricFamily, GaugeMetricFamily, Metric
from metricvault.collect.sources import FastReading
from metricvault.model import label_name_problem

log = logging.getLogger(__name__)

# Filesystems with no disk behind them; node_exporter skips the same kinds by default.
PSEUDO_FSTYPES = frozenset(
    {
        "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
        "devtmpfs", "efivarfs", "fuse.lxcfs", "fusectl", "hugetlbfs", "iso9660", "mqueue",
        "nsfs", "overlay", "proc", "procfs", "pstore", "ramfs", "rpc_pipefs", "securityfs",
        "selinuxfs", "squashfs", "sysfs", "tmpfs", "tracefs",
    }
)  # fmt: skip
# node_exporter's default --collector.diskstats.device-exclude: RAM disks, loop devices, floppies
# and partitions (their whole disk already counts the same I/O, sums would double it).
DEFAULT_DISK_EXCLUDE = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$"
# /proc/stat's guest times are already inside user/nice; node_exporter exports them apart.
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_IDLE_MODES = ("idle", "iowait")

# (node_exporter name without _total, psutil field, help)
_DISK_COUNTERS = (
    ("node_disk_read_bytes", "read_bytes", "Bytes read from the device."),
    ("node_disk_written_bytes", "write_bytes", "Bytes written to the device."),
    ("node_disk_reads_completed", "read_count", "Reads completed."),
    ("node_disk_writes_completed", "write_count", "Writes completed."),
)
_NET_COUNTERS = (
    ("node_network_receive_bytes", "bytes_recv", "Bytes received."),
    ("node_network_transmit_bytes", "bytes_sent", "Bytes sent."),
    ("node_network_receive_packets", "packets_recv", "Packets received."),
    ("node_network_transmit_packets", "packets_sent", "Packets sent."),
    ("node_network_receive_errs", "errin", "Receive errors."),
    ("node_network_transmit_errs", "errout", "Transmit errors."),
    ("node_network_receive_drop", "dropin", "Received packets dropped."),
    ("node_network_transmit_drop", "dropout", "Outgoing packets dropped."),
)
_MEMORY = (
    ("node_memory_MemTotal_bytes", "virtual", "total"),
    ("node_memory_MemAvailable_bytes", "virtual", "available"),
    ("node_memory_MemFree_bytes", "virtual", "free"),
    ("node_memory_Cached_bytes", "virtual", "cached"),
    ("node_memory_Buffers_bytes", "virtual", "buffers"),
    ("node_memory_SwapTotal_bytes", "swap", "total"),
    ("node_memory_SwapFree_bytes", "swap", "free"),
)


def host_load() -> float:
    """1-minute load average per CPU: 0 idle, 1 every core busy, above 1 overloaded.

    Cheap (one syscall each), for the agent's adaptive sampling; 0.0 where unavailable.
    """
    try:
        load1 = psutil.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0
    return float(load1) / (psutil.cpu_count() or 1)


def validate_extra_labels(
    extra_labels: Mapping[str, str] | None, reserved: Collection[str]
) -> dict[str, str]:
    """Check extra label names: valid Prometheus names that do not clash with a source's own."""
    extra = dict(extra_labels or {})
    for name in extra:
        problem = label_name_problem(name)  # the gateway's rule: refused here, not there
        if problem is not None:
            raise ValueError(f"extra label {name!r} is not a valid label name: {problem}")
        if name in reserved:
            raise ValueError(f"extra label {name!r} clashes with a label this source sets")
    return extra


class HostSource:
    """A prometheus-client collector of host metrics (see the module doc)."""

    name = "host"

    def __init__(
        self,
        *,
        extra_labels: Mapping[str, str] | None = None,
        include_fstypes: Collection[str] = (),
        skip_interfaces: Collection[str] = ("lo",),
        disk_exclude: str = DEFAULT_DISK_EXCLUDE,
    ) -> None:
        """``include_fstypes`` re-enables pseudo filesystems (e.g. ``{"tmpfs"}``)."""
        self._extra = validate_extra_labels(
            extra_labels, reserved=("cpu", "mode", "device", "mountpoint", "fstype")
        )
        self._include_fstypes = frozenset(include_fstypes)
        self._skip_interfaces = frozenset(skip_interfaces)
        self._disk_exclude = re.compile(disk_exclude)
        self._warned: set[str] = set()
        self._prev_cpu: tuple[float, float] | None = None  # (busy, total) seconds
        try:
            # Prime, so the first collect's utilisation covers the time since construction.
            self._prev_cpu = _busy_total(psutil.cpu_times(percpu=True))
        except Exception:
            self._prev_cpu = None
        self._last_utilization: float | None = None

    # ------------------------------------------------------------------ Source protocol
    def collect(self) -> Iterator[Metric]:
        groups: tuple[tuple[str, Callable[[], Iterable[Metric]]], ...] = (
            ("cpu", self._cpu),
            ("load", self._load),
            ("memory", self._memory),
            ("disk I/O", self._disk_io),
            ("filesystem", self._filesystems),
            ("network", self._network),
        )
        for group, read in groups:
            try:
                families = list(read())
            except Exception as exc:  # a source never raises out of collect
                self._warn_once(group, "host %s metrics unavailable: %s", group, exc)
                continue
            yield from families

    def fast_readings(self) -> Sequence[FastReading]:
        return []  # host metrics change slowly; nothing to sample at high rate

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        # Scrapes repeat every few seconds; the same complaint each time would flood the log.
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
        # CounterMetricFamily appends _total to the exposed sample name.
        return CounterMetricFamily(name, doc, labels=[*labels, *self._extra])

    def _gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=[*labels, *self._extra])

    def _values(self, *values: str) -> list[str]:
        return [*values, *self._extra.values()]

    # ------------------------------------------------------------------ groups
    def _cpu(self) -> Iterator[Metric]:
        per_cpu = psutil.cpu_times(percpu=True)
        seconds = self._counter(
            "node_cpu_seconds", "Seconds the CPUs spent in each mode.", ["cpu", "mode"]
        )
        for index, times in enumerate(per_cpu):
            for mode in CPU_MODES:
                value = getattr(times, mode, None)
                if value is not None:
                    seconds.add_metric(self._values(str(index), mode), float(value))
        yield seconds
        utilization = self._utilization(_busy_total(per_cpu))
        if utilization is not None:
            gauge = self._gauge(
                "node_cpu_utilization_ratio",
                "Busy fraction of all CPUs (0-1) since the previous collect.",
            )
            gauge.add_metric(self._values(), utilization)
            yield gauge

    def _utilization(self, now: tuple[float, float]) -> float | None:
        prev, self._prev_cpu = self._prev_cpu, now
        if prev is not None and now[1] > prev[1]:
            busy = (now[0] - prev[0]) / (now[1] - prev[1])
            self._last_utilization = min(1.0, max(0.0, busy))
        elif self._last_utilization is None and now[1] > 0:
            # Collected within one clock tick of construction: the average since boot is the
            # best estimate there is (a later collect repeats the last value instead).
            self._last_utilization = now[0] / now[1]
        return self._last_utilization

    def _load(self) -> Iterator[Metric]:
        for minutes, value in zip((1, 5, 15), psutil.getloadavg(), strict=True):
            gauge = self._gauge(f"node_load{minutes}", f"{minutes}-minute load average.")
            gauge.add_metric(self._values(), float(value))
            yield gauge

    def _memory(self) -> Iterator[Metric]:
        sources = {"virtual": psutil.virtual_memory(), "swap": psutil.swap_memory()}
        for name, source, field in _MEMORY:
            value = getattr(sources[source], field, None)  # cached/buffers: Linux/BSD only
            if value is not None:
                gauge = self._gauge(name, f"Memory: psutil {source}_memory().{field}.")
                gauge.add_metric(self._values(), float(value))
                yield gauge

    def _disk_io(self) -> Iterator[Metric]:
        disks = {
            name: io
            for name, io in (psutil.disk_io_counters(perdisk=True) or {}).items()
            if not self._disk_exclude.match(name)
        }
        for name, field, doc in _DISK_COUNTERS:
            family = self._counter(name, doc, ["device"])
            for device, io in disks.items():
                family.add_metric(self._values(device), float(getattr(io, field)))
            yield family
        busy = self._counter("node_disk_io_time_seconds", "Seconds spent doing I/O.", ["device"])
        for device, io in disks.items():
            busy_ms = getattr(io, "busy_time", None)  # Linux/FreeBSD only
            if busy_ms is not None:
                busy.add_metric(self._values(device), busy_ms / 1000.0)
        yield busy

    def _filesystems(self) -> Iterator[Metric]:
        labels = ["device", "mountpoint", "fstype"]
        size = self._gauge("node_filesystem_size_bytes", "Filesystem size.", labels)
        avail = self._gauge(
            "node_filesystem_avail_bytes", "Space available to non-root users.", labels
        )
        free = self._gauge("node_filesystem_free_bytes", "Free space (root included).", labels)
        for part in self._partitions():
            try:
                usage = psutil.disk_usage(part.mountpoint)
            except OSError as exc:  # PermissionError included: e.g. another user's FUSE mount
                self._warn_once(
                    "fs:" + part.mountpoint, "skipping filesystem %s: %s", part.mountpoint, exc
                )
                continue
            values = self._values(part.device, part.mountpoint, part.fstype)
            size.add_metric(values, float(usage.total))
            # psutil's "free" is statvfs f_bavail (node's avail); node's free is f_bfree.
            avail.add_metric(values, float(usage.free))
            free.add_metric(values, float(usage.total - usage.used))
        yield from (size, avail, free)

    def _partitions(self) -> list[Any]:
        """Real partitions, plus those of pseudo types the caller asked for, once per mount."""
        parts = list(psutil.disk_partitions(all=False))
        if self._include_fstypes:
            parts += [
                p for p in psutil.disk_partitions(all=True) if p.fstype in self._include_fstypes
            ]
        chosen: dict[str, Any] = {}
        for part in parts:
            pseudo = part.fstype in PSEUDO_FSTYPES and part.fstype not in self._include_fstypes
            if not pseudo and part.mountpoint not in chosen:
                chosen[part.mountpoint] = part
        return list(chosen.values())

    def _network(self) -> Iterator[Metric]:
        nics = {
            name: io
            for name, io in psutil.net_io_counters(pernic=True).items()
            if name not in self._skip_interfaces
        }
        for name, field, doc in _NET_COUNTERS:
            family = self._counter(name, doc, ["device"])
            for device, io in nics.items():
                family.add_metric(self._values(device), float(getattr(io, field)))
            yield family


def _busy_total(per_cpu: Iterable[Any]) -> tuple[float, float]:
    """(busy, total) CPU seconds over all cores, guest time excluded (it is inside user)."""
    total = busy = 0.0
    for times in per_cpu:
        for mode in CPU_MODES:
            value = float(getattr(times, mode, 0.0) or 0.0)
            total += value
            if mode not in _IDLE_MODES:
                busy += value
    return busy, total
