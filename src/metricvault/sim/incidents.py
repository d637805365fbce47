"""Incident scenarios on a simulated GPU cluster, for the alert rules and their convergence.

Each scenario is a few hours of the cluster generator's data (``metricvault.sim.workload``,
every series labelled ``simulated="true"``) with one incident written into its last stretch,
plus the series a real deployment adds around dcgm-exporter: ``up`` of each node's
node_exporter (``job="node"``) and GPU agent (``job="metricvault-agent"``), the agent's
``metricvault_gpu_lost``, ``metricvault_gpu_xid_errors_total`` and per-process
``metricvault_gpu_process_memory_bytes`` (labelled with the training ``job`` its environment
names, or the Kubernetes ``namespace``/``pod`` of an inference server), and dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS``.

The cluster: four nodes of four GPUs scraped every 30 s; ``llama-8b-r3`` trains on node01 and
node02 (rank 0 on node01, where its training series are scraped), ``llama-8b-r4`` on node03,
and node04 serves a model from the pod ``inference/llm-serve-0`` on its GPU 0.

The scenarios (:data:`SCENARIOS`):

- ``node_power_loss``: node02 loses power. Both its targets answer ``up 0``, its GPU series
  stop, and ``llama-8b-r3`` (which held it) hangs: its step stops, its throughput is 0.
- ``gpu_fell_off_bus``: node03's GPU 2 throws XID 13 errors, then XID 79 and falls off the bus
  (``metricvault_gpu_lost 1``, its dcgm series stop); ``llama-8b-r4`` hangs on it.
- ``training_hang``: ``llama-8b-r3`` hangs with healthy GPUs (an NCCL deadlock: the GPUs spin,
  the step stops).
- ``agent_death``: the agent on node01 dies: its ``up`` is 0 and every series it exported
  stops, while node_exporter answers and training goes on.
- ``inference_memory_leak``: the inference server on node04 leaks GPU memory (18 GiB/h) for
  almost two hours.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from metricvault.errors import ConfigError
from metricvault.sim.spec import FB_TOTAL_MIB, ClusterSpec, JobSpec
from metricvault.sim.uuids import gpu_uuid
from metricvault.sim.workload import generate, hostname

__all__ = [
    "SCENARIOS",
    "IncidentRun",
    "Scenario",
    "incident_run",
    "scenario",
]

NODES = 4
GPUS = 4
INTERVAL_S = 30
HISTORY_H = 7.0  # the 6 h throughput baseline of TrainingThroughputCollapse needs this much
MIN = 60_000
HOUR = 60 * MIN
GIB = 1 << 30
MIB = 1 << 20
TRAIN_NODES = (0, 1)
R4_NODES = (2,)
INFERENCE_NODE, INFERENCE_GPU = 3, 0
INFERENCE_POD = {"namespace": "inference", "pod": "llm-serve-0", "container": "vllm"}
LEAK_GIB_PER_H = 18.0
LEAK_START_GIB = 16.0
EXTRA_LABELS = ("instance", "xid", "pid", "process_name", "namespace", "pod", "container")


@dataclass(frozen=True)
class Scenario:
    """One incident: what happens, where, and what the convergence should conclude."""

    name: str
    title: str  # as the docs' table says it
    cause: str  # the cause the root-cause alert must name
    incident: str  # the node or job the incident is about
    onset_before_end_ms: int  # the incident starts this long before the data ends
    evaluate_from_onset_ms: int  # the rules are evaluated from onset + this to the end


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("node_power_loss", "a node loses power", "node_down", "node02", 35 * MIN, -2 * MIN),
    Scenario(
        "gpu_fell_off_bus",
        "one GPU throws XIDs and falls off the bus",
        "bad_gpu",
        "node03",
        35 * MIN,
        -4 * MIN,
    ),
    Scenario(
        "training_hang", "a training job hangs", "job_failure", "llama-8b-r3", 35 * MIN, -2 * MIN
    ),
    Scenario("agent_death", "the GPU agent dies", "agent_down", "node01", 35 * MIN, -2 * MIN),
    Scenario(
        "inference_memory_leak",
        "a memory leak in an inference pod",
        "resource_exhaustion",
        "node04",
        112 * MIN,
        40 * MIN,
    ),
)


def scenario(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise ConfigError(
        f"unknown incident scenario {name!r}: choose one of {', '.join(s.name for s in SCENARIOS)}"
    )


@dataclass(frozen=True)
class IncidentRun:
    """A scenario's data: ``frame`` in the vault's long shape (``metric``, ``timestamp``,
    ``value``, one column per label, null where absent), and the times to evaluate at."""

    scenario: Scenario
    spec: ClusterSpec
    frame: pd.DataFrame
    onset_ms: int
    evaluate_from_ms: int
    end_ms: int
    job_nodes: dict[str, tuple[str, ...]]

    def evaluation_times(self, interval_ms: int = INTERVAL_S * 1000) -> Iterator[int]:
        """Every ``interval_ms`` from ``evaluate_from_ms`` up to the last sample."""
        yield from range(self.evaluate_from_ms, self.end_ms, interval_ms)


def incident_run(name: str, end_ms: int, seed: int = 0) -> IncidentRun:
    """The data of scenario ``name`` ending at ``end_ms`` (the same samples for the same end
    and seed)."""
    sc = scenario(name)
    jobs = (
        JobSpec("llama-8b-r3", TRAIN_NODES, 0, int(HISTORY_H * 3600), 48e9, 12000.0),
        JobSpec("llama-8b-r4", R4_NODES, 0, int(HISTORY_H * 3600), 48e9, 12000.0),
    )
    spec = ClusterSpec.ending_at(
        end_ms,
        HISTORY_H / 24,
        nodes=NODES,
        gpus_per_node=GPUS,
        interval_s=INTERVAL_S,
        seed=seed,
        jobs=jobs,
    )
    end = spec.end_ms
    onset = (end - sc.onset_before_end_ms) // (INTERVAL_S * 1000) * (INTERVAL_S * 1000)
    frame = pd.concat([t.to_pandas() for t in generate(spec)], ignore_index=True)
    for label in EXTRA_LABELS:
        frame[label] = None
    frame = pd.concat([frame, _agent_series(spec), _process_series(spec, frame)], ignore_index=True)
    frame = _apply(sc.name, frame, spec, onset)
    frame = frame.sort_values(["metric", "timestamp"], kind="stable", ignore_index=True)
    job_nodes = {j.name: tuple(hostname(n) for n in j.nodes) for j in jobs}
    return IncidentRun(sc, spec, frame, onset, onset + sc.evaluate_from_onset_ms, end, job_nodes)


def _grid(spec: ClusterSpec) -> np.ndarray:
    step = spec.interval_s * 1000
    return np.arange(spec.start_ms, spec.end_ms, step, dtype=np.int64)


def _rows(metric: str, ts: np.ndarray, values: np.ndarray, **labels: str) -> pd.DataFrame:
    out = pd.DataFrame({"metric": metric, "timestamp": ts, "value": values.astype(np.float64)})
    for k, v in {**labels, "simulated": "true"}.items():
        out[k] = v
    return out


def _agent_series(spec: ClusterSpec) -> pd.DataFrame:
    """``up`` of both targets of every node, and the agent's per-GPU health series."""
    ts = _grid(spec) + 7  # scraped a few ms after the dcgm series, as a scrape would be
    ones, zeros = np.ones(len(ts)), np.zeros(len(ts))
    parts = []
    for node in range(spec.nodes):
        host = hostname(node)
        for job, port in (("node", 9100), ("metricvault-agent", 9400)):
            parts.append(_rows("up", ts, ones, job=job, instance=f"{host}:{port}", Hostname=host))
        for gpu in range(spec.gpus_per_node):
            ids = _gpu_labels(spec, node, gpu)
            parts.append(_rows("metricvault_gpu_lost", ts, zeros, **ids))
            parts.append(_rows("DCGM_FI_DEV_XID_ERRORS", ts, zeros, **ids))
    return pd.concat(parts, ignore_index=True)


