"""Every panel of the shipped Grafana dashboards, replayed as Grafana sends them, over a vault.

    .venv/bin/python bench/dashboards.py --nodes 2 --days 14 --interval 15   # ~3 min to build
    .venv/bin/python bench/dashboards.py --vault DIR --range 14d --profile 3  # top 3, profiled

Builds a vault of the simulated cluster (``metricvault.sim``, data ending now; ``--vault DIR``
reuses one), starts the gateway app in this process (Starlette's test client: the HTTP API's
own parsing, engine and JSON, no sockets), and sends each panel's query of
``deploy/grafana/dashboards/*.json`` exactly as Grafana 11's Prometheus data source would for
the ``--range`` ending now (tests/e2e/grafana_requests.py: POST form bodies, Grafana's step,
``$__interval``/``$__rate_interval``, every host selected). Prints, slowest first, the median
wall time of ``--runs`` warm runs per panel query and the series and points answered;
``--profile N`` then prints cProfile's top functions for the N slowest.

``--selector-rows`` instead evaluates every panel query with the PromQL engine itself
(no result cache), twice in the same run: plain selectors on whole-minute steps answered
from the 1m/1h rows where exact (``EngineOptions.selector_rows``, docs/decisions/0004)
and, as the peer, from raw samples; it checks both answers are identical and prints the
queries the rows served, with the load average.

    .venv/bin/python bench/dashboards.py --nodes 1 --days 14 --interval 30 --selector-rows
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.e2e import grafana_requests as gr


def build(path: str, nodes: int, days: float, interval_s: int, retention_raw: str) -> int:
    from metricvault.sim import ClusterSpec, generate
    from metricvault.store.vault import Vault

    spec = ClusterSpec.ending_at(
        int(time.time() * 1000), days, nodes=nodes, gpus_per_node=8, interval_s=interval_s
    )
    total = 0
    with Vault.open_local(path, retention_raw=retention_raw) as vault:
        for chunk in generate(spec):
            total += vault.write(chunk)
        vault.maintain()
    return total


def main() -> None:
    from starlette.testclient import TestClient

    from metricvault.config import Settings
    from metricvault.durations import parse_duration_ms
    from metricvault.promql import Engine, EngineOptions
    from metricvault.server.app import create_app
    from metricvault.store.vault import Vault

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--interval", type=int, default=15, help="scrape interval (s)")
    parser.add_argument("--vault", help="the vault to read (built there when missing)")
    parser.add_argument("--range", default="14d", help="the dashboards' time range")
    parser.add_argument("--retention-raw", default="30d", help="raw retention of the vault")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument(
        "--selector-rows", action="store_true", help="plain selectors: rows vs raw, engine only"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare every range query's answer with one reading every raw sample",
    )
    parser.add_argument(
        "--result-cache",
        action="store_true",
        help="let repeated queries hit the query_range result cache (default: nocache=1)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.vault or str(Path(tmp) / "vault")
        if not Path(path).exists():
            t = time.perf_counter()
            n = build(path, args.nodes, args.days, args.interval, args.retention_raw)
            print(f"built {n:,} samples ({args.nodes} nodes x 8 GPUs x {args.days:g} d at "
                  f"{args.interval} s) in {time.perf_counter() - t:.0f} s")  # fmt: skip
        settings = Settings.load(
            env={}, gateway_maintain=False, query_timeout="10m", retention_raw=args.retention_raw
        )
        vault = Vault.open_local(path, settings)
        end_ms = int(time.time() * 1000)
        start_ms = end_ms - parse_duration_ms(args.range)
        source = gr.load_datasource({"METRICVAULT_URL": "http://x", "METRICVAULT_TOKEN": ""})
        with TestClient(create_app(vault, settings)) as client:
            queries = []
            for name, board in gr.dashboards().items():
                variables: dict[str, tuple[list[str], bool]] = {}
                for var in board.get("templating", {}).get("list", []):
                    request, _ = gr.label_values_request(
                        var["query"]["query"], start_ms / 1000, end_ms / 1000, {}, variables
                    )
                    values = _send(client, request)["data"]
                    multi = bool(var.get("multi") or var.get("includeAll"))
                    every = bool(var.get("includeAll"))  # as tests/e2e/test_grafana.py does
                    variables[var["name"]] = (values if every else values[:1], multi)
                queries += gr.panel_requests(board, name, start_ms, end_ms, variables, source, {})
            if not args.result_cache:  # each run evaluates (a refresh would hit the cache)
                queries = [_uncached(q) for q in queries]
            if args.check:
                _check(vault, settings, queries)
            if args.selector_rows:
                _selector_rows(vault, settings, queries, args.runs)
                queries = []
            rows = []
            for q in queries:
                _send(client, q.request)  # warm
                took = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    body = _send(client, q.request)
                    took.append(time.perf_counter() - t)
                result = body.get("data", {}).get("result", [])
                points = sum(len(s.get("values", [1])) for s in result)
                rows.append((statistics.median(took), q, len(result), points, body["status"]))
            rows.sort(key=lambda r: -r[0])
            total = sum(r[0] for r in rows)
            print(f"{len(rows)} panel queries over {args.range}, {args.runs} warm runs each; "
                  f"sum of medians {total:.2f} s")  # fmt: skip
            print(f"{'seconds':>8} {'series':>6} {'points':>7}  dashboard: panel [ref]")
            for took_s, q, series, points, status in rows:
                mark = "" if status == "success" else f"  ({status})"
                print(f"{took_s:8.3f} {series:6} {points:7}  {q.dashboard}: {q.panel} "
                      f"[{q.ref}]{mark}")  # fmt: skip
            engine = Engine(vault, EngineOptions.from_settings(settings))
            for _, q, *_ in rows[: args.profile]:
                # the engine in this thread (the app evaluates in a worker thread)
                params = dict(q.request.params)
                profile = cProfile.Profile()
                profile.enable()
                if "step" in params:
                    start, end = (int(float(params[k]) * 1000) for k in ("start", "end"))
                    engine.evaluate(params["query"], start, end, int(float(params["step"]) * 1000))
                else:
                    _send(client, q.request)
                profile.disable()
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
                print(f"\n--- {q.dashboard}: {q.panel}: {q.expr}\n{out.getvalue()[-3500:]}")
        vault.close()


def _selector_rows(vault: Any, settings: Any, queries: list[Any], runs: int) -> None:
    """Each range query evaluated with selector rows on and off (the raw peer) in this run."""
    import os

    import numpy as np

    from metricvault.promql import Engine, EngineOptions

    on = Engine(vault, EngineOptions.from_settings(settings))
    off = Engine(vault, EngineOptions.from_settings(settings, selector_rows=False))
    found = []
    for q in queries:
        params = dict(q.request.params)
        if "step" not in params:
            continue
        expr = params["query"]
        start, end = (int(float(params[k]) * 1000) for k in ("start", "end"))
        step = int(float(params["step"]) * 1000)
        took = {}
        for name, engine in (("rows", on), ("raw", off)):
            engine.evaluate(expr, start, end, step)  # warm: decoded row groups cached
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                result = engine.evaluate(expr, start, end, step)
                times.append(time.perf_counter() - t)
            took[name] = (statistics.median(times), result)
        got, want = took["rows"][1], took["raw"][1]
        same = [s[0] for s in got.series] == [s[0] for s in want.series] and all(
            a[1].tolist() == b[1].tolist() and np.array_equal(a[2], b[2], equal_nan=True)
            for a, b in zip(got.series, want.series, strict=True)
        )
        served = ",".join(sorted(got.served_by - want.served_by)) or "-"
        found.append((took["raw"][0], took["rows"][0], served, same, q, step))
    found.sort(key=lambda r: -r[0])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    served = [r for r in found if r[2] != "-"]
    print(f"load average {load}; {len(found)} range queries, {runs} warm runs each")
    print(f"rows served {len(served)}: raw {sum(r[0] for r in served):.3f} s, rows "
          f"{sum(r[1] for r in served):.3f} s in all; every answer identical: "
          f"{all(r[3] for r in found)}")  # fmt: skip
    head = f"{'raw s':>7} {'rows s':>7} {'ratio':>6} {'tier':>4} {'step':>5}"
    print(f"{head}  dashboard: panel [ref]")
    for raw_s, rows_s, tier, same, q, step in served:
        mark = "" if same else "  (ANSWERS DIFFER)"
        print(f"{raw_s:7.3f} {rows_s:7.3f} {raw_s / max(rows_s, 1e-9):6.1f} {tier:>4} "
              f"{step // 1000:5} {q.dashboard}: {q.panel} [{q.ref}]{mark}")  # fmt: skip


class _EverySample:
    """The vault as a source whose selections read every raw sample in their range (the
    store's hints dropped: no newest-sample-per-step picking), rollup rows as before."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def select(self, matchers: Any, lo: int, hi: int, hints: Any = None) -> Any:
        return self.inner.select(matchers, lo, hi)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _check(vault: Any, settings: Any, queries: list[Any]) -> None:
    """Each range query's answer, as served, against the one every raw sample gives."""
    import numpy as np

    from metricvault.promql import Engine, EngineOptions

    options = EngineOptions.from_settings(settings)
    served, every = Engine(vault, options), Engine(_EverySample(vault), options)
    differ = []
    checked = 0
    for q in queries:
        params = dict(q.request.params)
        if "step" not in params:
            continue
        start, end = (int(float(params[k]) * 1000) for k in ("start", "end"))
        step = int(float(params["step"]) * 1000)
        got = served.evaluate(params["query"], start, end, step)
        want = every.evaluate(params["query"], start, end, step)
        same = [s[0] for s in got.series] == [s[0] for s in want.series] and all(
            a[1].tolist() == b[1].tolist()
            and a[2].view(np.int64).tolist() == b[2].view(np.int64).tolist()
            for a, b in zip(got.series, want.series, strict=True)
        )
        checked += 1
        if not same:
            differ.append(f"{q.dashboard}: {q.panel} [{q.ref}]")
    print(f"checked {checked} range queries against every raw sample: "
          f"{'all identical' if not differ else 'DIFFER: ' + '; '.join(differ)}")  # fmt: skip


def _uncached(q: Any) -> Any:
    """``q`` with ``nocache=1`` (VictoriaMetrics's switch): evaluated, not the cached answer."""
    request = dataclasses.replace(q.request, params=[*q.request.params, ("nocache", "1")])
    return dataclasses.replace(q, request=request)


def _send(client: Any, request: gr.Request) -> Any:
    path, body, headers = request.encoded()
    return client.request(request.method, path, content=body, headers=headers).json()


if __name__ == "__main__":
    main()
