"""A simulator of GPU-cluster metrics: dcgm-exporter GPU series plus training-loop series.

The data is synthetic and every series carries the label ``simulated="true"``. It feeds the demo,
the tests and the benchmarks. Output is Arrow tables in the long shape: ``metric``, ``timestamp``
(int64 epoch ms UTC), ``value`` (float64), then one string column per label name, null where a
series lacks that label; every chunk has the same schema.

What happens in a run (all drawn deterministically from ``ClusterSpec.seed``):

- GPUs idle until a job holds their node; a job goes through startup (4 min), training,
  checkpoints every 2 h (2-3 min of low utilisation) and evaluation every 6 h (10 min).
- Scrapes of a node occasionally fail for 1-6 consecutive intervals (at least once per node).
- In runs of 2 days or more one node reboots once, between 40 % and 60 % of the run: 5 minutes
  without samples, then its energy counters start again near zero. A job on that node stops on
  all its nodes (no training samples) and resumes from its checkpoint; its token counter goes on.
- Training series are scraped from the job's first node, so they share that node's gaps.
- Each scrape target has a constant offset of a few milliseconds, like Prometheus scrapes.

GPU series carry ``Hostname``, ``UUID``, ``device``, ``gpu``, ``modelName`` and no ``job`` (a GPU
serves several jobs over a run, and a series' labels never change); training series carry only
``job``. Which job held a node when is in ``ClusterSpec.jobs`` / `default_jobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from metricvault.errors import ConfigError
from metricvault.sim.gpu import GPU_METRICS, NodeSimulator
from metricvault.sim.plan import Plan, job_emits, make_plan, node_present
from metricvault.sim.spec import ClusterSpec, JobSpec, default_jobs
from metricvault.sim.training import TRAINING_METRICS, JobSimulator
from metricvault.sim.uuids import gpu_uuid

__all__ = [
    "GPU_METRICS",
    "LABEL_NAMES",
    "SCHEMA",
    "TRAINING_METRICS",
    "ClusterSpec",
    "JobSpec",
    "default_jobs",
    "generate",
    "series_count",
    "to_pandas",
    "total_samples",
]

# Sorted, as in a series' canonical label set.
LABEL_NAMES = ("Hostname", "UUID", "device", "gpu", "job", "modelName", "simulated")
SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        *(pa.field(name, pa.string()) for name in LABEL_NAMES),
    ]
)
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
# Record batches of this many rows: past ~16 MiB a buffer is handed back to the OS when freed and
# has to be faulted in again for the next chunk, which made a 6-hour chunk of 13 nodes 3x slower.
BATCH_ROWS = 1 << 18
# pyarrow creates its compute functions at import time, so type checkers cannot see them.
_RUN_END_DECODE: Callable[[pa.Array], pa.Array] = pc.__dict__["run_end_decode"]


def generate(spec: ClusterSpec, chunk_hours: float = 6.0) -> Iterator[pa.Table]:
    """Yield the run as time-ordered tables, each with all series for one ``chunk_hours`` window.

    A window covers whole scrape intervals (``chunk_hours`` is rounded to them); windows without
    any sample are skipped. Within a table, rows are grouped by series and time-ordered. Values do
    not depend on ``chunk_hours``. A bad spec raises `ConfigError` here, not at the first chunk.
    """
    if not chunk_hours > 0:
        raise ConfigError(f"chunk_hours={chunk_hours} must be positive, e.g. 6.0")
    plan = make_plan(spec)
    return _chunks(plan, max(1, round(chunk_hours * 3600 / spec.interval_s)))


def _chunks(plan: Plan, chunk_steps: int) -> Iterator[pa.Table]:
    labels = _Dictionaries.of(plan)
    nodes = [NodeSimulator(plan, node) for node in range(plan.spec.nodes)]
    jobs = [JobSimulator(plan, j) for j in range(len(plan.jobs))]
    for first in range(0, plan.n_steps, chunk_steps):
        end = min(plan.n_steps, first + chunk_steps)
        builder = _ChunkBuilder(plan, labels)
        for node, simulator in enumerate(nodes):
            builder.add_node(node, *simulator.chunk(first, end))
        for j, job_simulator in enumerate(jobs):
            builder.add_job(j, *job_simulator.chunk(first, end))
        if builder.rows:
            yield builder.table()


def total_samples(spec: ClusterSpec) -> int:
    """The exact number of rows ``generate(spec)`` yields, computed without generating values."""
    plan = make_plan(spec)
    steps = np.arange(plan.n_steps, dtype=np.int64)
    per_node = len(GPU_METRICS) * spec.gpus_per_node
    total = sum(int(node_present(plan, n, steps).sum()) * per_node for n in range(spec.nodes))
    for j in range(len(plan.jobs)):
        total += int(job_emits(plan, j, steps).sum()) * len(TRAINING_METRICS)
    return total


def series_count(spec: ClusterSpec) -> int:
    """How many distinct series ``generate(spec)`` yields (GPU series plus training series)."""
    plan = make_plan(spec)
    steps = np.arange(plan.n_steps, dtype=np.int64)
    per_node = len(GPU_METRICS) * spec.gpus_per_node
    count = sum(per_node for n in range(spec.nodes) if node_present(plan, n, steps).any())
    for j in range(len(plan.jobs)):
        count += len(TRAINING_METRICS) if job_emits(plan, j, steps).any() else 0
    return count


def to_pandas(spec: ClusterSpec) -> pd.DataFrame:
    """All chunks as one DataFrame; meant for small specs (a 2-node, 14-day run is ~44 M rows)."""
    tables = list(generate(spec))
    frame: pd.DataFrame = (pa.concat_tables(tables) if tables else SCHEMA.empty_table()).to_pandas()
    return frame


@dataclass(frozen=True)
class _Dictionaries:
    """The distinct values of each string column; the last entry of each label is null."""

    values: dict[str, pa.Array]

    @classmethod
    def of(cls, plan: Plan) -> _Dictionaries:
        spec = plan.spec
        gpus = range(spec.gpus_per_node)
        uuids = [gpu_uuid(spec.seed, n, g) for n in range(spec.nodes) for g in gpus]
        columns: dict[str, list[str]] = {
            "metric": [*GPU_METRICS, *TRAINING_METRICS],
            "Hostname": [hostname(n) for n in range(spec.nodes)],
            "UUID": uuids,
            "device": [f"nvidia{g}" for g in gpus],
            "gpu": [str(g) for g in gpus],
            "job": [job.name for job in plan.jobs],
            "modelName": [spec.model_name],
            "simulated": ["true"],
        }
        values = {
            name: pa.array([*items, None] if name != "metric" else items, type=pa.string())
            for name, items in columns.items()
        }
        return cls(values)

    def null(self, name: str) -> int:
        return len(self.values[name]) - 1


def hostname(node: int) -> str:
    return f"node{node + 1:02d}"


class _ChunkBuilder:
    """Collects blocks of rows and turns them into one Arrow table.

    String columns are kept as runs (dictionary code, length) and decoded from run-end encoding:
    rows come grouped by series, so a column has few runs, and decoding them is about four times
    faster than taking one dictionary entry per row.
    """

    def __init__(self, plan: Plan, labels: _Dictionaries) -> None:
        self.plan = plan
        self.labels = labels
        self.rows = 0
        self.blocks: list[_Block] = []

    def add_node(self, node: int, steps: I64, values: F64) -> None:
        metrics, gpus, count = values.shape
        if count == 0:
            return
        gpu = np.tile(np.arange(gpus, dtype=np.int32), metrics)  # one run per series
        metric = np.repeat(np.arange(metrics, dtype=np.int32), gpus)
        per_series = _Runs(gpu, np.full(len(gpu), count, dtype=np.int64))
        self._add(
            steps, self.plan.node_offset_ms[node], values.reshape(-1),
            metric=_Runs(metric, per_series.lengths), UUID=per_series.with_codes(gpu + node * gpus),
            device=per_series, gpu=per_series, Hostname=node, job=None, modelName=0, simulated=0,
        )  # fmt: skip

    def add_job(self, j: int, steps: I64, values: F64) -> None:
        metrics, count = values.shape
        if count == 0:
            return
        first_metric = len(GPU_METRICS)
        metric = np.arange(first_metric, first_metric + metrics, dtype=np.int32)
        self._add(
            steps, self.plan.job_offset_ms[j], values.reshape(-1),
            metric=_Runs(metric, np.full(metrics, count, dtype=np.int64)), Hostname=None,
            UUID=None, device=None, gpu=None, job=j, modelName=None, simulated=0,
        )  # fmt: skip

    def _add(self, steps: I64, offset_ms: int, values: F64, **columns: _Runs | int | None) -> None:
        rows = len(values)
        stamps = self.plan.spec.start_ms + offset_ms + steps * self.plan.step_ms
        runs: dict[str, _Runs] = {}
        for name, column in columns.items():
            if isinstance(column, _Runs):
                runs[name] = column
            else:
                code = self.labels.null(name) if column is None else column
                runs[name] = _Runs(np.array([code], np.int32), np.array([rows], np.int64))
        self.blocks.append(_Block(np.tile(stamps, rows // len(steps)), values, runs))
        self.rows += rows

    def table(self) -> pa.Table:
        batches, group, size = [], list[_Block](), 0
        for block in self.blocks:
            group.append(block)
            size += len(block.values)
            if size >= BATCH_ROWS:
                batches.append(self._batch(group))
                group, size = [], 0
        if group:
            batches.append(self._batch(group))
        return pa.Table.from_batches(batches, schema=SCHEMA)

    def _batch(self, blocks: list[_Block]) -> pa.RecordBatch:
        def strings(name: str) -> pa.Array:
            codes = np.concatenate([block.runs[name].codes for block in blocks])
            lengths = np.concatenate([block.runs[name].lengths for block in blocks])
            run_ends = pa.array(np.cumsum(lengths), type=pa.int64())
            runs = self.labels.values[name].take(codes)
            encoded = pa.RunEndEncodedArray.from_arrays(run_ends, runs)
            decoded: pa.Array = _RUN_END_DECODE(encoded)
            return decoded

        columns = [
            strings("metric"),
            pa.array(np.concatenate([block.timestamps for block in blocks]), type=pa.int64()),
            pa.array(np.concatenate([block.values for block in blocks]), type=pa.float64()),
            *(strings(name) for name in LABEL_NAMES),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


@dataclass(frozen=True)
class _Runs:
    """A string column as runs: dictionary code and number of rows of each run."""

    codes: I32
    lengths: I64

    def with_codes(self, codes: I32) -> _Runs:
        return _Runs(codes, self.lengths)


@dataclass(frozen=True)
class _Block:
    """Rows of one node or one job: timestamps, values and the runs of each string column."""

    timestamps: I64
    values: F64
    runs: dict[str, _Runs]
