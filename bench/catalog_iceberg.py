"""Catalog cost: pyiceberg's SQL catalog (SQLite) vs metricvault's JSON snapshot catalog.

Measures what the store does on every flush and every query: committing one new data file, and
finding the current file list. Both register the same small Parquet files on local disk.

    python bench/catalog_iceberg.py            # needs: pip install "pyiceberg[sql-sqlite,pyarrow]"

pyiceberg is not a dependency of metricvault; this benchmark exists to justify
docs/decisions/0001-catalog.md and skips itself when pyiceberg is missing.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

COMMITS = 200


def _files(root: Path, n: int) -> list[str]:
    table = pa.table(
        {"series_id": pa.array([1, 2], pa.int64()), "ts": pa.array([1, 2], pa.int64())}
    )
    paths = []
    for i in range(n):
        path = root / f"part-{i}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths


def bench_iceberg(root: Path, files: list[str]) -> tuple[list[float], list[float]]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/cat.db", warehouse=f"file://{root}")
    catalog.create_namespace("mv")
    table = catalog.create_table("mv.raw", schema=pq.read_schema(files[0]))
    commits, plans = [], []
    for path in files:
        t0 = time.perf_counter()
        table.add_files([path])
        commits.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        table = catalog.load_table("mv.raw")
        _ = [task.file.file_path for task in table.scan().plan_files()]
        plans.append(time.perf_counter() - t0)
    return commits, plans


def bench_metricvault(root: Path, files: list[str]) -> tuple[list[float], list[float]]:
    from metricvault.config import Settings
    from metricvault.store.catalog import Catalog, Change, DataFile
    from metricvault.store.layout import open_location

    catalog = Catalog(open_location(str(root / "mv"), Settings()))
    reader = Catalog(catalog.loc)  # a second process's view: re-reads the latest snapshot
    commits, plans = [], []
    for i, path in enumerate(files):
        f = DataFile(path, "raw", "2026-01-01", 2, 100, 1, 2, i)
        t0 = time.perf_counter()
        catalog.commit(Change(add=[f], file_ids_used=1))
        commits.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _ = [x.path for x in reader.current().files]
        plans.append(time.perf_counter() - t0)
    return commits, plans


def main() -> int:
    try:
        import pyiceberg  # noqa: F401
    except ImportError:
        print('skipped: pip install "pyiceberg[sql-sqlite,pyarrow]" to run this benchmark')
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = _files(root, COMMITS)
        rows = {
            "pyiceberg SqlCatalog (SQLite) + add_files": bench_iceberg(root, files),
            "metricvault JSON snapshots": bench_metricvault(root, files),
        }
    print(
        f"| catalog | commit median (ms) | commit p95 (ms) | file list median (ms) | "
        f"file list at {COMMITS} files (ms) |"
    )
    print("|---|---|---|---|---|")
    for name, (commits, plans) in rows.items():
        p95 = sorted(commits)[int(len(commits) * 0.95)]
        print(
            f"| {name} | {statistics.median(commits) * 1e3:.2f} | {p95 * 1e3:.2f} | "
            f"{statistics.median(plans) * 1e3:.2f} | {plans[-1] * 1e3:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