def _gpu_labels(spec: ClusterSpec, node: int, gpu: int) -> dict[str, str]:
    return {
        "Hostname": hostname(node),
        "UUID": gpu_uuid(spec.seed, node, gpu),
        "device": f"nvidia{gpu}",
        "gpu": str(gpu),
        "modelName": spec.model_name,
    }


def _process_series(spec: ClusterSpec, frame: pd.DataFrame) -> pd.DataFrame:
    """One process per GPU of a training job (its memory: the GPU's framebuffer use, labelled
    with the job as the agent labels it from ``SLURM_JOB_ID``) and the inference server."""
    fb = frame[frame["metric"] == "DCGM_FI_DEV_FB_USED"]
    parts = []
    for job in spec.resolved_jobs():
        for node in job.nodes:
            for gpu in range(spec.gpus_per_node):
                mine = fb[(fb["Hostname"] == hostname(node)) & (fb["gpu"] == str(gpu))]
                used = mine[mine["value"] > 0]
                pid = str(4000 + 10 * node + gpu)
                parts.append(
                    _rows(
                        "metricvault_gpu_process_memory_bytes",
                        used["timestamp"].to_numpy() + 3,
                        used["value"].to_numpy() * MIB,
                        **_gpu_labels(spec, node, gpu),
                        pid=pid,
                        process_name="python",
                        job=job.name,
                    )
                )
    ts = _grid(spec) + 3
    memory = np.full(len(ts), LEAK_START_GIB * GIB)
    parts.append(
        _rows(
            "metricvault_gpu_process_memory_bytes",
            ts,
            memory,
            **_gpu_labels(spec, INFERENCE_NODE, INFERENCE_GPU),
            **INFERENCE_POD,
            pid="7311",
            process_name="vllm",
        )
    )
    return pd.concat(parts, ignore_index=True)


def _where(frame: pd.DataFrame, **labels: str) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for k, v in labels.items():
        mask &= frame[k] == v
    return mask


