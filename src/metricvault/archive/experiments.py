"""Moved (issue 12): the record to :mod:`metricvault.experiment`, the file registry to
:mod:`metricvault.store.experiments`. Kept so that existing imports keep working."""

from __future__ import annotations

from metricvault.experiment import (  # moved: issue 12
    EDITABLE,
    EXPERIMENTS_SCHEMA,
    MAX_ID_LENGTH,
    Experiment,
    RegistryBase,
    apply_changes,
    check,
    experiments_table,
    make_experiment,
    select,
    unknown_message,
    validate_id,
)
from metricvault.store.experiments import Experiments  # moved: issue 12

__all__ = [
    "EDITABLE",
    "EXPERIMENTS_SCHEMA",
    "MAX_ID_LENGTH",
    "Experiment",
    "Experiments",
    "RegistryBase",
    "apply_changes",
    "check",
    "experiments_table",
    "make_experiment",
    "select",
    "unknown_message",
    "validate_id",
]
