"""Pod labels on GPU series (``metricvault.collect.sources.kubernetes``).

Cgroup paths come from the fixture ``/proc`` trees of ``tests/data/kubernetes`` (cgroup v1 and
v2, cgroupfs and systemd drivers, containerd, cri-o and Docker); the kubelet's pod-resources API
is a real gRPC server (grpcio) on a unix socket under ``tmp_path``, answering ``List`` from the
same message schema; NVML is the fake of ``test_collect_gpu``.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from prometheus_client.parser import text_string_to_metric_families

from metricvault.collect.agent import Agent, AgentOptions
from metricvault.collect.sources.kubernetes import PodLabels, with_pod_labels
from metricvault.collect.sources.kubernetes.cgroup import (
    CgroupRef,
    parse_proc_cgroup,
    read_process,
)
from metricvault.collect.sources.kubernetes.podresources import (
    LIST_METHOD,
    SERVICE,
    PodContainer,
    PodResourcesClient,
    messages,
    response_from,
)
from metricvault.collect.sources.nvml import NvmlSource
from tests.unit import test_collect_gpu
from tests.unit.test_collect_gpu import FakeDevice, render, scrape

# the fake NVML's fixtures (make_source uses install)
install = test_collect_gpu.install
make_source = test_collect_gpu.make_source

DATA = Path(__file__).parent.parent / "data" / "kubernetes"
EXPECTED: dict[str, dict[str, Any]] = json.loads((DATA / "expected.json").read_text())
LOG = "metricvault.collect.sources.kubernetes"
TRAIN_UID = "6b8d3c2e-1f4a-4e8b-9c1d-2a3b4c5d6e7f"
INFER_UID = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
GUARANTEED_UID = "c3a7e9b1-5d2f-4c8e-a6b0-9f1e3d5c7a2b"
TRAIN = PodContainer("ml", "llama-train-0", "trainer")
INFER = PodContainer("serving", "vllm-7d9f8-abcde", "vllm")
OTHER = PodContainer("serving", "embedder-55c4-xyz12", "embedder")


def gpu_uuid(index: int) -> str:
    return FakeDevice(index).uuid  # the fake NVML's UUID of GPU <index>


# -- a kubelet's pod-resources API ------------------------------------------------------------


class Kubelet:
    """A gRPC server answering ``v1.PodResourcesLister/List`` on a unix socket."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.calls = 0
        self._server: Any = None

    def assign(self, who: PodContainer, *device_ids: str, resource: str = "nvidia.com/gpu"):
        containers = self.pods.setdefault((who.namespace, who.pod), {})
        containers.setdefault(who.container, {}).setdefault(resource, []).extend(device_ids)

    def start(self) -> None:
        classes = messages()

        def list_pods(request: Any, context: Any) -> Any:
            self.calls += 1
            return response_from(self.pods)

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                LIST_METHOD.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(
                    list_pods,
                    request_deserializer=classes["ListPodResourcesRequest"].FromString,
                    response_serializer=classes["ListPodResourcesResponse"].SerializeToString,
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        assert self._server.add_insecure_port(f"unix://{self.socket}") == 1
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    server = Kubelet(tmp_path / "kubelet.sock")
    yield server
    server.stop()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A writable copy of the cgroup v2 / systemd / containerd node's ``/proc``."""
    return Path(shutil.copytree(DATA / "cgroup-v2-systemd-containerd" / "proc", tmp_path / "proc"))


def sample_labels(families: dict[str, Any], name: str, **match: str) -> dict[str, str]:
    found = [s.labels for s in families[name].samples if match.items() <= s.labels.items()]
    assert len(found) == 1, f"{name}{match}: {len(found)} samples"
    return found[0]


def pod_part(labels: dict[str, str]) -> dict[str, str]:
    keys = ("namespace", "pod", "container", "pod_uid", "container_id")
    return {k: v for k, v in labels.items() if k in keys}


def wait_until(
    check: Callable[[], bool], what: str, timeout_s: float = 15.0, every_s: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


# -- cgroup paths -----------------------------------------------------------------------------


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_each_fixture_node_names_pod_uid_and_container_id(tree: str) -> None:
    root = DATA / tree / "proc"
    pids = sorted(p.name for p in root.iterdir())
    assert pids == sorted(EXPECTED[tree]), "expected.json covers every process of the tree"
    for pid in pids:
        found = read_process(root, int(pid))
        want = EXPECTED[tree][pid]
        got = (
            None
            if found is None
            else {"pod_uid": found.pod_uid, "container_id": found.container_id}
        )
        assert got == want, f"{tree} pid {pid}"


def test_qos_class_and_labels_of_a_cgroup() -> None:
    root = DATA / "cgroup-v1-cgroupfs-containerd" / "proc"
    qos = {pid: ref.qos for pid in (4242, 4243, 4244) if (ref := read_process(root, pid))}
    assert qos == {4242: "burstable", 4243: "besteffort", 4244: "guaranteed"}
    conmon = read_process(DATA / "cgroup-v2-cgroupfs-crio" / "proc", 5150)
    assert conmon == CgroupRef(INFER_UID, "", "besteffort")
    assert conmon.labels() == {"pod_uid": INFER_UID}, "no container id: no container_id label"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage without colons\n",
        "0::/\n",
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # a QoS cgroup, no pod
        f"0::/system.slice/pod{TRAIN_UID}.service\n",  # "pod<uid>" outside kubepods
        f"0::/kubepods/burstable/pod{TRAIN_UID[:-1]}/abc\n",  # a UID one digit short
        "0::/kubepods/burstable/podNOT-A-UID/abc\n",
    ],
)
def test_what_is_not_a_pod_cgroup_gives_nothing(text: str) -> None:
    assert parse_proc_cgroup(text) is None


