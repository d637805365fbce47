"""Experiment snapshots: one deterministic Parquet file per experiment.

Split in issue 12 into the file FORMAT (:mod:`metricvault.archive.snapshot_format`: schema,
metadata keys, content hash, reading back) and the EXPORT from a vault
(:mod:`metricvault.archive.snapshot_export`). This module keeps every name it had, so
``from metricvault.archive.snapshot import export_snapshot`` goes on working.
"""

from __future__ import annotations

from metricvault.archive.snapshot_export import (  # moved: issue 12
    TARGET_CHUNK_ROWS,
    export_snapshot,
)
from metricvault.archive.snapshot_format import (  # moved: issue 12
    META_PREFIX,
    RAW_SCHEMA,
    ROLLUP_COLUMNS,
    ROLLUP_SCHEMA,
    ROW_GROUP_ROWS,
    SCHEMA_VERSION,
    TIER_MS,
    RowHasher,
    SnapshotInfo,
    content_hash,
    file_metadata,
    open_writer,
    read_info,
    read_metadata,
    schema_for,
    snapshot_path,
    writer_schema,
)

__all__ = [
    "META_PREFIX",
    "RAW_SCHEMA",
    "ROLLUP_COLUMNS",
    "ROLLUP_SCHEMA",
    "ROW_GROUP_ROWS",
    "SCHEMA_VERSION",
    "TARGET_CHUNK_ROWS",
    "TIER_MS",
    "RowHasher",
    "SnapshotInfo",
    "content_hash",
    "export_snapshot",
    "file_metadata",
    "open_writer",
    "read_info",
    "read_metadata",
    "schema_for",
    "snapshot_path",
    "writer_schema",
]
