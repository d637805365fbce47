"""The PromQL engine in process, before/after: this checkout against another source tree.

    .venv/bin/python bench/promql_engine.py --workdir /tmp/engine-bench                 # this tree
    .venv/bin/python bench/promql_engine.py --workdir /tmp/engine-bench --before /tmp/before/src

(``/tmp/before``: another checkout, e.g. ``git worktree add /tmp/before HEAD~1``.)

A vault of the simulated cluster (``--nodes`` x 8 GPUs, ``--days`` at 15 s; GPU utilisation,
the energy counter and ``bench/promql.py``'s simulated latency histogram, labelled
``simulated="true"``), compacted and rolled up, is built once in ``--workdir`` (kept; reused
when its parameters match). Each query of the dashboard panels (``bench/promql.py``'s, over
1 d at a 1-minute step and 7 d at a 10-minute step, windows of one step unless ``--window``
says otherwise) then runs in ``--rounds`` fresh processes per source tree, alternating
(before, after, before, ...), each process evaluating it ``--runs`` times after two
unmeasured runs with ``Engine(vault)`` (no HTTP, no result cache). It prints, per query and
round, the minimum and the median CPU ms of the process's runs: a fresh process per cell,
because on a shared machine a process may land at a steadily different speed for the same
code (docs/benchmarks.md) and rounds show that. ``--batch-cells`` sets the engine's cells per
evaluation pass (``promql/tiers.py`` ``BATCH_CELLS``) in every child, checked; ``--part json``
times the query API's JSON body of each answer (``server/prometheus_json.answer_body``)
instead of its evaluation.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD = len(sys.argv) > 1 and sys.argv[1] == "--child"  # imports the tree PYTHONPATH names
for _path in (REPO_ROOT,) if CHILD else (REPO_ROOT, REPO_ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, MutableMapping
from functools import partial
from typing import Any

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
HISTOGRAM = "simulated_inference_request_duration_seconds_bucket"
QUERIES = {
    "avg": "avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}])",
    "energy": "sum by (Hostname) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[{w}]))",
    "hist": f"histogram_quantile(0.99, sum by (le) (rate({HISTOGRAM}[5m])))",
    "topk": "topk(5, avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}]))",
    "gpu": 'DCGM_FI_DEV_GPU_UTIL{{Hostname="node01",gpu="0"}}',
}
# what a child times: the evaluation, the answer's JSON body, or the whole query API request
# in process (ASGI, no socket; nocache=1: evaluated in full each time)
PARTS = ("engine", "json", "api")
PART_NAMES = {"engine": "the evaluation", "json": "the JSON body",
              "api": "the query API request (nocache=1, in process)"}  # fmt: skip
RANGES = {"1d": (DAY_MS, MINUTE_MS, "1m"), "7d": (7 * DAY_MS, 10 * MINUTE_MS, "10m")}


def build(workdir: Path, nodes: int, days: int) -> Path:
    """The vault for these parameters in ``workdir`` (built once): its directory."""
    import pyarrow.compute as pc

    from bench.promql import tables
    from metricvault.sim import ClusterSpec
    from metricvault.store.vault import Vault

    vault_dir = workdir / f"vault-{nodes}n-{days}d"
    if (vault_dir / "END").exists():
        return vault_dir
    interval_s = 15
    start = (int(time.time() * 1000) - days * DAY_MS) // (interval_s * 1000) * interval_s * 1000
    spec = ClusterSpec(nodes=nodes, gpus_per_node=8, days=days, interval_s=interval_s,
                       start_ms=start)  # fmt: skip
    end = 0
    with Vault.open_local(str(vault_dir), retention_raw="forever") as vault:
        for table in tables(spec):
            vault.write(table)
            end = max(end, int(pc.max(table["timestamp"]).as_py()))
        vault.flush()
        vault.maintain(now_ms=end + HOUR_MS)
    (vault_dir / "END").write_text(str(end))
    return vault_dir


def child(
    vault_dir: Path,
    expr: str,
    range_name: str,
    runs: int,
    batch_cells: int = 0,
    part: str = "engine",
) -> dict[str, object]:
    """In a fresh process: ``expr`` over the range, ``runs`` times after two unmeasured
    (``batch_cells``: the engine's cells per evaluation pass instead of its own); ``part``
    ``json``: the query API's JSON body of its answer (``answer_body``) instead; ``api``: a
    ``GET /api/v1/query_range`` with ``nocache=1`` through the gateway's ASGI app."""
    import metricvault
    from metricvault.promql import Engine, tiers
    from metricvault.server.prometheus_json import answer_body

    if batch_cells:
        tiers.BATCH_CELLS = batch_cells
    try:  # as a server has it: the compiled rollup-row kernel loaded (trees that have one)
        from metricvault import compiled

        compiled.start(tiers.KERNEL, wait=True)
    except (ImportError, AttributeError):
        pass
    try:  # as a server has it: freed large blocks kept (trees that have the allocator)
        from metricvault import allocator

        allocator.keep_freed_memory()
    except ImportError:
        pass
    from metricvault.store.vault import Vault

    span, step, _ = RANGES[range_name]
    end = int((vault_dir / "END").read_text()) // step * step
    start = end - span
    with Vault.open_local(str(vault_dir), retention_raw="forever") as vault:
        engine = Engine(vault)
        for _ in range(2):
            result = engine.evaluate(expr, start, end, step)
        timed: Callable[[], object] = partial(engine.evaluate, expr, start, end, step)
        if part == "json":
            timed = partial(answer_body, result, [])
            timed()
        stop: Callable[[], object] = lambda: None  # noqa: E731
        if part == "api":
            timed, stop = _api_request(vault, expr, start, end, step)
            timed()
        cpu = []
        for _ in range(runs):
            began = time.process_time()
            timed()
            cpu.append((time.process_time() - began) * 1000)
        stop()
    return {"min": min(cpu), "median": statistics.median(cpu), "module": metricvault.__file__,
            "cells": tiers.BATCH_CELLS}  # fmt: skip


def _api_request(
    vault: Any, expr: str, start: int, end: int, step: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """One ``query_range`` request (``nocache=1``) through the gateway's app, in process: the
    app started (its lifespan) on an event loop of its own, the request sent as ASGI; and
    what stops the app (its lifespan's shutdown, then the loop closed)."""
    import asyncio
    from urllib.parse import urlencode

    from metricvault.config import Settings
    from metricvault.server.app import create_app

    settings = Settings.load(env={}, gateway_maintain=False, retention_raw="forever")
    app = create_app(vault, settings)
    loop = asyncio.new_event_loop()
    started: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()

    asked: list[bool] = []
    stopping = asyncio.Event()

    async def lifespan_receive() -> dict[str, Any]:
        if not asked:
            asked.append(True)
            return {"type": "lifespan.startup"}
        await stopping.wait()  # set by stop(): the app stays up until then
        return {"type": "lifespan.shutdown"}

    lifespan = loop.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                    lifespan_receive, started.put))  # fmt: skip
    loop.run_until_complete(started.get())
    query = urlencode({"query": expr, "start": start / 1000, "end": end / 1000,
                       "step": step / 1000, "nocache": "1"}).encode()  # fmt: skip
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": "/api/v1/query_range", "raw_path": b"/api/v1/query_range",
             "query_string": query, "root_path": "", "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}  # fmt: skip

    async def request() -> None:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        await app({**scope, "state": {}}, receive, send)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"{expr}: HTTP {sent[0]['status']}: {sent[-1].get('body')!r}")

    def stop() -> None:
        stopping.set()
        loop.run_until_complete(lifespan)
        loop.close()

    return lambda: loop.run_until_complete(request()), stop