def test_a_pod_cgroup_without_a_container_gives_the_pod_only() -> None:
    ref = parse_proc_cgroup(f"0::/kubepods/burstable/pod{TRAIN_UID}\n")
    assert ref == CgroupRef(TRAIN_UID, "", "burstable")
    assert read_process(DATA / "cgroup-v2-cgroupns" / "proc", 999_999) is None  # no such pid


# -- the pod-resources API --------------------------------------------------------------------


def test_gpu_holders_from_a_real_grpc_server(kubelet: Kubelet) -> None:
    kubelet.assign(TRAIN, gpu_uuid(0), gpu_uuid(3))
    kubelet.assign(INFER, f"{gpu_uuid(1)}::0")  # time-slicing: two replicas of GPU 1
    kubelet.assign(OTHER, f"{gpu_uuid(1)}::1")
    kubelet.assign(
        OTHER, "MIG-5f2a3c1e-aaaa-bbbb-cccc-000000000001", resource="nvidia.com/mig-1g.10gb"
    )
    kubelet.assign(OTHER, "0000:3b:00.1", resource="intel.com/sriov_netdevice")  # not a GPU
    kubelet.start()
    client = PodResourcesClient(kubelet.socket)
    try:
        holders = client.gpu_holders()
    finally:
        client.close()
    assert holders == {
        gpu_uuid(0): {TRAIN},
        gpu_uuid(3): {TRAIN},
        gpu_uuid(1): {INFER, OTHER},
        "MIG-5f2a3c1e-aaaa-bbbb-cccc-000000000001": {OTHER},
    }
    assert kubelet.calls == 1


def test_no_kubelet_behind_the_socket_is_an_rpc_error(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "absent.sock", timeout_s=1.0)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            client.list()
    finally:
        client.close()
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


# -- PodLabels over the NVML source -----------------------------------------------------------


def three_gpus() -> list[FakeDevice]:
    """GPU 0: the training pod's process; GPU 1: processes of two pods; GPU 2: a host process."""
    devices = [FakeDevice(0), FakeDevice(1, bus_id=b"00000000:2A:00.0"), FakeDevice(2)]
    devices[0].processes = [(4242, 60 * 1024**3)]
    devices[1].processes = [(4243, 8 * 1024**3), (4245, 4 * 1024**3)]
    devices[2].processes = [(1207, 1024**2)]
    return devices


