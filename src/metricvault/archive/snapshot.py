"""``export_snapshot``: freeze an experiment as one Parquet file, at the import path README.md
shows users.

The file format (schema, metadata keys, content hash, reading back) lives in
:mod:`metricvault.archive.snapshot_format` and the export from a vault in
:mod:`metricvault.archive.snapshot_export`; this module is documented API, not a shim.
"""

from __future__ import annotations

from metricvault.archive.snapshot_export import export_snapshot

__all__ = ["export_snapshot"]