def _apply(name: str, frame: pd.DataFrame, spec: ClusterSpec, onset: int) -> pd.DataFrame:
    """Write the incident into the healthy run."""
    after = frame["timestamp"] >= onset
    dcgm = frame["metric"].str.startswith("DCGM_")
    agent = dcgm | frame["metric"].str.startswith("metricvault_gpu_")
    if name == "node_power_loss":
        host = hostname(TRAIN_NODES[1])
        on_node = frame["Hostname"] == host
        frame = frame[~(after & on_node & agent)].copy()
        frame.loc[after & on_node & (frame["metric"] == "up"), "value"] = 0.0
        frame = _hang(frame, "llama-8b-r3", onset)
    elif name == "gpu_fell_off_bus":
        node, gpu = R4_NODES[0], 2
        host = hostname(node)
        the_gpu = _where(frame, Hostname=host, gpu=str(gpu))
        frame = frame[~(after & the_gpu & dcgm)].copy()
        frame.loc[after & the_gpu & (frame["metric"] == "metricvault_gpu_lost"), "value"] = 1.0
        # XID 13 (graphics engine exception) three times in the minutes before, then XID 79
        last = the_gpu & (frame["metric"] == "DCGM_FI_DEV_XID_ERRORS")
        frame.loc[last & (frame["timestamp"] >= onset - 3 * MIN), "value"] = 13.0
        ids = _gpu_labels(spec, node, gpu)
        ts = _grid(spec) + 11
        ts = ts[ts >= onset - 4 * MIN]
        xid13 = np.searchsorted(
            np.array([onset - 3 * MIN, onset - 2 * MIN, onset - MIN]), ts, "right"
        )
        xid79 = (ts >= onset).astype(np.float64)
        frame = pd.concat(
            [
                frame,
                _rows("metricvault_gpu_xid_errors_total", ts, xid13.astype(float), **ids, xid="13"),
                _rows("metricvault_gpu_xid_errors_total", ts, xid79, **ids, xid="79"),
            ],
            ignore_index=True,
        )
        on_job_gpus = (frame["Hostname"] == host) & (frame["metric"] == "DCGM_FI_DEV_GPU_UTIL")
        frame.loc[after & on_job_gpus, "value"] = 100.0  # NCCL spins, waiting for the lost rank
        frame = _hang(frame, "llama-8b-r4", onset)
    elif name == "training_hang":
        frame = _hang(frame, "llama-8b-r3", onset)
    elif name == "agent_death":
        on_node = frame["Hostname"] == hostname(TRAIN_NODES[0])
        frame = frame[~(after & on_node & agent)].copy()
        agent_up = on_node & (frame["metric"] == "up") & (frame["job"] == "metricvault-agent")
        frame.loc[after & agent_up, "value"] = 0.0
    elif name == "inference_memory_leak":
        frame = _leak(frame, spec, onset)
    return frame


def _hang(frame: pd.DataFrame, job: str, onset: int) -> pd.DataFrame:
    """From ``onset`` the job still reports but makes no progress."""
    frame = frame.copy()
    mine = (frame["job"] == job) & frame["Hostname"].isna()
    for metric in ("train_step", "train_tokens_total", "train_loss", "learning_rate", "grad_norm"):
        rows = mine & (frame["metric"] == metric)
        before = frame[rows & (frame["timestamp"] < onset)]
        if len(before):
            held = float(before.sort_values("timestamp")["value"].iloc[-1])
            frame.loc[rows & (frame["timestamp"] >= onset), "value"] = held
    for metric in ("tokens_per_second", "mfu"):
        frame.loc[mine & (frame["metric"] == metric) & (frame["timestamp"] >= onset), "value"] = 0.0
    return frame


def _leak(frame: pd.DataFrame, spec: ClusterSpec, onset: int) -> pd.DataFrame:
    """The inference process's memory grows linearly from ``onset``; its GPU's framebuffer
    (dcgm's FB_USED/FB_FREE, MiB) follows it."""
    frame = frame.copy()
    host = hostname(INFERENCE_NODE)
    process = (frame["metric"] == "metricvault_gpu_process_memory_bytes") & (
        frame["pod"] == "llm-serve-0"
    )
    ts = frame.loc[process, "timestamp"].to_numpy()
    grown = LEAK_START_GIB + LEAK_GIB_PER_H * np.maximum(0, ts - onset) / HOUR
    frame.loc[process, "value"] = np.rint(grown * GIB)
    gpu = _where(frame, Hostname=host, gpu=str(INFERENCE_GPU))
    for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        rows = gpu & (frame["metric"] == metric)
        ts = frame.loc[rows, "timestamp"].to_numpy()
        used = np.rint(
            (LEAK_START_GIB + LEAK_GIB_PER_H * np.maximum(0, ts - onset) / HOUR) * 1024 + 900
        )
        frame.loc[rows, "value"] = used if metric.endswith("USED") else FB_TOTAL_MIB - used
    util = gpu & (frame["metric"] == "DCGM_FI_DEV_GPU_UTIL")
    frame.loc[util, "value"] = 60.0
    return frame
