"""Tables of the store benchmark: built once as rows, rendered with rich and as markdown."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from bench.datasets import Summary
from bench.phases import FileResult, VaultResult, VmResult
from bench.queries import QUERY_TARGETS_MS, QueryCase, Timing

WRITE_TARGET = 1_000_000  # samples/s through Vault.write
NA = "n/a"
HOUR_MS = 3_600_000
VM_DATA_NOTE = "data/ (small + big parts) after force_merge"
VM_TOTAL_NOTE = "whole -storageDataPath: data/ + indexdb/ + metadata"


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
    sizes: list[tuple[str, str, int | None]] = []  # (store, what is counted, bytes)
    if run.vault is not None:
        for tier in ("raw", "1m", "1h"):
            counted = f"tier {tier}: {_int(run.vault.tier_rows(tier))} rows (vault.stats())"
            sizes.append((f"metricvault {tier}", counted, run.vault.tier_bytes(tier)))
        whole = "whole vault directory: all tiers, buffer, catalog, series"
        sizes.append(("metricvault dir", whole, run.vault.dir_bytes))
    if run.files is not None:
        csv_note = "long table, pyarrow CSV writer, gzip (default level)"
        parquet_note = "long table, pyarrow defaults (snappy, dictionary, 1 Mi-row groups)"
        sizes.append(("CSV + gzip", csv_note, run.files.csv_gzip_bytes))
        sizes.append(("Parquet", parquet_note, run.files.parquet_bytes))
    if run.vm is not None:
        vm = run.vm.sizes
        sizes.append(("VictoriaMetrics data", VM_DATA_NOTE, vm.data_bytes))
        sizes.append(("VictoriaMetrics total", VM_TOTAL_NOTE, vm.total_bytes))
    n = run.summary.samples
    rows: list[tuple[str, ...]] = [(s, c, _int(size), _per(size, n)) for s, c, size in sizes]
    headers = ("store", "what is counted (apparent file sizes)", "bytes", "bytes/sample")
    return Section(f"On disk: {n:,} samples", headers, rows)


def write_section(run: DatasetRun) -> Section:
    rows: list[tuple[str, ...]] = []
    if run.vault is not None:
        v = run.vault
        note = f"durable on return; maintain() afterwards took {v.maintain_s:.2f} s"
        rows.append(_write_row("metricvault Vault.write", v.samples_written, v.write_s, note))
    if run.vm is not None:
        m = run.vm
        note = (
            f"time in POSTs; JSON built in Python {m.format_s:.2f} s (excluded); "
            f"force_flush {m.flush_s:.2f} s, force_merge until settled {m.merge_s:.0f} s"
        )
        rows.append(
            _write_row("VictoriaMetrics /api/v1/import", run.summary.samples, m.post_s, note)
        )
    headers = ("system", "samples", "seconds", "samples/s", "note")
    return Section("Write throughput", headers, rows)


def _write_row(system: str, samples: int, seconds: float, note: str) -> tuple[str, ...]:
    return (system, _int(samples), f"{seconds:.2f}", _rate(samples, seconds), note)


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
            rows.append(_query_row(case, system, timing, request))
    if not any(case.key == "Q3" for case in run.cases):
        rows.append(("Q3", "both", NA, NA, NA, "no MFU / experiment series in this dataset"))
    headers = ("query", "system", "first ms", f"median of {runs} ms", "rows (expected)", "request")
    return Section("Query latency", headers, rows)


def _query_row(case: QueryCase, system: str, timing: Timing, request: str) -> tuple[str, ...]:
    rows = f"{timing.rows:,} ({case.expected_rows:,})"
    return (case.key, system, f"{timing.first_ms:.1f}", f"{timing.median_ms:.1f}", rows, request)


def target_section(run: DatasetRun) -> Section:
    rows: list[tuple[str, ...]] = [_raw_vs_vm(run), _rollup_vs_raw(run), _write_target(run)]
    measured = {c.key: c for c in run.cases}
    for key, limit in QUERY_TARGETS_MS.items():
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
    """Bytes per covered hour of the 1m tier against the raw tier's (plain bytes if no span)."""
    target = "1m tier bytes per covered span <= 1/2 of raw tier's"
    vault = run.vault
    raw = vault.tier_bytes("raw") if vault else None
    rollup = vault.tier_bytes("1m") if vault else None
    if vault is None or not raw or rollup is None:
        return target, NA, NA
    raw_span, rollup_span = vault.tier_span_ms("raw"), vault.tier_span_ms("1m")
    if raw_span is None or rollup_span is None:
        return (
            target,
            f"{rollup:,} B vs {raw:,} B = {rollup / raw:.2f}",
            _verdict(2 * rollup <= raw),
        )
    ratio = (rollup / rollup_span) / (raw / raw_span)
    text = (
        f"{rollup:,} B / {rollup_span / HOUR_MS:.1f} h vs {raw:,} B / {raw_span / HOUR_MS:.1f} h"
        f" = {ratio:.2f}"
    )
    return target, text, _verdict(ratio <= 0.5)


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
    if run.vault is not None:
        notes.append(_vault_state(run.vault))
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


def _vault_state(vault: VaultResult) -> str:
    stats = vault.stats
    buffer = stats.get("buffer", {})
    rollup = stats.get("rollup", {})
    return (
        f"metricvault after maintain(): {stats.get('series', NA)} series, buffer "
        f"{buffer.get('samples', NA)} samples / {buffer.get('bytes', NA)} bytes, "
        f"rollup pending hours {rollup.get('pending_hours', NA)}"
    )


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
