"""Archive benchmark: export one experiment to a snapshot, next to CSV and default Parquet.

Simulates a cluster (``metricvault.sim``, 2 nodes x 8 GPUs x 30 days at 5 s by default; every
series carries ``simulated="true"``: the data is simulated, not measured), writes it into a fresh
vault, runs ``maintain()`` as of one day after the end (raw retention is set to ``forever`` so
all raw samples stay), and registers one experiment covering every series for the whole span.

Then, each in its own spawned child process (so its peak memory is its own), it times
``export_snapshot`` at tier raw (twice, into two directories: the files must be byte-identical),
1m and 1h, and reports rows/s, file size, bytes/row, and the child's peak RSS (``VmHWM``, reset
just before the export) with its increase over the RSS just before. The raw snapshot is then read
back in batches and the same rows written as CSV (pyarrow's CSV writer into a byte counter: the
CSV is counted, never stored) and as Parquet with pyarrow's default settings.

Run from the repository root::

    .venv/bin/python bench/archive.py --quick        # 2 days, ~1 min
    .venv/bin/python bench/archive.py                # 30 days (~96 M rows), ~10 min on 2 cores
    .venv/bin/python bench/archive.py --quick --profile 15   # + cProfile of the raw export

It installs nothing and needs only the project venv. Rich tables go to stdout, then the markdown
report (or to ``--markdown FILE``); progress goes to stderr.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):  # run as a script from a checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import hashlib
import multiprocessing
import os
import platform
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

DAY_MS = 86_400_000
PARQUET_ROW_GROUP = 1024 * 1024  # pyarrow's default maximum row-group length
RETENTION_RAW = "forever"  # keep every raw sample of the simulated span, whatever --days
SELECTOR = '{simulated="true"}'  # every series the simulator makes: both nodes and the jobs
GIT_SHA = hashlib.sha1(b"metricvault bench/archive.py").hexdigest()  # a fixed, valid commit id
NA = "n/a"
LOAD_AT_START = os.getloadavg()[0]
log = Console(stderr=True, highlight=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--days", type=float, default=30, help="simulated days (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    parser.add_argument("--quick", action="store_true", help="small size: 2 days")
    parser.add_argument("--no-baselines", action="store_true", help="skip CSV and Parquet")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also run the raw export under cProfile in this process (not timed) and print "
        "the top N functions to stderr",
    )
    parser.add_argument("--workdir", default=None, help="where temporary files go (default TMP)")
    parser.add_argument("--keep", action="store_true", help="keep the vault and files afterwards")
    parser.add_argument("--markdown", metavar="FILE", help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.quick:
        args.days = 2
    if args.nodes < 1 or args.gpus_per_node < 1 or args.days <= 0:
        parser.error("--nodes, --gpus-per-node and --days must be positive")
    return args


# --- the vault --------------------------------------------------------------------------------


@dataclass
class Setup:
    spec: Any  # metricvault.sim.ClusterSpec
    experiment_id: str
    samples: int
    write_s: float
    generate_s: float
    maintain_s: float
    stats: dict[str, Any]


def build_vault(args: argparse.Namespace, vault_dir: Path) -> Setup:
    """Simulate into a fresh vault, maintain it, register the experiment."""
    from metricvault.public import Vault
    from metricvault.sim import ClusterSpec, generate

    spec = ClusterSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days, seed=args.seed
    )
    end_ms = spec.start_ms + round(args.days * DAY_MS)
    samples, write_s, generate_s = 0, 0.0, 0.0
    with Vault.open(str(vault_dir), retention_raw=RETENTION_RAW) as vault:
        chunks = generate(spec)
        while True:
            started = time.perf_counter()
            chunk = next(chunks, None)
            generate_s += time.perf_counter() - started
            if chunk is None:
                break
            started = time.perf_counter()
            samples += vault.write(chunk)
            write_s += time.perf_counter() - started
        log.print(
            f"  wrote {samples:,} samples in {write_s:.1f} s (+{generate_s:.1f} s simulating)"
        )
        started = time.perf_counter()
        vault.maintain(now_ms=end_ms + DAY_MS)  # one day after the end: all closed and rolled up
        maintain_s = time.perf_counter() - started
        log.print(f"  maintain() in {maintain_s:.1f} s")
        stats = vault.stats(now=end_ms + DAY_MS)
        experiment_id = f"sim-{args.nodes}x{args.gpus_per_node}-{args.days:g}d"
        vault.experiments.create(
            experiment_id,
            SELECTOR,
            start=spec.start_ms,
            end=end_ms,
            git_sha=GIT_SHA,
            name=f"simulated {args.nodes} x {args.gpus_per_node} GPUs, {args.days:g} d",
            notes="simulated data (metricvault.sim), made by bench/archive.py",
            now=end_ms,
        )
    return Setup(spec, experiment_id, samples, write_s, generate_s, maintain_s, stats)


# --- exports, each in a child process ---------------------------------------------------------


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def export_in_child(vault_dir: str, experiment_id: str, out_dir: str, tier: str) -> dict[str, Any]:
    """Runs in a spawned process: open the vault, reset the peak RSS, export, report."""
    from metricvault.archive.snapshot import export_snapshot
    from metricvault.public import Vault

    with Vault.open(vault_dir, create=False, retention_raw=RETENTION_RAW) as vault:
        try:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            reset = True
        except OSError:
            reset = False
        baseline_kib = _status_kib("VmRSS")
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        info = export_snapshot(vault, experiment_id, out_dir, tier=tier)
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        peak_kib = _status_kib("VmHWM")
    return {
        "tier": tier,
        "path": str(info.path),
        "rows": info.rows,
        "series": info.series,
        "bytes": info.bytes,
        "content_hash": info.content_hash,
        "seconds": seconds,
        "cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime,
        "baseline_mib": baseline_kib / 1024,
        "peak_mib": peak_kib / 1024,
        "peak_reset": reset,  # False: the peak includes start-up (imports, opening the vault)
    }


def run_export(vault_dir: Path, experiment_id: str, out_dir: Path, tier: str) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        result: dict[str, Any] = pool.submit(
            export_in_child, str(vault_dir), experiment_id, str(out_dir), tier
        ).result()
    return result


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


# --- baselines: the same rows as CSV and as default Parquet ------------------------------------


class ByteCounter:
    """A write-only sink that keeps nothing and counts the bytes written to it."""

    def __init__(self) -> None:
        self.bytes = 0
        self.closed = False

    def write(self, data: Any) -> int:
        size = len(data)
        self.bytes += size
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@dataclass
class Baselines:
    rows: int = 0
    read_s: float = 0.0  # reading the snapshot back (shared by both writers, not in theirs)
    csv_bytes: int = 0
    csv_s: float = 0.0
    parquet_bytes: int = 0
    parquet_s: float = 0.0
    parquet_row_groups: int = 0
    timestamp_example: str = ""


def write_baselines(snapshot: Path, parquet_path: Path) -> Baselines:
    """Reads the snapshot in batches of PARQUET_ROW_GROUP rows and writes each batch to both
    writers; each writer's time is only its own calls."""
    result = Baselines()
    source = pq.ParquetFile(snapshot)
    schema = source.schema_arrow.remove_metadata()  # the data's columns, not the snapshot's keys
    counter = ByteCounter()
    csv_sink = pa.PythonFile(counter, mode="w")
    csv_writer = pacsv.CSVWriter(csv_sink, schema)  # header, then pyarrow's default formatting
    parquet_writer = pq.ParquetWriter(parquet_path, schema)  # pyarrow defaults
    batches = source.iter_batches(batch_size=PARQUET_ROW_GROUP)
    while True:
        started = time.perf_counter()
        batch = next(batches, None)
        result.read_s += time.perf_counter() - started
        if batch is None:
            break
        table = pa.Table.from_batches([batch]).replace_schema_metadata(None)
        if not result.timestamp_example:
            one = pa.BufferOutputStream()
            pacsv.write_csv(table.select(["timestamp"]).slice(0, 1), one)
            result.timestamp_example = one.getvalue().to_pybytes().decode().splitlines()[1]
        started = time.perf_counter()
        csv_writer.write_table(table)
        result.csv_s += time.perf_counter() - started
        started = time.perf_counter()
        parquet_writer.write_table(table)  # one row group per batch: pyarrow's default length
        result.parquet_s += time.perf_counter() - started
        result.rows += table.num_rows
    started = time.perf_counter()
    csv_writer.close()
    csv_sink.close()
    result.csv_s += time.perf_counter() - started
    started = time.perf_counter()
    parquet_writer.close()
    result.parquet_s += time.perf_counter() - started
    result.csv_bytes = counter.bytes
    result.parquet_bytes = parquet_path.stat().st_size
    result.parquet_row_groups = pq.ParquetFile(parquet_path).num_row_groups
    return result


