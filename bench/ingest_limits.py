"""Ingest limits benchmark (issue 10): what hostile requests cost one gateway worker.

Each case is one request sent to the gateway app in-process (Starlette's TestClient over a real
vault in a temp dir: decoding, validation and the durable write, as a worker does them), in a
fresh subprocess so its peak memory is its own. Every case runs twice: with the limits off
(every limit raised out of the way) and with the default settings. It prints, per case, the
answer, the CPU seconds (process time, all threads) and the growth of peak RSS, and the cost
relative to a normal 2,000-sample remote_write request, the baseline.

Cases (remote_write bodies come from the project's own encoder, ``collect/push.py``):

- ``normal``: 200 GPU series x 10 samples, dcgm-exporter labels (what Prometheus sends);
- ``rw_100k_series``: 100,000 new series, one sample each;
- ``rw_1000x33_names``: 1,000 series with 33 label names each of their own (33,000 names);
- ``lp_32mb``: 32 MB of ordinary line protocol (8,000 series);
- ``lp_6000_keys``: 3,000 lines, each with two tag keys of its own (6,000 names; the 32 MB
  body of this shape cannot be decoded without the limit at all: the table would need
  10^12 cells).

Then a scaling check: ``rw_Nx33_names`` at 250 and 1,000 series with the limits off; linear
cost gives a CPU ratio near 4, series x label names near 16 (PASS below 8).

Run from the repository root::

    .venv/bin/python bench/ingest_limits.py            # ~1 min
    .venv/bin/python bench/ingest_limits.py --markdown results.md
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
import json
import os
import platform
import resource
import subprocess
import tempfile
import time
from typing import Any

T0 = 1_767_225_600_000
RW_HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
CASES = ("normal", "rw_100k_series", "rw_1000x33_names", "lp_32mb", "lp_6000_keys")
LIMITS_OFF = {
    "max_series_per_request": 10**9,
    "max_new_series_per_minute": 10**9,
    "max_label_names_per_request": 10**9,
    "decode_time_budget": "1d",
    "max_body_bytes": 64 * 1024**2,
}
LOAD_AT_START = os.getloadavg()[0]
LINEAR_RATIO_MAX = 8.0  # 4x the request: ~4x the cost if linear, ~16x if series x names


def remote_write_case(case: str) -> bytes:
    from metricvault.wire.remote_write import encode_write_request

    if case == "normal":
        samples = [
            (
                "DCGM_FI_DEV_GPU_UTIL",
                {
                    "Hostname": f"node{n:02d}",
                    "gpu": str(g),
                    "UUID": f"GPU-{n}-{g}",
                    "job": "dcgm",
                    "instance": f"node{n:02d}:9400",
                },
                T0 + i * 5000,
                50.0,
            )
            for n in range(25)
            for g in range(8)
            for i in range(10)
        ]
    elif case == "rw_100k_series":
        samples = [("gpu_util", {"gpu": str(i)}, T0, 1.0) for i in range(100_000)]
    else:  # rw_<N>x33_names
        series = int(case.split("_")[1].split("x")[0])
        samples = [
            ("gpu_util", {f"l{i}_{j}": "x" for j in range(33)}, T0, 1.0) for i in range(series)
        ]
    return encode_write_request(samples)


def line_protocol_case(case: str) -> bytes:
    if case == "lp_6000_keys":
        lines = [f"gpu,a{i}=x,b{i}=y util=1 {T0}" for i in range(3000)]
        return "\n".join(lines).encode()
    lines, size, i = [], 0, 0
    while size < 32 * 1024**2 - 100:
        line = f"gpu,host=node{i % 100},gpu={i % 8000} util={i} {T0 + i}\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines).encode()


def run_case(case: str, limits: str) -> dict[str, Any]:
    """Runs in the child: one request, its answer, CPU and peak-RSS growth."""
    from starlette.testclient import TestClient

    from metricvault import Vault
    from metricvault.config import Settings, setting_names
    from metricvault.server.app import create_app
    from metricvault.wire.remote_write import encode_write_request

    is_lp = case.startswith("lp_")
    body = line_protocol_case(case) if is_lp else remote_write_case(case)
    known = set(setting_names())  # --before runs an older checkout, without the new settings
    overrides = {k: v for k, v in LIMITS_OFF.items() if k in known} if limits == "off" else {}
    warm_up = encode_write_request([("warm_up", {"gpu": str(g)}, T0, 1.0) for g in range(8)])
    with tempfile.TemporaryDirectory() as workdir:
        settings = Settings.load(env={}, gateway_maintain=False, **overrides)
        vault = Vault.open(str(Path(workdir) / "vault"), settings)
        with TestClient(create_app(vault, settings)) as client:
            client.post("/api/v1/write", content=warm_up, headers=RW_HEADERS)  # imports, caches
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            cpu = time.process_time()
            if is_lp:
                response = client.post("/write", content=body, params={"precision": "ms"})
            else:
                response = client.post("/api/v1/write", content=body, headers=RW_HEADERS)
            cpu = time.process_time() - cpu
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
        vault.flush()  # the flusher may have moved some samples out of the buffer already
        stored = int(vault.stats()["tiers"]["raw"]["rows"]) - 8
        vault.close()
    return {
        "case": case,
        "limits": limits,
        "body_bytes": len(body),
        "status": response.status_code,
        "message": response.text.strip()[:110],
        "cpu_s": cpu,
        "rss_mb": rss / 1024,
        "stored": stored,
    }


def in_child(case: str, limits: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", case, limits]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {
            "case": case,
            "limits": limits,
            "status": f"died rc={done.returncode}",
            "message": done.stderr.strip()[-110:],
            "cpu_s": float("nan"),
            "rss_mb": float("nan"),
            "stored": 0,
            "body_bytes": 0,
        }
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def render(rows: list[dict[str, Any]], scaling: tuple[float, float]) -> str:
    baseline = next(r["cpu_s"] for r in rows if r["case"] == "normal" and r["limits"] == "on")
    header = ("case", "body", "limits", "answer", "CPU s", "x normal", "peak RSS +MB", "stored")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"- command: `.venv/bin/python bench/ingest_limits.py`; run at {when} on "
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, load "
        f"average at start {LOAD_AT_START:.1f}",
        "- CPU s: process time of the request (all threads, the gateway's flusher included); "
        "peak RSS +MB: growth of the process's peak RSS during it; stored: samples in the vault",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        cells = (
            r["case"],
            f"{r['body_bytes']:,} B",
            r["limits"],
            str(r["status"]),
            f"{r['cpu_s']:.3f}",
            f"{r['cpu_s'] / baseline:,.0f}",
            f"{r['rss_mb']:.0f}",
            f"{r['stored']:,}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    small, large = scaling
    ratio = large / small if small else float("nan")
    verdict = "PASS" if ratio < LINEAR_RATIO_MAX else "MISS"
    lines += [
        "",
        f"Scaling, limits off: 250 x 33 names {small:.3f} s CPU, 1,000 x 33 names {large:.3f} s:"
        f" ratio {ratio:.1f} for a 4x request ({verdict}: linear < {LINEAR_RATIO_MAX:g},"
        " series x names ~16).",
        "",
        "Answers with the limits on:",
        *(
            f"- {r['case']}: {r['status']} {r['message']}"
            for r in rows
            if r["limits"] == "on" and r["status"] != 204
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="FILE", help="also write the table here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_case(*args.child)))
        return 0
    rows = []
    for case in CASES:
        for limits in ("off", "on"):
            print(f"{case}, limits {limits} ...", file=sys.stderr, flush=True)
            rows.append(in_child(case, limits))
    small = in_child("rw_250x33_names", "off")["cpu_s"]
    large = next(
        r["cpu_s"] for r in rows if r["case"] == "rw_1000x33_names" and r["limits"] == "off"
    )
    report = render(rows, (small, large))
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
