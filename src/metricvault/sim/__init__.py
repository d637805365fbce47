"""Synthetic GPU-cluster workloads for the demo, tests and benchmarks.

A simulator, not a measurement: every series it produces carries ``simulated="true"``.
See `metricvault.sim.workload` for what a run contains.
"""

from metricvault.sim.workload import (
    GPU_METRICS,
    LABEL_NAMES,
    SCHEMA,
    TRAINING_METRICS,
    ClusterSpec,
    JobSpec,
    default_jobs,
    generate,
    series_count,
    to_pandas,
    total_samples,
)

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
