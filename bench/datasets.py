"""Benchmark workloads as streams of long-shape Arrow tables, plus a one-pass summary of them.

The long shape: ``metric`` (string), ``timestamp`` (int64 ms), ``value`` (float64), then one
string column per label (null where the series has no such label).

Two workloads:

* ``simulated``: ``metricvault.sim.generate`` (13 nodes x 8 GPUs x 7 days at 5 s by default).
  It is regenerated for every benchmark phase (deterministic for a seed), never held in memory.
* ``alibaba``: the real per-pod GPU duty cycle and GPU memory in
  ``../shared/data/alibaba_genai_gpu`` (relative to the repository root), small enough to keep.
"""

from __future__ import annotations

import importlib
import json
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

REPO_ROOT = Path(__file__).resolve().parent.parent
ALIBABA_DIR = REPO_ROOT / ".." / "shared" / "data" / "alibaba_genai_gpu"
FIXED_COLUMNS = ("metric", "timestamp", "value")
MINUTE_MS = 60_000
DAY_MS = 86_400_000


class WorkloadUnavailable(RuntimeError):
    """A workload cannot be built here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Workload:
    """A named stream of long-shape tables and the names the benchmark queries use."""

    key: str
    title: str
    util_metric: str  # the per-GPU utilisation gauge of Q1 and Q2
    gpu_labels: tuple[str, ...]  # labels that identify one GPU (Q2 picks one)
    chunks: Callable[[], Iterator[pa.Table]]
    mfu_metric: str | None = None  # Q3; None where the data has no training metrics
    experiment_label: str | None = None


def label_names(table: pa.Table) -> list[str]:
    return [name for name in table.column_names if name not in FIXED_COLUMNS]


# --- simulated cluster -------------------------------------------------------------------------


def simulated(nodes: int, days: float, gpus_per_node: int = 8, seed: int = 0) -> Workload:
    """The simulated cluster of ``metricvault.sim``; raises WorkloadUnavailable without it."""
    try:
        sim = importlib.import_module("metricvault.sim")
        spec = sim.ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, days=days, seed=seed)
    except (ImportError, AttributeError) as exc:
        raise WorkloadUnavailable(
            f"metricvault.sim is not importable ({exc}); install the project into the venv "
            "(`.venv/bin/pip install -e .`) or run from a checkout that has src/metricvault/sim"
        ) from exc
    return Workload(
        key="sim",
        title=f"simulated {nodes} nodes x {gpus_per_node} GPUs x {days:g} d at 5 s (seed {seed})",
        util_metric="DCGM_FI_DEV_GPU_UTIL",
        gpu_labels=("Hostname", "gpu"),
        chunks=lambda: iter(sim.generate(spec)),
        mfu_metric="mfu",
        experiment_label="job",
    )


# --- real data: Alibaba GenAI serving cluster ---------------------------------------------------

ALIBABA_FILES = {
    "pod_gpu_duty_cycle": "pod_gpu_duty_cycle_anon.tar.gz",
    "pod_gpu_memory_used_bytes": "pod_gpu_memory_used_bytes_anon.tar.gz",
}


def alibaba(folder: Path = ALIBABA_DIR) -> Workload:
    """Real per-pod GPU utilisation and memory (143 pods, 57 s grid, ~23 h, ~319k samples)."""
    missing = [name for name in ALIBABA_FILES.values() if not (folder / name).is_file()]
    if missing:
        raise WorkloadUnavailable(
            f"real dataset files {missing} are not in {folder}; the benchmark expects the "
            "project's shared data folder next to the repository (../shared/data/alibaba_genai_gpu)"
        )
    tables = [_read_alibaba(folder / file, metric) for metric, file in ALIBABA_FILES.items()]
    return Workload(
        key="alibaba",
        title="real: Alibaba GenAI serving cluster, per-pod GPU duty cycle + memory (57 s, ~23 h)",
        util_metric="pod_gpu_duty_cycle",
        gpu_labels=("container_ip",),
        chunks=lambda: iter(tables),
    )


def _read_alibaba(archive: Path, metric: str) -> pa.Table:
    """One tar.gz holding one CSV (value, timestamp_anon in float seconds, container_ip)."""
    with tarfile.open(archive, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".csv"))
        extracted = tar.extractfile(member)
        if extracted is None:
            raise WorkloadUnavailable(f"{archive}: member {member.name} is not a regular file")
        types = {"value": pa.float64(), "timestamp_anon": pa.float64(), "container_ip": pa.string()}
        raw = pacsv.read_csv(extracted, convert_options=pacsv.ConvertOptions(column_types=types))
    millis = pc.cast(pc.round(pc.multiply(raw["timestamp_anon"], 1000.0)), pa.int64())
    return pa.table(
        {
            "metric": pa.array([metric] * raw.num_rows, pa.string()),
            "timestamp": millis,
            "value": raw["value"],
            "container_ip": raw["container_ip"],
        }
    )


# --- the long table, unified across chunks ------------------------------------------------------


def long_schema(labels: list[str]) -> pa.Schema:
    fixed = [
        pa.field("metric", pa.string(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
    return pa.schema(fixed + [pa.field(name, pa.string()) for name in labels])


def conform(chunk: pa.Table, schema: pa.Schema) -> pa.Table:
    """The chunk with the schema's columns, in its order and types; absent labels are null."""
    columns = []
    for fld in schema:
        if fld.name in chunk.column_names:
            columns.append(pc.cast(chunk[fld.name], fld.type))
        else:
            columns.append(pa.nulls(chunk.num_rows, fld.type))
    return pa.Table.from_arrays(columns, schema=schema)


