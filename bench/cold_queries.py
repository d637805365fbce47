"""Cold and warm Q1/Q2 (bench/queries.py) on metricvault and VictoriaMetrics, same data, same run.

Q1  mean and max of the GPU utilisation per GPU over the whole day (104 GPUs by default).
Q2  one GPU's utilisation at 1-minute resolution over the day.

*Warm*: the median of ``--warm-runs`` repeats in a process that has already answered once.
*Cold*: the first answer of a fresh process. For metricvault a new Python process imports
``metricvault`` and pandas (timed apart, as "import": VictoriaMetrics's counterpart is its
binary's start, which is not timed either), then times ``metricvault.open(path)`` plus the one
query (default pandas output); for VictoriaMetrics the server is restarted on the same data
directory, waited healthy, and its first answer to the query is timed (HTTP round trip
included, its caches empty). Both read the data files through the OS page cache (no cache is
dropped). Each cold figure is the median of ``--cold-runs`` fresh processes.

    .venv/bin/python bench/cold_queries.py --quick       # 2 nodes x 8 GPUs x 1 d, ~2 min
    .venv/bin/python bench/cold_queries.py               # 13 nodes x 8 GPUs (104 GPUs) x 1 d
    .venv/bin/python bench/cold_queries.py --quick --profile   # + where a cold query spends
    .venv/bin/python bench/cold_queries.py --quick --before-src ../before/src   # + a "before"
    .venv/bin/python bench/cold_queries.py --quick --stages    # + CPU ms per stage of each

``--before-src`` (another checkout's ``src``, e.g. a ``git worktree`` of an older commit):
its cold open + query on the same vault too, each fresh process alternating with this
checkout's, so the before/after ratio comes from one run under one load. Both read the vault
this checkout wrote: a change to what the writer stores (the series files' footers) shows in
both columns.

``--rollup-group-rows ROWS``: a second vault of the same samples whose rollup files have
ROWS-row row groups (the writer's layout choice, set for its build only); its rollup bytes,
warm runs and cold runs (the "after", alternating with the first vault's "before"; this
checkout reads both) beside the first vault's. The main table's cold column is the second
vault's then.

    .venv/bin/python bench/cold_queries.py --quick --cold-runs 9 --rollup-group-rows 16384

The machine's load average is printed beside the table: compare the ratios, not the times.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from bench.datasets import Summary, simulated
from bench.peers import VM_INSTALL_HINT, VictoriaMetrics, find_victoria_metrics
from bench.queries import QueryCase, Timing, query_cases, time_runs

HOUR_MS = 3_600_000

# What a fresh process runs: imports timed apart, then open + the one query. The query's
# arguments come as JSON (argv[2]); it prints one JSON line of milliseconds.
COLD_SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
import metricvault, metricvault.open, metricvault.public  # the package imports these lazily
imported = time.perf_counter()
import pandas
with_pandas = time.perf_counter()
args = json.loads(sys.argv[2])
cpu = time.process_time()
vault = metricvault.open(sys.argv[1], need="read")
opened = time.perf_counter()
rows = len(vault.query(*args["args"], **args["kwargs"]))
answered = time.perf_counter()
cpu = time.process_time() - cpu
print(json.dumps({
    "cpu_ms": cpu * 1000,
    "import_ms": (imported - started) * 1000,
    "pandas_ms": (with_pandas - imported) * 1000,
    "open_ms": (opened - with_pandas) * 1000,
    "query_ms": (answered - opened) * 1000,
    "rows": rows,
}))
"""

# The same, under cProfile: the top entries of a cold open + query (--profile).
PROFILE_SCRIPT = r"""
import cProfile, json, pstats, sys
import metricvault, metricvault.open, metricvault.public, pandas
args = json.loads(sys.argv[2])
profile = cProfile.Profile()
profile.enable()
vault = metricvault.open(sys.argv[1], need="read")
vault.query(*args["args"], **args["kwargs"])
profile.disable()
pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
"""


