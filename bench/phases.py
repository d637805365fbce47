"""The phases of the store benchmark; each streams the workload once.

1. metricvault: ``Vault.write`` every chunk (timed), ``maintain``, ``stats``, queries. The same
   pass builds the :class:`~bench.datasets.Summary` (outside the timed calls).
2. files: the long table as gzip CSV and as Parquet with pyarrow's default settings.
3. VictoriaMetrics: import, flush, force-merge, sizes, queries, and a check that the exported
   samples of one series equal the ones sent.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from bench.datasets import Summary, Workload, conform, long_schema
from bench.peers import VictoriaMetrics, VmSizes, dir_bytes
from bench.queries import Timing, query_cases, time_runs

HOUR_MS = 3_600_000
PARQUET_ROW_GROUP = 1024 * 1024  # pyarrow's default maximum row-group length


def load_vault_class() -> tuple[Any, str]:
    """``metricvault.Vault``, or None and the reason it cannot be imported."""
    try:
        return importlib.import_module("metricvault").Vault, ""
    except (ImportError, AttributeError) as exc:
        return None, (
            f"metricvault.Vault is not importable ({exc}); install the project "
            "(`.venv/bin/pip install -e .`) - skipping metricvault"
        )


# --- metricvault ------------------------------------------------------------------------------


@dataclass
class VaultResult:
    samples_written: int
    write_s: float
    maintain_s: float
    stats: dict[str, Any]
    dir_bytes: int
    timings: dict[str, Timing] = field(default_factory=dict)

    def tier_bytes(self, tier: str) -> int | None:
        value = self.stats.get("tiers", {}).get(tier, {}).get("bytes")
        return None if value is None else int(value)

    def tier_rows(self, tier: str) -> int | None:
        value = self.stats.get("tiers", {}).get(tier, {}).get("rows")
        return None if value is None else int(value)

    def tier_span_ms(self, tier: str) -> int | None:
        """Time the tier covers (its first to last timestamp), where stats() says."""
        info = self.stats.get("tiers", {}).get(tier, {})
        first, last = info.get("first"), info.get("last")
        return None if first is None or last is None else max(1, int(last) - int(first))


def scan(workload: Workload, summary: Summary) -> None:
    """Only the summary pass (when metricvault cannot run)."""
    for chunk in workload.chunks():
        summary.observe(chunk)


def run_vault(
    vault_cls: Any, workload: Workload, summary: Summary, workdir: Path, runs: int
) -> VaultResult:
    path = workdir / "metricvault"
    vault = vault_cls.open(str(path))
    try:
        written, write_s = _write_all(vault, workload, summary)
        started = time.perf_counter()
        vault.maintain(now_ms=summary.max_ts + HOUR_MS)
        maintain_s = time.perf_counter() - started
        result = VaultResult(written, write_s, maintain_s, vault.stats(), dir_bytes(path))
        for case in query_cases(summary):
            result.timings[case.key] = time_runs(partial(case.run_vault, vault), runs)
        return result
    finally:
        vault.close()


def _write_all(vault: Any, workload: Workload, summary: Summary) -> tuple[int, float]:
    written, seconds = 0, 0.0
    for chunk in workload.chunks():
        summary.observe(chunk)
        started = time.perf_counter()
        written += int(vault.write(chunk))
        seconds += time.perf_counter() - started
    return written, seconds


# --- flat files -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileResult:
    csv_gzip_bytes: int
    parquet_bytes: int
    seconds: float


def write_files(workload: Workload, summary: Summary, workdir: Path) -> FileResult:
    """Streams the long table into ``long.csv.gz`` and ``long.parquet`` (pyarrow defaults)."""
    schema = long_schema(summary.labels)
    csv_path, parquet_path = workdir / "long.csv.gz", workdir / "long.parquet"
    started = time.perf_counter()
    pending: list[pa.Table] = []
    with (
        pa.CompressedOutputStream(str(csv_path), "gzip") as gz,
        pacsv.CSVWriter(gz, schema) as csv_writer,
        pq.ParquetWriter(str(parquet_path), schema) as parquet_writer,
    ):
        for chunk in workload.chunks():
            table = conform(chunk, schema)
            csv_writer.write_table(table)
            pending = _write_full_row_groups(parquet_writer, [*pending, table])
        for table in pending:
            parquet_writer.write_table(table)
    seconds = time.perf_counter() - started
    return FileResult(csv_path.stat().st_size, parquet_path.stat().st_size, seconds)


def _write_full_row_groups(writer: pq.ParquetWriter, pending: list[pa.Table]) -> list[pa.Table]:
    """Write whole default-size row groups (as one big write_table would); return the rest."""
    rows = sum(t.num_rows for t in pending)
    if rows < PARQUET_ROW_GROUP:
        return pending
    table = pa.concat_tables(pending)
    full = rows - rows % PARQUET_ROW_GROUP
    writer.write_table(table.slice(0, full))
    return [table.slice(full)]


# --- VictoriaMetrics --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fidelity:
    """The exported samples of the Q2 series compared with the samples sent."""

    sent: int
    stored: int
    exact: bool
    max_rel_error: float


@dataclass
class VmResult:
    format_s: float
    post_s: float
    flush_s: float
    merge_s: float
    sizes: VmSizes
    series: int
    fidelity: Fidelity | None
    timings: dict[str, Timing] = field(default_factory=dict)


def run_vm(binary: str, workload: Workload, summary: Summary, workdir: Path, runs: int) -> VmResult:
    with VictoriaMetrics(binary, workdir) as vm:
        format_s = post_s = 0.0
        for chunk in workload.chunks():
            chunk_format_s, chunk_post_s = vm.ingest(chunk)
            format_s, post_s = format_s + chunk_format_s, post_s + chunk_post_s
        started = time.perf_counter()
        vm.force_flush()
        flush_s = time.perf_counter() - started
        merge_s = vm.force_merge_and_wait()
        result = VmResult(
            format_s,
            post_s,
            flush_s,
            merge_s,
            vm.sizes(),
            vm.series_count(),
            _fidelity(vm, summary),
        )
        for case in query_cases(summary):
            result.timings[case.key] = time_runs(partial(case.run_vm, vm), runs)
        return result


def _fidelity(vm: VictoriaMetrics, summary: Summary) -> Fidelity | None:
    sent_ts, sent_values = summary.probe_series()
    if sent_ts.size == 0:
        return None
    stored_ts, stored_values = vm.export(summary.probe_selector())
    if not np.array_equal(sent_ts, stored_ts):
        return Fidelity(sent_ts.size, stored_ts.size, False, float("nan"))
    exact = bool(np.array_equal(sent_values, stored_values, equal_nan=True))
    scale = np.maximum(np.abs(sent_values), np.finfo(np.float64).tiny)
    rel = np.abs(stored_values - sent_values) / scale
    return Fidelity(sent_ts.size, stored_ts.size, exact, float(np.nanmax(rel, initial=0.0)))
