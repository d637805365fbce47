"""Tables of the store benchmark: built once as rows, rendered with rich and as markdown."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from bench.datasets import Summary
from bench.phases import FileResult, VaultResult, VmResult
from bench.queries import QueryCase

WRITE_TARGET = 1_000_000  # samples/s through Vault.write
NA = "n/a"


@dataclass
class DatasetRun:
    summary: Summary
    cases: list[QueryCase]
    vault: VaultResult | None = None
    files: FileResult | None = None
    vm: VmResult | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]


def _int(value: int | None) -> str:
    return NA if value is None else f"{value:,}"


def _per(value: int | None, samples: int) -> str:
    return NA if value is None or samples == 0 else f"{value / samples:.3f}"


def _rate(samples: int, seconds: float) -> str:
    return NA if seconds <= 0 else f"{samples / seconds:,.0f}"


def _verdict(ok: bool | None) -> str:
    return NA if ok is None else ("PASS" if ok else "MISS")


# --- sections ---------------------------------------------------------------------------------


def storage_section(run: DatasetRun) -> Section:
    n = run.summary.samples
    rows: list[tuple[str, ...]] = []
    if run.vault is not None:
        for tier in ("raw", "1m", "1h"):
            size = run.vault.tier_bytes(tier)
            counted = f"tier {tier}: {_int(run.vault.tier_rows(tier))} rows (vault.stats())"
            rows.append((f"metricvault {tier}", counted, _int(size), _per(size, n)))
        rows.append(
            (
                "metricvault dir",
                "whole vault directory: all tiers, buffer, catalog, series",
                _int(run.vault.dir_bytes),
                _per(run.vault.dir_bytes, n),
            )
        )
    if run.files is not None:
        rows.append(
            (
                "CSV + gzip",
                "long table, pyarrow CSV writer, gzip (default level)",
                _int(run.files.csv_gzip_bytes),
                _per(run.files.csv_gzip_bytes, n),
            )
        )
        rows.append(
            (
                "Parquet",
                "long table, pyarrow defaults (snappy, dictionary, 1 Mi-row groups)",
                _int(run.files.parquet_bytes),
                _per(run.files.parquet_bytes, n),
            )
        )
    if run.vm is not None:
        sizes = run.vm.sizes
        rows.append(
            (
                "VictoriaMetrics data",
                "data/ (small + big parts) after force_merge",
                _int(sizes.data_bytes),
                _per(sizes.data_bytes, n),
            )
        )
        rows.append(
            (
                "VictoriaMetrics total",
                "whole -storageDataPath: data/ + indexdb/ + metadata",
                _int(sizes.total_bytes),
                _per(sizes.total_bytes, n),
            )
        )
    headers = ("store", "what is counted (apparent file sizes)", "bytes", "bytes/sample")
    return Section(f"On disk: {n:,} samples", headers, rows)


def write_section(run: DatasetRun) -> Section:
    n = run.summary.samples
    rows: list[tuple[str, ...]] = []
    if run.vault is not None:
        v = run.vault
        rows.append(
            (
                "metricvault Vault.write",
                _int(v.samples_written),
                f"{v.write_s:.2f}",
                _rate(v.samples_written, v.write_s),
                f"durable on return; maintain() afterwards took {v.maintain_s:.2f} s",
            )
        )
    if run.vm is not None:
        m = run.vm
        rows.append(
            (
                "VictoriaMetrics /api/v1/import",
                _int(n),
                f"{m.post_s:.2f}",
                _rate(n, m.post_s),
                f"time in POSTs; JSON built in Python {m.format_s:.2f} s (excluded); "
                f"force_flush {m.flush_s:.2f} s, force_merge until settled {m.merge_s:.0f} s",
            )
        )
    headers = ("system", "samples", "seconds", "samples/s", "note")
    return Section("Write throughput", headers, rows)


def query_section(run: DatasetRun, runs: int) -> Section:
    rows: list[tuple[str, ...]] = []
    for case in run.cases:
        for system, result, request in (
            ("metricvault", run.vault, case.vault_call),
            ("VictoriaMetrics", run.vm, case.vm_request),
        ):
            timing = None if result is None else result.timings.get(case.key)
            if timing is None:
                continue
            rows.append(
                (
                    case.key,
                    system,
                    f"{timing.first_ms:.1f}",
                    f"{timing.median_ms:.1f}",
                    f"{timing.rows:,} ({case.expected_rows:,})",
                    request,
                )
            )
    if not any(case.key == "Q3" for case in run.cases):
        rows.append(("Q3", "both", NA, NA, NA, "no MFU / experiment series in this dataset"))
    headers = ("query", "system", "first ms", f"median of {runs} ms", "rows (expected)", "request")
    return Section("Query latency", headers, rows)


def target_section(run: DatasetRun) -> Section:
    rows: list[tuple[str, ...]] = [_raw_vs_vm(run), _rollup_vs_raw(run), _write_target(run)]
    targets = {"Q1": 20.0, "Q2": 5.0, "Q3": 20.0}
    measured = {c.key: c for c in run.cases}
    for key, limit in targets.items():
        timing = run.vault.timings.get(key) if run.vault and key in measured else None
        text = NA if timing is None else f"{timing.median_ms:.1f} ms"
        ok = None if timing is None else timing.median_ms <= limit
        rows.append((f"{key} median <= {limit:g} ms", text, _verdict(ok)))
    return Section("Targets (metricvault)", ("target", "measured", "result"), rows)


def _raw_vs_vm(run: DatasetRun) -> tuple[str, str, str]:
    raw = run.vault.tier_bytes("raw") if run.vault else None
    peer = run.vm.sizes.data_bytes if run.vm else None
    target = "raw bytes/sample <= VictoriaMetrics data/ bytes/sample"
    if raw is None or peer is None:
        return target, f"{_per(raw, run.summary.samples)} vs {NA}", NA
    n = run.summary.samples
    return target, f"{raw / n:.3f} vs {peer / n:.3f}", _verdict(raw <= peer)


def _rollup_vs_raw(run: DatasetRun) -> tuple[str, str, str]:
    raw = run.vault.tier_bytes("raw") if run.vault else None
    rollup = run.vault.tier_bytes("1m") if run.vault else None
    target = "1m tier bytes <= 1/2 raw tier bytes (same data)"
    if not raw or rollup is None:
        return target, NA, NA
    return target, f"{rollup:,} / {raw:,} = {rollup / raw:.2f}", _verdict(rollup * 2 <= raw)


def _write_target(run: DatasetRun) -> tuple[str, str, str]:
    target = f"Vault.write >= {WRITE_TARGET:,} samples/s"
    if run.vault is None or run.vault.write_s <= 0:
        return target, NA, NA
    rate = run.vault.samples_written / run.vault.write_s
    return target, f"{rate:,.0f} samples/s", _verdict(rate >= WRITE_TARGET)


def sections(run: DatasetRun, runs: int) -> list[Section]:
    return [storage_section(run), write_section(run), query_section(run, runs), target_section(run)]


def run_notes(run: DatasetRun) -> list[str]:
    notes = list(run.notes)
    s = run.summary
    notes.append(
        f"{s.samples:,} samples, {len(s.series):,} series, {len(s.gpus):,} GPUs, "
        f"{s.span_ms / 3_600_000:.1f} h of data; Q2 reads {s.probe_selector()}"
    )
    if run.vm is not None:
        notes.append(f"VictoriaMetrics holds {run.vm.series:,} series")
        fid = run.vm.fidelity
        if fid is not None:
            state = (
                "exact" if fid.exact else f"not exact (max relative error {fid.max_rel_error:.2e})"
            )
            notes.append(
                f"VictoriaMetrics export of the Q2 series: {fid.stored:,} of {fid.sent:,} samples, "
                f"values {state}"
            )
    return notes


# --- rendering --------------------------------------------------------------------------------


def print_rich(console: Console, title: str, run: DatasetRun, runs: int) -> None:
    console.rule(f"[bold]{title}")
    for section in sections(run, runs):
        table = Table(title=section.title, title_justify="left", show_lines=False)
        for header in section.headers:
            table.add_column(header, overflow="fold")
        for row in section.rows:
            table.add_row(*[_colour(cell) for cell in row])
        console.print(table)
    for note in run_notes(run):
        console.print(f"- {note}", highlight=False, markup=False)


def _colour(cell: str) -> str:
    return {"PASS": "[green]PASS[/]", "MISS": "[red]MISS[/]"}.get(cell, cell.replace("[", r"\["))


def markdown(title: str, run: DatasetRun, runs: int) -> str:
    parts = [f"## {title}", ""]
    for section in sections(run, runs):
        parts += [f"**{section.title}**", "", markdown_table(section.headers, section.rows), ""]
    parts += [f"- {note}" for note in run_notes(run)]
    return "\n".join(parts) + "\n"


def markdown_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.replace("|", r"\|") for cell in cells) + " |"

    numeric = [
        all(_looks_numeric(row[i]) for row in rows) if rows else False for i in range(len(headers))
    ]
    rule = tuple("---:" if right else "---" for right in numeric)
    return "\n".join([line(headers), "| " + " | ".join(rule) + " |", *map(line, rows)])


def _looks_numeric(cell: str) -> bool:
    return cell == NA or cell.replace(",", "").replace(".", "", 1).isdigit()