# The same cold open + query, with the CPU time (time.process_time, all threads) spent in
# each of these functions summed (--stages): where a fresh process's first answer goes, in
# this checkout and in --before-src's alike (a function a tree lacks is left out). Nested
# entries are included in their callers'; the wrappers add a little to every figure.
STAGES_SCRIPT = r"""
import functools, importlib, json, sys, time
import metricvault, metricvault.open, metricvault.public
import pandas
STAGES = [
    ("metricvault.config", "Settings.load", "open: settings"),
    ("metricvault.store.vault", "IngestBuffer.__init__", "open: ingest buffer (SQLite)"),
    ("metricvault.store.catalog", "Catalog.current", "catalog reads"),
    ("metricvault.store.reading", "parse_selectors", "query: parse the selector"),
    ("metricvault.store.vault", "Vault._read_series_file", "query: read the series shard"),
    ("metricvault.store.series_index", "SeriesIndex.load_table", "query: register its series"),
    ("metricvault.store.reader", "Reader._footer", "query: data file footers"),
    ("pyarrow.parquet", "ParquetFile.read_row_group", "query: data row-group reads"),
    ("metricvault.store.files", "decode", "query: decode the rows read"),
    ("metricvault.store.query", "aggregate", "query: partials (reads, decode, merge)"),
    ("metricvault.store.query", "shape", "query: long shape + output"),
    ("metricvault.store.query", "convert", "query: ... of it, the pandas conversion"),
]
spent = {}
def wrap(module, path, label):
    try:
        owner = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        inner = getattr(owner, name)
    except (ImportError, AttributeError):
        return
    depth = [0]
    @functools.wraps(inner)
    def timed(*args, **kwargs):
        depth[0] += 1
        started = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:  # a recursive call counts once
                spent[label] = spent.get(label, 0.0) + (time.process_time() - started) * 1000
    setattr(owner, name, timed)
for stage in STAGES:
    wrap(*stage)
args = json.loads(sys.argv[2])
cpu = time.process_time()
vault = metricvault.open(sys.argv[1], need="read")
spent["open (total)"] = (time.process_time() - cpu) * 1000
vault.query(*args["args"], **args["kwargs"])
spent["open + query (total)"] = (time.process_time() - cpu) * 1000
print(json.dumps({"order": ["open (total)", *[s[2] for s in STAGES], "open + query (total)"],
                  "spent": spent}))
"""


@dataclass(frozen=True)
class Cold:
    import_ms: float  # import metricvault and its store (numpy, pyarrow with them)
    pandas_ms: float
    open_ms: float
    query_ms: float
    rows: int
    cpu_ms: float = float("nan")  # CPU time of open + query, all threads (less load-bound)

    @property
    def first_ms(self) -> float:
        """What the target compares: open + the first query."""
        return self.open_ms + self.query_ms


def vault_call(case: QueryCase, summary: Summary) -> dict[str, object]:
    """The arguments of the case's ``vault.query`` call (bench/queries.py's Q1/Q2)."""
    if case.key == "Q1":
        metric, start, end = summary.workload.util_metric, summary.min_ts, summary.max_ts + 1
        return {"args": [metric, start, end], "kwargs": {"step": "all", "aggs": ["mean", "max"]}}
    if case.key == "Q2":
        start = summary.min_ts - summary.min_ts % 60_000
        return {
            "args": [summary.probe_selector(), start, summary.max_ts + 1],
            "kwargs": {"step": "1m", "aggs": ["mean"]},
        }
    raise ValueError(f"no cold call for {case.key}")