def test_gpus_and_processes_carry_the_pods_that_hold_them(
    make_source: Callable[..., NvmlSource], kubelet: Kubelet, proc: Path
) -> None:
    kubelet.assign(TRAIN, gpu_uuid(0))
    kubelet.assign(INFER, f"{gpu_uuid(1)}::0")
    kubelet.assign(OTHER, f"{gpu_uuid(1)}::1")
    kubelet.start()
    source = PodLabels(
        make_source(three_gpus(), proc_root=proc), socket=kubelet.socket, proc_root=proc
    )
    families = scrape(source)
    names = {"namespace": "ml", "pod": "llama-train-0", "container": "trainer"}
    train_cgroup = {
        "pod_uid": TRAIN_UID,
        "container_id": EXPECTED["cgroup-v2-systemd-containerd"]["4242"]["container_id"],
    }
    # a GPU held by one container carries its names, on every series of the GPU
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"):
        assert pod_part(sample_labels(families, name, gpu="0")) == names
    # a shared GPU (time-slicing) and a GPU no pod holds carry none
    assert pod_part(sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="1")) == {}
    assert pod_part(sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="2")) == {}
    memory = "metricvault_gpu_process_memory_bytes"
    train = sample_labels(families, memory, pid="4242")
    assert pod_part(train) == {**names, **train_cgroup}
    assert train["process_name"] == "python" and train["UUID"] == gpu_uuid(0)
    infer = sample_labels(families, memory, pid="4243")
    assert pod_part(infer) == {
        "pod_uid": INFER_UID,
        "container_id": EXPECTED["cgroup-v2-systemd-containerd"]["4243"]["container_id"],
    }
    assert pod_part(sample_labels(families, memory, pid="1207")) == {}, "a host process"
    # the values are the wrapped source's
    plain = scrape(make_source(three_gpus(), proc_root=proc))
    assert (
        families["DCGM_FI_DEV_FB_USED"].samples[0].value
        == plain["DCGM_FI_DEV_FB_USED"].samples[0].value
    )
    # the fast readings (the agent's window statistics) carry the device labels too
    fast = {
        dict(r.labels)["gpu"]: dict(r.labels)
        for r in source.fast_readings()
        if r.metric == "DCGM_FI_DEV_GPU_UTIL"
    }
    assert pod_part(fast["0"]) == names and pod_part(fast["1"]) == {}


def test_without_the_socket_cgroups_alone_label_processes_and_their_gpu(
    make_source: Callable[..., NvmlSource],
    proc: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    devices = three_gpus()
    devices[1].processes = [(4243, 1024**3), (4244, 1024**3)]  # two pods on GPU 1
    source = PodLabels(
        make_source(devices, proc_root=proc), socket=tmp_path / "none.sock", proc_root=proc
    )
    with caplog.at_level(logging.WARNING, logger=LOG):
        families = scrape(source)
        scrape(source)
    train = {
        "pod_uid": TRAIN_UID,
        "container_id": EXPECTED["cgroup-v2-systemd-containerd"]["4242"]["container_id"],
    }
    assert (
        pod_part(sample_labels(families, "metricvault_gpu_process_memory_bytes", pid="4242"))
        == train
    )
    assert pod_part(sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="0")) == train, (
        "one container on GPU 0"
    )
    assert pod_part(sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="1")) == {}, (
        "two pods on GPU 1"
    )
    assert pod_part(sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="2")) == {}, (
        "a host process"
    )
    assert (
        pod_part(sample_labels(families, "metricvault_gpu_process_memory_bytes", pid="4244"))[
            "pod_uid"
        ]
        == GUARANTEED_UID
    )
    warnings = [r.getMessage() for r in caplog.records]
    assert (
        len(warnings) == 1
        and "pod-resources socket" in warnings[0]
        and "not mounted" in warnings[0]
    )