# --- profile ----------------------------------------------------------------------------------


def profile_export(vault_dir: Path, experiment_id: str, out_dir: Path, top: int) -> list[str]:
    """cProfile one raw export in this process; the top functions by cumulative time (metricvault
    code only), then the top by own time (anything)."""
    import cProfile
    import pstats

    from metricvault.archive.snapshot import export_snapshot
    from metricvault.public import Vault

    profiler = cProfile.Profile()
    with Vault.open(str(vault_dir), create=False, retention_raw=RETENTION_RAW) as vault:
        profiler.enable()
        export_snapshot(vault, experiment_id, out_dir, tier="raw")
        profiler.disable()
    stats: dict[Any, Any] = pstats.Stats(profiler).stats
    total = max(ct for (_cc, _nc, _tt, ct, _callers) in stats.values())

    def name(key: tuple[str, int, str]) -> str:
        filename, line, func = key
        if "/metricvault/" in filename:
            filename = "metricvault/" + filename.rsplit("/metricvault/", 1)[1]
        elif filename != "~":
            filename = Path(filename).name
        return f"{filename}:{line} {func}" if filename != "~" else func

    lines = [f"cProfile of export_snapshot(tier='raw'): {total:.2f} s under the profiler"]
    ours = [(k, v) for k, v in stats.items() if "/metricvault/" in k[0]]
    lines.append(f"top {top} metricvault functions by cumulative time (calls, own s, cum s):")
    for key, (_cc, calls, own, cum, _callers) in sorted(ours, key=lambda kv: -kv[1][3])[:top]:
        lines.append(f"  {cum:7.2f} s cum {own:7.2f} s own {calls:8,}x  {name(key)}")
    lines.append(f"top {top} functions by own time (any code):")
    for key, (_cc, calls, own, cum, _callers) in sorted(stats.items(), key=lambda kv: -kv[1][2])[
        :top
    ]:
        lines.append(f"  {own:7.2f} s own {cum:7.2f} s cum {calls:8,}x  {name(key)}")
    return lines