def _child(script: str, path: Path, call: dict[str, object], src: Path | None = None) -> str:
    """Run ``script`` in a fresh Python process importing metricvault from ``src`` (this
    checkout's by default); its stdout (its stderr if it fails)."""
    env = {**os.environ, "PYTHONPATH": str(src or REPO_ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(call)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode:
        raise RuntimeError(f"the cold query process failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _cold_once(path: Path, call: dict[str, object], src: Path | None = None) -> Cold:
    return Cold(**json.loads(_child(COLD_SCRIPT, path, call, src).strip().splitlines()[-1]))


def cold_vault(path: Path, call: dict[str, object], runs: int) -> list[Cold]:
    return [_cold_once(path, call) for _ in range(runs)]


def cold_before_after(
    path: Path, call: dict[str, object], runs: int, before: Path, before_path: Path | None = None
) -> tuple[list[Cold], list[Cold]]:
    """This checkout's cold runs on ``path`` and ``before``'s src's on ``before_path`` (the
    same vault by default), alternating (the load changes slowly)."""
    after_runs, before_runs = [], []
    for _ in range(runs):
        after_runs.append(_cold_once(path, call))
        before_runs.append(_cold_once(before_path or path, call, before))
    return after_runs, before_runs


def profile_vault(path: Path, call: dict[str, object]) -> str:
    return _child(PROFILE_SCRIPT, path, call)


# Per stage label, the CPU ms of each fresh process: the labels in order, this checkout's,
# --before-src's (empty without it)
Stages = tuple[list[str], dict[str, list[float]], dict[str, list[float]]]


def stages(path: Path, call: dict[str, object], runs: int, before: Path | None) -> Stages:
    """The CPU ms per stage of ``runs`` fresh processes, alternating with ``before``'s."""
    order: list[str] = []
    spent: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    for _ in range(runs):
        for src, into in ((None, spent[0]), (before, spent[1])):
            if into is spent[1] and before is None:
                continue
            found = json.loads(_child(STAGES_SCRIPT, path, call, src).strip().splitlines()[-1])
            order = order or found["order"]
            for label, ms in found["spent"].items():
                into.setdefault(label, []).append(ms)
    return order, spent[0], spent[1]


def report_stages(key: str, found: Stages) -> None:
    order, after_runs, before_runs = found
    print(f"\n{key}, CPU ms per stage (medians of fresh processes; a stage includes those")
    print("it calls, e.g. the partials hold the reads and decoding):\n")
    print("| stage | before | after |" if before_runs else "| stage | CPU ms |")
    print("|---|---|---|" if before_runs else "|---|---|")
    for label in order:
        now = _ms(_median(after_runs[label])) if label in after_runs else "-"
        if before_runs:
            was = _ms(_median(before_runs[label])) if label in before_runs else "-"
            print(f"| {label} | {was} | {now} |")
        else:
            print(f"| {label} | {now} |")


def cold_vm(vm: VictoriaMetrics, case: QueryCase, runs: int) -> list[float]:
    """The first answer of a freshly started VictoriaMetrics on the same data, ``runs`` times."""
    found = []
    for _ in range(runs):
        vm.stop()
        vm.start()
        started = time.perf_counter()
        case.run_vm(vm)
        found.append((time.perf_counter() - started) * 1000)
    return found


@contextmanager
def rollup_group_rows(rows: int | None) -> Iterator[None]:
    """Within it, the writer puts ``rows`` rows in each rollup file's row groups (None: its
    own size): what ``--rollup-group-rows``'s second vault is written with."""
    from metricvault.store import files

    kept = files.ROW_GROUP_ROWS[True]
    files.ROW_GROUP_ROWS[True] = rows or kept
    try:
        yield
    finally:
        files.ROW_GROUP_ROWS[True] = kept


def build(
    summary: Summary, vault_path: Path, vm: VictoriaMetrics | None, group_rows: int | None = None
) -> int:
    """Write the workload into the vault (then maintain it) and into VictoriaMetrics; the
    vault's rollup row groups of ``group_rows`` rows (None: the writer's own size)."""
    import metricvault

    samples = 0
    with rollup_group_rows(group_rows), metricvault.Vault.open_local(str(vault_path)) as vault:
        for chunk in summary.workload.chunks():
            summary.observe(chunk)
            samples += int(vault.write(chunk))
            if vm is not None:
                vm.ingest(chunk)
        if vm is not None:  # now: its keep-alive connection would time out during maintain
            vm.force_flush()
            vm.force_merge_and_wait()
        vault.maintain(now_ms=summary.max_ts + HOUR_MS)
    return samples


def report_files(*vaults: Path) -> None:
    """Each vault's rollup files (its catalog's): rows, row groups and bytes per row, per tier."""
    import pyarrow.parquet as pq

    import metricvault

    print("\n| vault | tier | rows | row groups | B/row |\n|---|---|---|---|---|")
    for path in vaults:
        with metricvault.Vault.open_local(str(path)) as vault:
            snap = vault.snapshot()
            for tier in ("1m", "1h"):
                files = snap.tier_files(tier)
                rows, size = sum(f.rows for f in files), sum(f.bytes for f in files)
                groups = sum(pq.ParquetFile(f.path).metadata.num_row_groups for f in files)
                print(f"| {path.name} | {tier} | {rows:,} | {groups} | {size / max(rows, 1):.3f} |")


def warm_groups(first: Path, second: Path, cases: list[QueryCase], runs: int) -> None:
    """The warm medians on both vaults, each opened once, the runs of one beside the other's."""
    import metricvault

    print("\nwarm, median ms (first vault / second vault):\n")
    print("| query | first vault | second vault |\n|---|---|---|")
    with (
        metricvault.open(str(first), need="read") as one,
        metricvault.open(str(second), need="read") as two,
    ):
        for case in cases:
            found: tuple[list[float], list[float]] = ([], [])
            for _ in range(runs):
                for vault, into in ((one, found[0]), (two, found[1])):
                    into.append(time_runs(partial(case.run_vault, vault), 1).median_ms)
            print(f"| {case.key} | {_median(found[0]):.2f} | {_median(found[1]):.2f} |")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratio(mine: float, peer: float | None) -> str:
    return "-" if peer is None or peer <= 0 else f"{mine / peer:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(
    summary: Summary,
    samples: int,
    warm: dict[str, tuple[Timing, Timing | None]],
    cold: dict[str, tuple[list[Cold], list[float]]],
    args: argparse.Namespace,
    before: dict[str, list[Cold]] | None = None,
) -> None:
    load = os.getloadavg()
    print(
        f"\n{summary.workload.title}: {samples:,} samples, {len(summary.gpus)} GPUs; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores; "
        f"cold: median of {args.cold_runs} fresh processes, warm: median of {args.warm_runs}"
    )
    print(
        "\n| query | metricvault warm ms | VictoriaMetrics warm ms | ratio | metricvault cold "
        "(open + query) ms | VictoriaMetrics cold ms | ratio | rows |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, (mine, peer) in warm.items():
        colds, vm_colds = cold[key]
        first = _median([c.first_ms for c in colds])
        vm_first = _median(vm_colds) if vm_colds else None
        peer_ms = peer.median_ms if peer else None
        print(
            f"| {key} | {mine.median_ms:.1f} | {_ms(peer_ms)} | {_ratio(mine.median_ms, peer_ms)} "
            f"| {first:.1f} | {_ms(vm_first)} | {_ratio(first, vm_first)} | {mine.rows} |"
        )
    print("\nmetricvault cold, per stage (medians, ms):\n")
    print("| query | import metricvault | import pandas | open | first query | rows |")
    print("|---|---|---|---|---|---|")
    for key, (colds, _) in cold.items():
        print(
            f"| {key} | {_median([c.import_ms for c in colds]):.1f} "
            f"| {_median([c.pandas_ms for c in colds]):.1f} "
            f"| {_median([c.open_ms for c in colds]):.1f} "
            f"| {_median([c.query_ms for c in colds]):.1f} | {colds[0].rows} |"
        )
    if before:
        from metricvault.store import files

        was_label = (
            f"rollup row groups of {files.ROW_GROUP_ROWS[True]:,} rows; "
            f"after: of {args.rollup_group_rows:,}"
            if args.rollup_group_rows
            else args.before_src
        )
        print(f"\nbefore ({was_label}) and after, cold open + query, alternating:\n")
        print("| query | before ms | after ms | after / before | before CPU ms | after CPU ms "
              "| VictoriaMetrics cold ms | before / VM | after / VM |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for key, old in before.items():
            colds, vm_colds = cold[key]
            was, now = _median([c.first_ms for c in old]), _median([c.first_ms for c in colds])
            vm_first = _median(vm_colds) if vm_colds else None
            cpu_was, cpu_now = _median([c.cpu_ms for c in old]), _median([c.cpu_ms for c in colds])
            print(
                f"| {key} | {was:.1f} | {now:.1f} | {_ratio(now, was)} | {cpu_was:.1f} "
                f"| {cpu_now:.1f} | {_ms(vm_first)} "
                f"| {_ratio(was, vm_first)} | {_ratio(now, vm_first)} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=13, help="8 GPUs each (13: 104 GPUs)")
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="2 nodes (16 GPUs) x 1 day")
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--warm-runs", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="print a cold query's profile")
    parser.add_argument(
        "--stages", action="store_true", help="CPU ms per stage of a cold open + query"
    )
    parser.add_argument(
        "--before-src", type=Path, help="another checkout's src: its cold runs too (alternating)"
    )
    parser.add_argument(
        "--rollup-group-rows",
        type=int,
        metavar="ROWS",
        help="also write a second vault with ROWS-row rollup row groups; its cold runs are the "
        "'after', alternating with the first vault's (this checkout's src reads both)",
    )
    args = parser.parse_args()
    if args.before_src and args.rollup_group_rows:
        parser.error("--before-src and --rollup-group-rows compare different things: one of them")
    nodes = 2 if args.quick else args.nodes
    summary = Summary(simulated(nodes, args.days))
    binary = find_victoria_metrics()
    if binary is None:
        print(VM_INSTALL_HINT, file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="cold-queries-") as tmp:
        work = Path(tmp)
        vault_path = work / "metricvault"
        vm = VictoriaMetrics(binary, work) if binary else None
        try:
            if vm is not None:
                vm.start()
            samples = build(summary, vault_path, vm)
            groups_path = work / "metricvault-groups"
            if args.rollup_group_rows:
                build(
                    Summary(simulated(nodes, args.days)), groups_path, None, args.rollup_group_rows
                )
                report_files(vault_path, groups_path)
            if vm is not None:  # a fresh connection: maintain outlasted its keep-alive
                vm.stop()
                vm.start()
            cases = [c for c in query_cases(summary) if c.key in ("Q1", "Q2")]
            warm: dict[str, tuple[Timing, Timing | None]] = {}
            cold: dict[str, tuple[list[Cold], list[float]]] = {}
            before: dict[str, list[Cold]] = {}
            found: dict[str, Stages] = {}
            import metricvault

            with metricvault.open(str(vault_path), need="read") as vault:
                for case in cases:
                    mine = time_runs(partial(case.run_vault, vault), args.warm_runs)
                    peer = time_runs(partial(case.run_vm, vm), args.warm_runs) if vm else None
                    warm[case.key] = (mine, peer)
            if args.rollup_group_rows:
                warm_groups(vault_path, groups_path, cases, args.warm_runs)
            for case in cases:
                call = vault_call(case, summary)
                if args.before_src:
                    colds, before[case.key] = cold_before_after(
                        vault_path, call, args.cold_runs, args.before_src.resolve()
                    )
                elif args.rollup_group_rows:  # after: the second vault; before: the first
                    colds, before[case.key] = cold_before_after(
                        groups_path, call, args.cold_runs, REPO_ROOT / "src", vault_path
                    )
                else:
                    colds = cold_vault(vault_path, call, args.cold_runs)
                vm_colds = cold_vm(vm, case, args.cold_runs) if vm else []
                cold[case.key] = (colds, vm_colds)
                if args.profile:
                    print(f"\n--- cold {case.key} profile ---\n{profile_vault(vault_path, call)}")
                if args.stages:
                    before_src = args.before_src.resolve() if args.before_src else None
                    found[case.key] = stages(vault_path, call, args.cold_runs, before_src)
        finally:
            if vm is not None:
                vm.stop()
        report(summary, samples, warm, cold, args, before)
        for key, per_stage in found.items():
            report_stages(key, per_stage)


if __name__ == "__main__":
    main()
