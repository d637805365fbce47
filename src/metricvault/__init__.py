"""metricvault: keep the metrics of GPU clusters and LLM training/inference for years.

import metricvault
vault = metricvault.open("./metricvault-data", need="read+write")  # or Vault.open(...)
vault.write(frame)
vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-7d", "now", step="1h")
with metricvault.track("llama-7b-lr3e-4", flops_per_token=6 * 7e9, gpu="H100-SXM") as run:
    run.log(step, loss=loss, tokens=batch_tokens)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "MetricVaultError",
    "Run",
    "Settings",
    "Vault",
    "__version__",
    "open",
    "parse_selector",
    "track",
]

# Imported on first use: the agent and the training API must not pay for pyarrow, DuckDB and
# pandas (the agent's memory budget is 60 MB; importing the store alone takes ~80 MB).
_LAZY = {
    "MetricVaultError": "metricvault.errors",
    "Settings": "metricvault.config",
    "Vault": "metricvault.public",
    "parse_selector": "metricvault.selector",
    "track": "metricvault.collect.training",
    "Run": "metricvault.collect.training",
}

# Eager, and light (it imports the backends only when called): ``import metricvault.open``
# binds the submodule as the package attribute ``open`` when it first loads, so the function
# must be bound after that has happened, here, or ``metricvault.open`` would be the module.
from metricvault.open import open as open  # noqa: E402

if TYPE_CHECKING:
    from metricvault.collect.training import Run, track
    from metricvault.config import Settings
    from metricvault.errors import MetricVaultError
    from metricvault.public import Vault
    from metricvault.selector import parse_selector


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'metricvault' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
