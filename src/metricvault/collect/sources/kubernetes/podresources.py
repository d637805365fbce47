"""The kubelet's pod-resources API: which container holds which GPU.

``v1.PodResourcesLister/List`` on the kubelet's unix socket (by default
``/var/lib/kubelet/pod-resources/kubelet.sock``) lists, per pod on the node, its name, namespace
and containers, and per container the devices the device plugins gave it: for NVIDIA's plugin
resource ``nvidia.com/gpu`` with device ids that are GPU UUIDs (``GPU-8a1c...``), MIG devices
(``nvidia.com/mig-1g.10gb``, ids ``MIG-...``) under the ``mixed`` strategy, and with time-slicing
``<uuid>::<replica>`` (the suffix is stripped here, as dcgm-exporter does). The response has no
pod UID and no container id.

The messages are declared here as protobuf descriptors (no protoc, no generated code), after
``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` in kubernetes/kubernetes;
only the fields read are declared (field numbers are the wire contract), the rest
(topology, memory, dynamic resources) are skipped as unknown fields. gRPC is ``grpcio``, the
optional extra ``kubernetes``; without it `grpc_available` is False and the caller falls back
to cgroups.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
SERVICE = "v1.PodResourcesLister"
# Device-plugin resources whose device ids name NVIDIA GPUs (full GPUs, MIG devices, shares).
GPU_RESOURCE = "nvidia.com/gpu"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
TIME_SLICE_SEPARATOR = "::"  # "GPU-<uuid>::3": the 4th time-sliced replica of that GPU

_PACKAGE = "v1"
_MESSAGES: dict[str, tuple[tuple[str, str, str, int], ...]] = {
    # message: (label, type, name, number), label "1" optional, "3" repeated
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("3", ".v1.PodResources", "pod_resources", 1),),
    "PodResources": (
        ("1", "string", "name", 1),
        ("1", "string", "namespace", 2),
        ("3", ".v1.ContainerResources", "containers", 3),
    ),
    "ContainerResources": (
        ("1", "string", "name", 1),
        ("3", ".v1.ContainerDevices", "devices", 2),
        ("3", "int64", "cpu_ids", 3),
    ),
    "ContainerDevices": (
        ("1", "string", "resource_name", 1),
        ("3", "string", "device_ids", 2),
    ),
}


@functools.cache
def messages() -> dict[str, Any]:
    """The message classes by name, built on first use (the agent imports protobuf only when
    a pod-resources socket is there)."""
    from google.protobuf import (  # type: ignore[import-untyped]
        descriptor_pb2,
        descriptor_pool,
        message_factory,
    )

    proto = descriptor_pb2.FileDescriptorProto(
        name="metricvault/podresources/v1/api.proto", package=_PACKAGE, syntax="proto3"
    )
    fdp = descriptor_pb2.FieldDescriptorProto
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for label, kind, field_name, number in fields:
            field = message.field.add(name=field_name, number=number, label=int(label))
            if kind.startswith("."):
                field.type = fdp.TYPE_MESSAGE
                field.type_name = kind
            else:
                field.type = fdp.TYPE_STRING if kind == "string" else fdp.TYPE_INT64
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def grpc_available() -> bool:
    """Whether ``grpcio`` can be imported (``pip install 'metricvault[kubernetes]'``)."""
    try:
        import grpc  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class PodContainer:
    """A container of a pod, as the pod-resources API names it."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


def gpu_holders(response: Any) -> dict[str, set[PodContainer]]:
    """GPU (or MIG) device id -> the containers it is assigned to, from a List response.

    More than one holder means a shared GPU (time-slicing or MPS replicas of one UUID).
    """
    holders: dict[str, set[PodContainer]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            who = PodContainer(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if not devices.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    continue
                for device_id in devices.device_ids:
                    uuid = device_id.split(TIME_SLICE_SEPARATOR, 1)[0]
                    holders.setdefault(uuid, set()).add(who)
    return holders


class PodResourcesClient:
    """A gRPC channel to the kubelet's pod-resources socket; `list` calls ``List``.

    Needs ``grpcio`` (check `grpc_available` first). The channel connects lazily and reconnects
    by itself after a kubelet restart; each call has a deadline.
    """

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        import grpc  # the optional extra "kubernetes"

        self.socket = socket
        self._timeout_s = timeout_s
        # "unix:" + an absolute path is gRPC's name for a unix socket (unix:///abs/path)
        self._channel = grpc.insecure_channel(f"unix://{Path(socket).absolute()}")
        classes = messages()
        self._request = classes["ListPodResourcesRequest"]()
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=classes["ListPodResourcesRequest"].SerializeToString,
            response_deserializer=classes["ListPodResourcesResponse"].FromString,
        )

    def list(self) -> Any:
        """The ``ListPodResourcesResponse``; raises ``grpc.RpcError`` (e.g. UNAVAILABLE)."""
        return self._list(self._request, timeout=self._timeout_s)

    def gpu_holders(self) -> dict[str, set[PodContainer]]:
        return gpu_holders(self.list())

    def close(self) -> None:
        self._channel.close()


def response_from(pods: Mapping[tuple[str, str], Mapping[str, Mapping[str, list[str]]]]) -> Any:
    """A ``ListPodResourcesResponse`` from ``{(namespace, pod): {container: {resource: ids}}}``:
    what a test's pod-resources server answers."""
    response = messages()["ListPodResourcesResponse"]()
    for (namespace, name), containers in pods.items():
        pod = response.pod_resources.add(name=name, namespace=namespace)
        for container_name, resources in containers.items():
            container = pod.containers.add(name=container_name)
            for resource, ids in resources.items():
                container.devices.add(resource_name=resource, device_ids=list(ids))
    return response
