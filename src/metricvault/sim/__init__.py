"""Synthetic GPU-cluster workloads for the demo, tests and benchmarks.

A simulator, not a measurement: every series it produces carries ``simulated="true"``.
See `metricvault.sim.workload` for what a run contains.

The names below are imported on first use: the agent's simulated GPUs need only the GPU model
(numpy), not the Arrow/pandas batch builders of ``workload``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'metricvault.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module("metricvault.sim.workload"), name)
    globals()[name] = value
    return value