# --- report -----------------------------------------------------------------------------------

HEADERS = (
    "what",
    "rows",
    "series",
    "bytes",
    "bytes/row",
    "size vs raw snapshot",
    "seconds",
    "rows/s",
    "peak RSS MiB",
    "RSS increase MiB",
)


@dataclass
class Report:
    args: argparse.Namespace
    setup: Setup
    exports: dict[str, dict[str, Any]] = field(default_factory=dict)
    identical: bool | None = None
    sha_a: str = ""
    sha_b: str = ""
    baselines: Baselines | None = None
    profile: list[str] = field(default_factory=list)


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _s(seconds: float) -> str:
    return f"{seconds:,.1f}" if seconds >= 10 else f"{seconds:.2f}"


def result_rows(report: Report) -> list[tuple[str, ...]]:
    raw = report.exports["raw"]
    rows = []

    def size_vs(size: int) -> str:
        return f"{size / raw['bytes']:.2f}x"

    for key, label in (
        ("raw", "snapshot, tier raw"),
        ("raw-again", "snapshot, tier raw (2nd export)"),
        ("1m", "snapshot, tier 1m"),
        ("1h", "snapshot, tier 1h"),
    ):
        e = report.exports.get(key)
        if e is None:
            continue
        increase = e["peak_mib"] - e["baseline_mib"]
        rows.append(
            (
                label,
                _n(e["rows"]),
                _n(e["series"]),
                _n(e["bytes"]),
                f"{e['bytes'] / e['rows']:.3f}",
                size_vs(e["bytes"]),
                _s(e["seconds"]),
                _n(e["rows"] / e["seconds"]),
                _n(e["peak_mib"]),
                _n(increase) if e["peak_reset"] else f"{increase:,.0f} (incl. start-up)",
            )
        )
    b = report.baselines
    if b is not None:
        for label, size, seconds in (
            ("CSV of the raw rows (counted, not stored)", b.csv_bytes, b.csv_s),
            ("Parquet, pyarrow defaults, of the raw rows", b.parquet_bytes, b.parquet_s),
        ):
            rows.append(
                (
                    label,
                    _n(b.rows),
                    _n(raw["series"]),
                    _n(size),
                    f"{size / b.rows:.3f}",
                    size_vs(size),
                    _s(seconds),
                    _n(b.rows / seconds) if seconds > 0 else NA,
                    NA,
                    NA,
                )
            )
    tier = report.setup.stats["tiers"]["raw"]
    rows.append(
        (
            "vault raw tier (vault.stats(), for reference)",
            _n(tier["rows"]),
            _n(report.setup.stats["series"]),
            _n(tier["bytes"]),
            f"{tier['bytes'] / tier['rows']:.3f}" if tier["rows"] else NA,
            size_vs(tier["bytes"]),
            NA,
            NA,
            NA,
            NA,
        )
    )
    return rows


