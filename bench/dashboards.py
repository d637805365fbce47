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
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import argparse
import cProfile
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
            for _, q, *_ in rows[: args.profile]:
                profile = cProfile.Profile()
                profile.enable()
                _send(client, q.request)
                profile.disable()
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(12)
                print(f"\n--- {q.dashboard}: {q.panel}: {q.expr}\n{out.getvalue()[-3500:]}")
        vault.close()


def _send(client: Any, request: gr.Request) -> Any:
    path, body, headers = request.encoded()
    return client.request(request.method, path, content=body, headers=headers).json()


if __name__ == "__main__":
    main()
