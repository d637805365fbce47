"""metricvault: keep the metrics of GPU clusters and LLM training/inference for years.

import metricvault
vault = metricvault.Vault.open("./metricvault-data")
vault.write(frame)
vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-7d", "now", step="1h")
"""

from metricvault.config import Settings
from metricvault.errors import MetricVaultError
from metricvault.selector import parse_selector
from metricvault.store.vault import Vault

__version__ = "0.1.0"
__all__ = ["MetricVaultError", "Settings", "Vault", "__version__", "parse_selector"]
