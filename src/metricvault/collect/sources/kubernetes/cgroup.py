"""A process's pod and container from its cgroup path (``<proc_root>/<pid>/cgroup``).

The kubelet puts every container in a cgroup under ``kubepods``: a QoS level (``burstable``,
``besteffort``; Guaranteed pods have none), then ``pod<uid>``, then the container's cgroup,
named by the runtime with its 64-hex container id. How the names are spelled depends on the
cgroup driver:

- cgroupfs: ``/kubepods/burstable/pod<uid>/<id>`` (containerd, docker) or ``.../crio-<id>``;
- systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` (``crio-<id>.scope``, ``docker-<id>.scope``), the UID's dashes
  written as underscores (systemd reserves ``-`` for nesting).

cgroup v1 lists one line per hierarchy (``12:memory:/kubepods/...``), cgroup v2 one line
(``0::/kubepods.slice/...``). The path is relative to the *reader's* cgroup namespace: an agent
in a container with its own cgroup namespace (containerd's default on cgroup v2) reads other
pods' paths as ``0::/../../kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope``, so
the segments are searched for anywhere in the path, never anchored at its start. A kubelet with
``--cgroup-root`` (kind: ``/kubelet.slice/kubelet-kubepods.slice/...``) only adds a prefix.

Static (mirror) pods have a UID that is 32 hex digits without dashes (a hash of the manifest).
``crio-conmon-<id>.scope`` holds cri-o's monitor, not the container: its pod is known, its
container id is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# "pod<uid>", "kubepods-pod<uid>.slice", "kubepods-burstable-pod<uid>.slice"
_POD = re.compile(rf"^(?:.*-)?pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?$")
# "<id>", "cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope", "crio-<id>"
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True)
class CgroupRef:
    """Where the kubelet put a process: its pod's UID and container id ("" when not known)."""

    pod_uid: str
    container_id: str
    qos: str  # "guaranteed", "burstable" or "besteffort"

    def labels(self) -> dict[str, str]:
        labels = {"pod_uid": self.pod_uid}
        if self.container_id:
            labels["container_id"] = self.container_id
        return labels


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """The pod and container of one cgroup path; None outside ``kubepods``."""
    parts = [s for s in path.split("/") if s]
    hidden = bool(parts) and parts[0] == ".."  # above our cgroup namespace's root
    segments = [s for s in parts if s != ".."]
    for i, segment in enumerate(segments):
        match = _POD.match(segment)
        if match is None or not (hidden or _under_kubepods(segments[: i + 1])):
            continue
        uid = match.group(1).replace("_", "-")
        container = ""
        if i + 1 < len(segments):
            found = _CONTAINER.match(segments[i + 1])
            container = found.group(1) if found else ""
        return CgroupRef(uid, container, _qos(segments[: i + 1]))
    return None


def parse_proc_cgroup(text: str) -> CgroupRef | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` file (v1, v2 or hybrid)."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    # v2's "0::" line first (hybrid hosts have both), then v1's hierarchies in file order
    lines.sort(key=lambda parts: parts[0] != "0" or parts[1] != "")
    for parts in lines:
        found = parse_cgroup_path(parts[2])
        if found is not None:
            return found
    return None


def read_process(proc_root: Path, pid: int) -> CgroupRef | None:
    """`parse_proc_cgroup` of ``proc_root/<pid>/cgroup``; None if unreadable (the process left)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    return parse_proc_cgroup(text)


def _under_kubepods(segments: list[str]) -> bool:
    """A pod segment counts only below a kubepods cgroup (``kubepods``, ``kubepods.slice``,
    ``kubelet-kubepods.slice``) or named after it (``kubepods-burstable-pod<uid>.slice``); a
    path that climbs out of our cgroup namespace (``/../..``) may hide it."""
    return any("kubepods" in segment for segment in segments)


def _qos(segments: list[str]) -> str:
    text = "/".join(segments[-2:])
    for qos in ("burstable", "besteffort"):
        if qos in text:
            return qos
    return "guaranteed"
