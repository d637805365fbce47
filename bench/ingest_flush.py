"""The gateway's CPU per sample without HTTP: decode + durable store, then the flush.

Builds ``bench/ingest.py``'s remote_write payloads, decodes and stores them in one process into
a fresh vault (each request fsynced to the ingest buffer, as the gateway's 204 needs), then
flushes the buffer into Parquet files; prints the process CPU time of each part. CPU time, not
wall time: it holds on a shared machine where the gateway's samples/s does not. Run it in two
checkouts (``git worktree add /tmp/before REV``) alternately to compare.

    .venv/bin/python bench/ingest_flush.py                   # ~1 min
    .venv/bin/python bench/ingest_flush.py --profile 15      # and the flush's top functions
    .venv/bin/python bench/ingest_flush.py --decoder numpy   # numpy's known-series decoder
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):  # run as a script from a checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="payloads (default 600)")
    parser.add_argument("--warmup", type=int, default=50, help="requests before timing (50)")
    parser.add_argument("--profile", type=int, default=0, help="print the flush's top N")
    parser.add_argument(
        "--decoder",
        choices=("compiled", "numpy"),
        default="compiled",
        help="remote_write's known-series decoder: numba's, as a gateway has it (default), "
        "or numpy's (what a worker uses until numba has loaded)",
    )
    args = parser.parse_args(argv)

    from bench import ingest as bench
    from metricvault.ingest.protocols import remote_write_known
    from metricvault.ingest.protocols.remote_write import decode_remote_write
    from metricvault.store.vault import Vault

    remote_write_known.start_compiling(wait=True)  # as a gateway worker has it
    remote_write_known.USE_COMPILED = args.decoder == "compiled"

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "payloads.bin"
        bench.build_payloads(bench.parse_args(["--requests", str(args.requests)]), path)
        payloads = bench.read_payloads(str(path))
        vault = Vault.open_local(str(Path(tmp) / "vault"))

        def one(body: bytes) -> int:
            decoded = decode_remote_write(
                body,
                content_type="application/x-protobuf",
                content_encoding="snappy",
                version_header="0.1.0",
                max_decoded_bytes=64 << 20,
            )
            resolved = decoded.prepared()
            assert resolved is not None, "the bench's payloads take the known-series path"
            return int(
                vault.write_resolved(
                    resolved.series_ids, resolved.timestamps, resolved.values, resolved.series
                )
            )

        for body, _ in payloads[: args.warmup]:
            one(body)
        vault.flush()  # the warm-up's samples (the first flush also learns every series)
        timed = payloads[args.warmup :]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        stored = sum(one(body) for body, _ in timed)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        flushed = vault.flush()
        if profiler:
            profiler.disable()
        cpu2 = time.process_time()
        vault.close()
    per_request = (cpu1 - cpu0) / len(timed) * 1e3
    per_sample, wall_ms = (cpu1 - cpu0) / stored * 1e9, (wall1 - wall0) / len(timed) * 1e3
    flush_ns = (cpu2 - cpu1) / max(flushed, 1) * 1e9
    print(f"decoder: {args.decoder}; requests timed: {len(timed)}, samples {stored:,}, "
          f"flushed {flushed:,}")  # fmt: skip
    print(
        f"decode + durable store: {per_request:.3f} ms CPU per request "
        f"({per_sample:.0f} ns/sample; wall {wall_ms:.2f} ms)"
    )
    print(f"flush: {(cpu2 - cpu1) * 1e3:.0f} ms CPU ({flush_ns:.0f} ns/sample)")
    print(f"in all: {((cpu1 - cpu0) + (cpu2 - cpu1)) / stored * 1e9:.0f} ns of CPU per sample")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