# --- one-pass summary ---------------------------------------------------------------------------


@dataclass
class Summary:
    """What one pass over a workload learns: counts, time range, labels, query expectations."""

    workload: Workload
    samples: int = 0
    min_ts: int = 2**63 - 1
    max_ts: int = -(2**63)
    labels: list[str] = field(default_factory=list)
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    gpus: set[tuple[str, ...]] = field(default_factory=set)
    probe: dict[str, str] | None = None  # the GPU that Q2 reads
    probe_ts: list[np.ndarray] = field(default_factory=list)
    probe_values: list[np.ndarray] = field(default_factory=list)
    experiment_days: set[tuple[int, str]] = field(default_factory=set)

    def observe(self, chunk: pa.Table) -> None:
        self.samples += chunk.num_rows
        if chunk.num_rows == 0:
            return
        bounds = pc.min_max(chunk["timestamp"]).as_py()
        self.min_ts = min(self.min_ts, int(bounds["min"]))
        self.max_ts = max(self.max_ts, int(bounds["max"]))
        self.labels += [name for name in label_names(chunk) if name not in self.labels]
        self._observe_series(chunk)
        self._observe_gpus(chunk)
        self._observe_experiments(chunk)

    def _observe_series(self, chunk: pa.Table) -> None:
        names = label_names(chunk)
        keys = chunk.select(["metric", *names]).group_by(["metric", *names]).aggregate([])
        for row in keys.to_pylist():
            labels = tuple(sorted((k, row[k]) for k in names if row[k] not in (None, "")))
            self.series.add((row["metric"], labels))

    def _observe_gpus(self, chunk: pa.Table) -> None:
        util = chunk.filter(pc.equal(chunk["metric"], self.workload.util_metric))
        key = list(self.workload.gpu_labels)
        if util.num_rows == 0 or not set(key) <= set(util.column_names):
            return
        for row in util.select(key).group_by(key).aggregate([]).to_pylist():
            self.gpus.add(tuple(row[k] for k in key))
        if self.probe is None:
            self.probe = {k: util[k][0].as_py() for k in key}
        mask = reduce(pc.and_, [pc.equal(util[k], v) for k, v in self.probe.items()])
        mine = util.filter(mask)
        self.probe_ts.append(mine["timestamp"].to_numpy())
        self.probe_values.append(mine["value"].to_numpy())

    def _observe_experiments(self, chunk: pa.Table) -> None:
        metric, label = self.workload.mfu_metric, self.workload.experiment_label
        if metric is None or label is None or label not in chunk.column_names:
            return
        mfu = chunk.filter(pc.equal(chunk["metric"], metric))
        if mfu.num_rows == 0:
            return
        days = pc.divide(mfu["timestamp"], DAY_MS)
        pairs = pa.table({"day": days, "exp": mfu[label]}).group_by(["day", "exp"]).aggregate([])
        self.experiment_days.update((r["day"], r["exp"]) for r in pairs.to_pylist())

    # -- derived values --

    @property
    def span_ms(self) -> int:
        return self.max_ts - self.min_ts

    def probe_series(self) -> tuple[np.ndarray, np.ndarray]:
        """Timestamps and values of the Q2 GPU, sorted by time."""
        if not self.probe_ts:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        ts, values = np.concatenate(self.probe_ts), np.concatenate(self.probe_values)
        order = np.argsort(ts, kind="stable")
        return ts[order], values[order]

    def probe_minutes(self) -> int:
        ts, _ = self.probe_series()
        return int(np.unique(ts // MINUTE_MS).size)

    def probe_selector(self) -> str:
        labels = ",".join(f"{k}={json.dumps(v)}" for k, v in (self.probe or {}).items())
        return f"{self.workload.util_metric}{{{labels}}}"