def test_without_grpcio_it_says_so_once_and_uses_cgroups(
    make_source: Callable[..., NvmlSource], kubelet: Kubelet, proc: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    kubelet.assign(TRAIN, gpu_uuid(0))
    kubelet.start()
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` raises ImportError
    source = PodLabels(
        make_source(three_gpus(), proc_root=proc), socket=kubelet.socket, proc_root=proc
    )
    with caplog.at_level(logging.WARNING, logger=LOG):
        families = scrape(source)
        scrape(source)
    assert kubelet.calls == 0
    labels = sample_labels(families, "metricvault_gpu_process_memory_bytes", pid="4242")
    assert labels["pod_uid"] == TRAIN_UID and "namespace" not in labels
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "grpcio is not installed" in warnings[0], warnings
    assert "pip install 'metricvault[kubernetes]'" in warnings[0]


def test_a_kubelet_that_goes_away_and_comes_back(
    make_source: Callable[..., NvmlSource],
    kubelet: Kubelet,
    proc: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kubelet.assign(TRAIN, gpu_uuid(0))
    kubelet.start()
    source = PodLabels(
        make_source(three_gpus(), proc_root=proc),
        socket=kubelet.socket,
        proc_root=proc,
        timeout_s=1.0,
    )
    assert (
        sample_labels(scrape(source), "DCGM_FI_DEV_GPU_UTIL", gpu="0").get("pod") == "llama-train-0"
    )
    kubelet.stop()
    with caplog.at_level(logging.WARNING, logger=LOG):
        families = scrape(source)
        scrape(source)
    assert "pod" not in sample_labels(families, "DCGM_FI_DEV_GPU_UTIL", gpu="0")
    assert (
        sample_labels(families, "metricvault_gpu_process_memory_bytes", pid="4242")["pod_uid"]
        == TRAIN_UID
    )
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and "UNAVAILABLE" in failed[0], caplog.records
    kubelet.start()  # the kubelet restarted: the channel reconnects by itself
    wait_until(
        lambda: (
            sample_labels(scrape(source), "DCGM_FI_DEV_GPU_UTIL", gpu="0").get("pod")
            == "llama-train-0"
        ),
        "the names after the kubelet came back",
    )


def test_off_the_cluster_nothing_changes(
    make_source: Callable[..., NvmlSource], tmp_path: Path
) -> None:
    host = Path(
        shutil.copytree(DATA / "cgroup-v2-systemd-containerd" / "proc", tmp_path / "hostproc")
    )
    for pid in ("4242", "4243", "4244", "4245"):
        shutil.rmtree(host / pid)  # only host processes and a plain docker container left
    devices = [FakeDevice(0), FakeDevice(1)]
    devices[0].processes = [(1207, 1024**2)]
    devices[1].processes = [(3301, 1024**2)]
    plain = make_source(devices, proc_root=host)
    wrapped = with_pod_labels(
        [make_source(devices, proc_root=host)], "auto", socket=tmp_path / "no.sock", proc_root=host
    )[0]
    assert isinstance(wrapped, PodLabels)
    assert render(wrapped) == render(plain)
    assert with_pod_labels([plain], "off") == [plain]
    with pytest.raises(ValueError, match="kubernetes mode 'on': expected one of auto, off"):
        with_pod_labels([plain], "on")


# -- end to end: the agent's /metrics ---------------------------------------------------------


def _metrics(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = reply.read().decode()
    return {family.name: family for family in text_string_to_metric_families(body)}


def test_the_agent_serves_simulated_gpus_with_pod_labels(kubelet: Kubelet, tmp_path: Path) -> None:
    kubelet.start()
    opts = AgentOptions(
        listen="127.0.0.1:0", state_dir=tmp_path / "state", simulate_gpus=2, host_metrics=False,
        sample_hz=50, hostname="gpu-node-7", pod_resources_socket=kubelet.socket,
    )  # fmt: skip
    agent = Agent(opts)
    agent.start()
    try:
        assert agent.server is not None
        url = agent.server.url
        first = _metrics(url)
        uuids = {s.labels["gpu"]: s.labels["UUID"] for s in first["DCGM_FI_DEV_GPU_UTIL"].samples}
        assert all("pod" not in s.labels for s in first["DCGM_FI_DEV_GPU_UTIL"].samples)
        kubelet.assign(TRAIN, uuids["0"])  # the training pod is scheduled onto GPU 0
        names = {"namespace": "ml", "pod": "llama-train-0", "container": "trainer"}
        second = _metrics(url)
        assert pod_part(sample_labels(second, "DCGM_FI_DEV_GPU_UTIL", gpu="0")) == names
        assert pod_part(sample_labels(second, "DCGM_FI_DEV_GPU_UTIL", gpu="1")) == {}
        assert sample_labels(second, "DCGM_FI_DEV_GPU_UTIL", gpu="0")["simulated"] == "true"
        # the window statistics of the fast sampler follow once it has sampled with the labels
        window = "metricvault_gpu_util_window_mean"

        def labelled_window() -> bool:
            family = _metrics(url).get(window)
            samples = family.samples if family is not None else []
            return any(pod_part(s.labels) == names and s.labels["gpu"] == "0" for s in samples)

        # (scraped once a second: under host load the sampler backs off to --min-sample-hz 1,
        # and a window is the time since the previous scrape)
        wait_until(labelled_window, "a window mean with the pod labels", every_s=1.1)
    finally:
        agent.stop()


def test_the_agent_command_line_turns_it_off(tmp_path: Path) -> None:
    from metricvault.collect.cli import _make_agent, build_parser

    parser = build_parser()
    common = [
        "--simulate-gpus",
        "1",
        "--no-host",
        "--state-dir",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
    ]
    on = _make_agent(parser.parse_args(common), parser)
    off = _make_agent(parser.parse_args([*common, "--kubernetes", "off"]), parser)
    assert [type(s).__name__ for s in on.sources] == ["PodLabels"]
    assert [type(s).__name__ for s in off.sources] == ["SimulatedGpuSource"]
    assert on.opts.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    with pytest.raises(SystemExit):
        parser.parse_args([*common, "--kubernetes", "on"])


def test_scrapes_from_two_threads_at_once(
    make_source: Callable[..., NvmlSource], kubelet: Kubelet, proc: Path
) -> None:
    kubelet.assign(TRAIN, gpu_uuid(0))
    kubelet.start()
    source = PodLabels(
        make_source(three_gpus(), proc_root=proc), socket=kubelet.socket, proc_root=proc
    )
    results: list[str] = []

    def one() -> None:
        results.append(
            sample_labels(scrape(source), "DCGM_FI_DEV_GPU_UTIL", gpu="0").get("pod", "")
        )

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == ["llama-train-0"] * 4


class Relabelled:
    """A fast-reading source whose GPU gets a new pod's labels at each job."""

    name = "relabelled"

    def __init__(self) -> None:
        self.pod = "job-0"

    def collect(self) -> list[Any]:
        return []

    def fast_readings(self) -> list[Any]:
        from metricvault.collect.sources import FastReading

        labels = (("UUID", gpu_uuid(0)), ("gpu", "0"), ("pod", self.pod))
        return [FastReading("DCGM_FI_DEV_GPU_UTIL", labels, 50.0)]

    def close(self) -> None:
        pass


def test_the_sampler_forgets_series_whose_pod_is_gone() -> None:
    """Each pod on a GPU is a new series of the fast sampler; those of ended pods are dropped
    once unread for keep_s, so memory does not grow with the number of jobs a node ran."""
    from metricvault.collect.sampler import FastSampler

    source = Relabelled()
    sampler = FastSampler([source], hz=10, keep_s=300, clock=lambda: 0.0)
    for job in range(50):
        source.pod = f"job-{job}"
        for tick in range(20):
            sampler.sample_once(job * 100.0 + tick * 0.1)
    pods = {dict(stat.labels)["pod"] for stat in sampler.window(400.0, 5000.0)}
    assert pods == {f"job-{job}" for job in range(46, 50)}, "only the last 300 s of pods"
    assert len(sampler._series) == 4