def head_lines(report: Report) -> list[str]:
    args, setup, spec = report.args, report.setup, report.setup.spec
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(f"{name} {_version(name)}" for name in ("pyarrow", "metricvault"))
    raw = report.exports["raw"]
    lines = [
        f"command: `{' '.join(['.venv/bin/python bench/archive.py', *sys.argv[1:]])}`",
        f"run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: "
        f"{os.cpu_count()} CPUs, {memory:.0f} GiB RAM, Python {platform.python_version()}; "
        f"load average at start {LOAD_AT_START:.1f}, at the end {os.getloadavg()[0]:.1f} (other "
        f"work here skews timings); {versions}",
        f'data: SIMULATED (metricvault.sim, every series labelled simulated="true"): '
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs x {args.days:g} d at "
        f"{spec.interval_s} s, seed {args.seed}: {setup.samples:,} samples in "
        f"{setup.stats['series']:,} series (GPU series and the training jobs' series)",
        f"vault: Vault.write {setup.write_s:.1f} s ({setup.generate_s:.1f} s simulating, not "
        f"counted), maintain() as of one day after the end {setup.maintain_s:.1f} s, "
        f"retention_raw={RETENTION_RAW}",
        f"experiment `{setup.experiment_id}`: selector `{SELECTOR}`, the whole "
        f"{args.days:g} d, end set; export_snapshot(vault, id, dir, tier=...) writes "
        f"{raw['series']:,} series",
        "snapshot rows: each export in a fresh spawned process; seconds = the export_snapshot "
        "call (querying the vault, sorting, writing, hashing), rows/s = rows / seconds; peak "
        "RSS = the child's VmHWM, reset (/proc/self/clear_refs) after opening the vault; "
        "increase = peak - RSS just before the export",
    ]
    b = report.baselines
    if b is not None:
        lines.append(
            "baselines: the raw snapshot read back with ParquetFile.iter_batches("
            f"{PARQUET_ROW_GROUP:,} rows) ({b.read_s:.1f} s, not counted), the same columns "
            "(experiment_id, git_sha, series_id, metric, labels JSON, timestamp, value); CSV = "
            "pyarrow.csv.CSVWriter with header into a byte counter, timestamp as ISO 8601 UTC "
            f"text (`{b.timestamp_example}`); Parquet = pq.ParquetWriter(path, schema) with "
            f"pyarrow defaults (snappy, dictionary), {b.parquet_row_groups} row groups of "
            f"{PARQUET_ROW_GROUP:,} rows; seconds = the writer calls only"
        )
    if report.identical is not None:
        lines.append(
            "determinism: two raw exports into two directories are byte-identical: "
            f"{'YES' if report.identical else 'NO'} (sha256 {report.sha_a[:16]}... vs "
            f"{report.sha_b[:16]}...; content_hash {raw['content_hash'][:23]}...)"
        )
    return lines


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"