def measure(
    src: Path,
    vault_dir: Path,
    expr: str,
    range_name: str,
    runs: int,
    batch_cells: int = 0,
    part: str = "engine",
) -> dict[str, float]:
    """:func:`child` in a fresh interpreter importing metricvault from ``src`` (checked)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--child", str(vault_dir), expr, range_name, str(runs),
           str(batch_cells), part]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{expr} from {src}: {done.stderr.strip()[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(out["module"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"the child imported {out['module']}, not metricvault from {src}")
    if batch_cells and out["cells"] != batch_cells:
        raise RuntimeError(f"the child ran {out['cells']} cells a pass, not {batch_cells}")
    return {"min": float(out["min"]), "median": float(out["median"])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="the vault is kept here")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per tree")
    parser.add_argument("--runs", type=int, default=15, help="measured runs per process")
    parser.add_argument("--before", type=Path, help="another source tree (its src/)")
    parser.add_argument("--queries", default="avg,energy,hist,topk")
    parser.add_argument("--ranges", default="1d,7d")
    parser.add_argument("--window", help="the range functions' window (default: the step)")
    parser.add_argument("--batch-cells", type=int, default=0,
                        help="cells per evaluation pass (default: the engine's own)")  # fmt: skip
    parser.add_argument("--part", choices=PARTS, default="engine",
                        help="time the evaluation, its JSON body, or the request")  # fmt: skip
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    vault_dir = build(args.workdir, args.nodes, args.days)
    trees = [("before", args.before)] if args.before else []
    trees.append(("after" if args.before else "this tree", REPO_ROOT / "src"))
    print(f"{args.nodes} nodes x 8 GPUs, {args.days} d at 15 s (simulated); {args.rounds} "
          f"rounds of a fresh process per tree, {args.runs} runs each; windows "
          f"{args.window or 'of one step'}; "
          f"{args.batch_cells or 'the engine' + chr(39) + 's'} cells a pass; timing "
          f"{PART_NAMES[args.part]}; load average "
          f"{os.getloadavg()[0]:.2f}\n")  # fmt: skip
    head = ["query", "range, step", *(f"{name} min / median CPU ms" for name, _ in trees)]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for range_name in args.ranges.split(","):
        span, _, step = RANGES[range_name]
        window = args.window or step
        if span > args.days * DAY_MS:
            continue
        for name in args.queries.split(","):
            expr = QUERIES[name].format(w=window)
            cells: dict[str, list[str]] = {tree: [] for tree, _ in trees}
            for _ in range(args.rounds):
                for tree, src in trees:
                    got = measure(src, vault_dir, expr, range_name, args.runs, args.batch_cells,
                                  args.part)  # fmt: skip
                    cells[tree].append(f"{got['min']:.1f} / {got['median']:.1f}")
            row = [f"`{expr}`", f"{range_name}, {step}", *(", ".join(c) for c in cells.values())]
            print("| " + " | ".join(row) + " |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if CHILD:
        vault, expression, rng, n, cells, timed_part = sys.argv[2:8]
        print(json.dumps(child(Path(vault), expression, rng, int(n), int(cells), timed_part)))
    else:
        main()
