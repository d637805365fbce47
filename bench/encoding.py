"""Which Parquet encodings store metric columns smallest (docs/decisions/0002, 0006, 0011).

Backfills a fresh vault with one simulated day (2 nodes x 8 GPUs at 5 s), maintains it, then
prints what each physical column of its raw, 1m and 1h files costs per row, the 1m and 1h rows
written in each layout version (files.FORMAT_VERSION and the earlier ones) and with rollup row
groups of 8-64 Ki rows, and re-encodes the integer columns of its raw and 1m files under each
candidate encoding and zstd level. Run from the repository root (prints the machine's load
beside its tables):

    .venv/bin/python bench/encoding.py [--nodes 2] [--days 1]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from metricvault.sim import ClusterSpec, generate
from metricvault.store import files as fmt
from metricvault.store.rollup import ROLLUP_COLUMNS
from metricvault.store.vault import Vault

ENCODINGS = ("DELTA_BINARY_PACKED", "PLAIN", "BYTE_STREAM_SPLIT")


def column_bytes(array: pa.Array, encoding: str, level: int = 15) -> int:
    sink = io.BytesIO()
    pq.write_table(
        pa.table({"x": array}),
        sink,
        compression="zstd",
        compression_level=level,
        use_dictionary=False,
        column_encoding={"x": encoding},
        write_statistics=False,
    )
    return len(sink.getvalue())


def largest_file(vault: Vault, tier: str) -> pa.Table:
    path = max(vault.snapshot().tier_files(tier), key=lambda f: f.rows).path
    return pq.read_table(path, partitioning=None)


def rollup_table(table: pa.Table) -> None:
    print("\n1m rollup file: bytes per row of each integer column by encoding (zstd 15)")
    print("| column | " + " | ".join(ENCODINGS) + " |\n|---|" + "---|" * len(ENCODINGS))
    for name in [c for c in table.column_names if c.endswith("_i")]:
        sizes = [column_bytes(table[name], e) / table.num_rows for e in ENCODINGS]
        print(f"| {name} | " + " | ".join(f"{s:.3f}" for s in sizes) + " |")


def raw_table(table: pa.Table) -> None:
    """The raw value's integer part: all deltas, all byte planes, the stored per-series split."""
    ints = pc.coalesce(table["value_i"], table["value_j"])
    n = table.num_rows
    split = (
        column_bytes(table["value_i"], "DELTA_BINARY_PACKED")
        + column_bytes(table["value_j"], "BYTE_STREAM_SPLIT")
    ) / n
    print("\nraw file: bytes per sample of the scaled-integer values (zstd 15)")
    print("| layout | bytes/sample |\n|---|---|")
    print(f"| all DELTA_BINARY_PACKED | {column_bytes(ints, 'DELTA_BINARY_PACKED') / n:.3f} |")
    print(f"| all BYTE_STREAM_SPLIT | {column_bytes(ints, 'BYTE_STREAM_SPLIT') / n:.3f} |")
    print(f"| per-series choice, as stored (value_i + value_j) | {split:.3f} |")
    print("\nraw file: bytes per sample of value_i (deltas) by zstd level")
    print("| level | bytes/sample |\n|---|---|")
    for level in (9, 12, 15, 19):
        size = column_bytes(table["value_i"], "DELTA_BINARY_PACKED", level) / n
        print(f"| {level} | {size:.3f} |")


def per_column(vault: Vault, samples: int) -> None:
    """Bytes per row of every physical column of each tier's files (Parquet's own sizes)."""
    snap = vault.snapshot()
    for tier in ("raw", "1m", "1h"):
        sizes: dict[str, int] = {}
        rows = stored = 0
        for f in snap.tier_files(tier):
            meta = pq.ParquetFile(f.path).metadata
            rows, stored = rows + meta.num_rows, stored + f.bytes
            for g in range(meta.num_row_groups):
                for c in range(meta.num_columns):
                    column = meta.row_group(g).column(c)
                    name = column.path_in_schema.replace(".list.element", "")
                    sizes[name] = sizes.get(name, 0) + column.total_compressed_size
        print(f"\n{tier} files: {rows:,} rows, {stored:,} B = {stored / max(rows, 1):.3f} B/row, "
              f"{stored / max(samples, 1):.3f} B/raw sample; per column (B/row):")  # fmt: skip
        print("| column | B/row |\n|---|---|")
        for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {size / max(rows, 1):.3f} |")


def layouts(vault: Vault) -> None:
    """The same rollup rows written in each layout version by today's writer."""
    snap = vault.snapshot()
    versions = range(1, fmt.FORMAT_VERSION + 1)
    print("\nrollup rows written in each layout version (docs/decisions/0006, 0011): B/row")
    print("| tier | rows | " + " | ".join(f"format {v}" for v in versions) + " |")
    print("|---|---|" + "---|" * len(versions))
    for tier in ("1m", "1h"):
        rows = vault.reader.read(snap.tier_files(tier), None, 0, 2**62, tier, use_cache=False)
        rows = rows.select(list(ROLLUP_COLUMNS))
        sizes = [len(fmt.write_parquet(rows, fmt.ROLLUP_FLOATS, v)) for v in versions]
        n = max(rows.num_rows, 1)
        print(f"| {tier} | {rows.num_rows:,} | " + " | ".join(f"{s / n:.2f}" for s in sizes) + " |")


def row_groups(vault: Vault, sizes: tuple[int, ...] = (8192, 16384, 32768, 65536)) -> None:
    """The same rollup rows written with rollup row groups of each size (files.ROW_GROUP_ROWS
    set for the call): smaller groups let a few series' read decode fewer rows, at the cost of
    more pages, footers' column chunks and zstd frames."""
    snap = vault.snapshot()
    print("\nrollup rows written with row groups of each size (rows per group): B/row")
    print("| tier | rows | " + " | ".join(f"{n:,}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    kept = fmt.ROW_GROUP_ROWS[True]
    for tier in ("1m", "1h"):
        rows = vault.reader.read(snap.tier_files(tier), None, 0, 2**62, tier, use_cache=False)
        rows = rows.select(list(ROLLUP_COLUMNS))
        found = []
        try:
            for size in sizes:
                fmt.ROW_GROUP_ROWS[True] = size
                found.append(
                    len(fmt.write_parquet(rows, fmt.ROLLUP_FLOATS)) / max(rows.num_rows, 1)
                )
        finally:
            fmt.ROW_GROUP_ROWS[True] = kept
        print(f"| {tier} | {rows.num_rows:,} | " + " | ".join(f"{b:.3f}" for b in found) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--days", type=float, default=1.0)
    args = parser.parse_args()
    spec = ClusterSpec(nodes=args.nodes, days=args.days)
    with tempfile.TemporaryDirectory() as tmp, Vault.open_local(tmp) as vault:
        samples = sum(int(vault.write(chunk)) for chunk in generate(spec))
        vault.maintain(now_ms=spec.start_ms + int(args.days * 86_400_000) + 3_600_000)
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"simulated {args.nodes} nodes x 8 GPUs x {args.days:g} d (seed 0), "
              f"{samples:,} samples; load average {load}")  # fmt: skip
        per_column(vault, samples)
        layouts(vault)
        row_groups(vault)
        raw_table(largest_file(vault, "raw"))
        rollup_table(largest_file(vault, "1m"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