def print_rich(head: list[str], report: Report) -> None:
    console = Console(highlight=False, width=shutil.get_terminal_size((200, 40)).columns)
    table = Table(title="experiment archive export (simulated data)")
    for i, name in enumerate(HEADERS):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in result_rows(report):
        table.add_row(*row)
    for line in head:
        console.print(f"[dim]{line}[/]", markup=True)
    console.print(table)


def markdown(head: list[str], report: Report) -> str:
    aligns = ["---"] + ["---:"] * (len(HEADERS) - 1)
    out = ["# metricvault experiment archive benchmark", ""]
    out += [f"- {line}" for line in head]
    out += ["", "| " + " | ".join(HEADERS) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(row) + " |" for row in result_rows(report)]
    out.append("")
    if report.profile:
        out += ["```", *report.profile, "```", ""]
    return "\n".join(out)


# --- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="metricvault-archive-", dir=args.workdir))
    vault_dir = root / "vault"
    try:
        log.print(
            f"[bold]simulating {args.nodes} x {args.gpus_per_node} GPUs x {args.days:g} d "
            f"into {vault_dir}[/] (simulated data)"
        )
        report = Report(args, build_vault(args, vault_dir))
        exp_id = report.setup.experiment_id
        for key, tier, out in (
            ("raw", "raw", root / "a"),
            ("raw-again", "raw", root / "b"),
            ("1m", "1m", root / "1m"),
            ("1h", "1h", root / "1h"),
        ):
            log.print(f"export tier {tier} -> {out} ...")
            e = report.exports[key] = run_export(vault_dir, exp_id, out, tier)
            log.print(
                f"  {e['rows']:,} rows, {e['bytes']:,} bytes in {e['seconds']:.1f} s, peak RSS "
                f"{e['peak_mib']:,.0f} MiB (+{e['peak_mib'] - e['baseline_mib']:,.0f})"
            )
        report.sha_a = sha256_file(report.exports["raw"]["path"])
        report.sha_b = sha256_file(report.exports["raw-again"]["path"])
        report.identical = report.sha_a == report.sha_b
        if not args.keep:
            Path(report.exports["raw-again"]["path"]).unlink()
        if not args.no_baselines:
            log.print("CSV (counted) and default Parquet of the raw snapshot's rows ...")
            parquet_path = root / "default.parquet"
            report.baselines = write_baselines(Path(report.exports["raw"]["path"]), parquet_path)
            if not args.keep:
                parquet_path.unlink()
            b = report.baselines
            log.print(
                f"  CSV {b.csv_bytes:,} bytes in {b.csv_s:.1f} s; Parquet {b.parquet_bytes:,} "
                f"bytes in {b.parquet_s:.1f} s (reading {b.read_s:.1f} s)"
            )
        if args.profile:
            log.print("cProfile of the raw export (in this process) ...")
            report.profile = profile_export(vault_dir, exp_id, root / "profile", args.profile)
            for line in report.profile:
                log.print(line, markup=False)
    finally:
        if args.keep:
            log.print(f"files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    head = head_lines(report)
    print_rich(head, report)
    text = markdown(head, report)
    if args.markdown:
        Path(args.markdown).write_text(text)
        log.print(f"markdown report written to {args.markdown}")
    else:
        sys.stdout.write("\n" + text)
    return 0 if report.identical is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
