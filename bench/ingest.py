"""Ingest benchmark: remote_write 1.0 samples/s into one metricvault gateway and VictoriaMetrics.

The payloads are built once, up front, from the simulator: the cluster's samples in scrape order
(time-major, like a Prometheus queue), cut into batches of ``--batch`` (2,000) samples, every
series with the labels Prometheus would send (the dcgm-exporter labels plus ``job`` and
``instance``; a training series' own ``job`` becomes ``exported_job``), sorted by name, protobuf
``prometheus.WriteRequest``, snappy block compressed. Every (series, timestamp) occurs once, so
no sample is a duplicate. They go to a temp file.

One load process (this script in ``--load`` mode) reads that file and sends the same payloads,
over ``--connections`` keep-alive HTTP connections, first to ``metricvault serve`` subprocesses
(once per ``--workers`` value: 2 gateway worker processes, the default, then 1) and then to
VictoriaMetrics' ``/api/v1/write``; it stops after all payloads or ``--duration``
seconds, counts the acknowledged samples (2xx), honours 429/503 ``Retry-After`` by sleeping and
resending, and records each request's latency. Afterwards the gateway is stopped with SIGTERM and
the vault must hold exactly the acknowledged samples.

Run from the repository root::

    .venv/bin/python bench/ingest.py --quick                 # < 1 min
    .venv/bin/python bench/ingest.py                         # < 5 min
    .venv/bin/python bench/ingest.py --workers 2 --no-vm     # the default gateway only
    .venv/bin/python bench/ingest.py --otlp                  # OTLP rows too, same samples
    .venv/bin/python bench/ingest.py --connections 8 --duration 30 --markdown results.md

It installs nothing. VictoriaMetrics comes from ``apt-get install -y victoria-metrics``; without
it that peer is skipped with a message. Rich tables go to stdout, then the markdown report (or to
``--markdown FILE``); progress goes to stderr.
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
import http.client
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

TARGET_SAMPLES_PER_S = 250_000  # a 5,000-GPU cluster, 50 series per GPU, scraped every 1 s
CONTENT_TYPE = "application/x-protobuf"
REMOTE_WRITE_VERSION = "0.1.0"
FILE_MAGIC = b"MVRWPAY1"
SAMPLE_RECORD_BYTES = 18  # TimeSeries.samples entry: tag, length, Sample{tag, double, tag, ts}
MAX_CONNECTION_ERRORS = 20  # per connection thread, before the run counts it as failed
MAX_RETRY_AFTER_S = 30.0
WINDOW_S = 5.0  # width of the windows for the "slowest window" rate
NA = "n/a"
DEFAULT_GATEWAY_WORKERS = 2  # metricvault's own default for the gateway_workers setting
LOAD_AT_START = os.getloadavg()[0]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- arguments --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=13, help="simulated nodes (default 13)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    parser.add_argument("--batch", type=int, default=2000, help="samples per request (2000)")
    parser.add_argument(
        "--requests", type=int, default=10_000, help="payloads built and at most sent (10000)"
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="stop sending after this many s (60)"
    )
    parser.add_argument(
        "--connections", type=int, default=6, help="concurrent keep-alive connections (6)"
    )
    parser.add_argument(
        "--workers",
        default=f"{DEFAULT_GATEWAY_WORKERS},1",
        help="comma list of gateway_workers values, one gateway run each (default 2,1: the "
        "default, then a single process)",
    )
    parser.add_argument("--quick", action="store_true", help="1000 requests, 15 s: < 1 min in all")
    parser.add_argument("--no-vm", action="store_true", help="skip VictoriaMetrics")
    parser.add_argument(
        "--otlp",
        action="store_true",
        help="also send the same samples as OTLP/HTTP (protobuf, gzip) to POST /v1/metrics",
    )
    parser.add_argument("--workdir", default=None, help="where temporary files go (default TMP)")
    parser.add_argument("--keep", action="store_true", help="keep the vault and logs afterwards")
    parser.add_argument("--markdown", metavar="FILE", help="write the markdown report here")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="sample each gateway (and its workers) with py-spy during the load (raw stacks to "
        "DIR) and print the top functions by own and by total time (pip install py-spy)",
    )
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: sample only the thread holding each process's GIL, from the "
        "load's start to its end, and break the samples down by thread (the event loop, the "
        "request threads, the flusher)",
    )
    parser.add_argument("--load", metavar="PAYLOADS", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.duration = min(args.requests, 1000), min(args.duration, 15.0)
    if args.batch < 1 or args.requests < 1 or args.connections < 1 or args.duration <= 0:
        parser.error("--batch, --requests, --connections and --duration must be positive")
    try:
        args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    except ValueError:
        parser.error(f"--workers {args.workers!r}: write a comma list of integers, e.g. 2,1")
    if not args.workers or min(args.workers) < 1:
        parser.error("--workers needs at least one value, each at least 1")
    return args


# --- payloads ---------------------------------------------------------------------------------


@dataclass
class PayloadSet:
    path: str
    requests: int
    samples: int
    series: int
    labels_per_series: float  # mean, including __name__
    raw_bytes: int  # serialized WriteRequests
    compressed_bytes: int  # snappy block, what goes over the wire
    first_ms: int
    last_ms: int
    build_s: float


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _sample_records(ts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One ``TimeSeries.samples`` field per sample, as rows of SAMPLE_RECORD_BYTES bytes.

    ``0x12 0x10`` (field 2, 16 bytes) ``0x09`` double value ``0x10`` varint timestamp: every
    millisecond timestamp of these years (2**35 <= ts < 2**42) is a 6-byte varint.
    """
    if ts.size and (int(ts.min()) < 2**35 or int(ts.max()) >= 2**42):
        raise ValueError("timestamps outside 1971-2109 need another varint width")
    rec = np.empty((ts.size, SAMPLE_RECORD_BYTES), np.uint8)
    rec[:, 0], rec[:, 1], rec[:, 2] = 0x12, 0x10, 0x09
    rec[:, 3:11] = values.astype("<f8").view(np.uint8).reshape(-1, 8)
    rec[:, 11] = 0x10
    rest = ts.astype(np.uint64)
    for i in range(6):
        byte = (rest & np.uint64(0x7F)).astype(np.uint8)
        rec[:, 12 + i] = byte | np.uint8(0x80) if i < 5 else byte
        rest >>= np.uint64(7)
    return rec


def _prometheus_labels(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The labels Prometheus sends for one simulated series, sorted by name."""
    labels = {"__name__": row["metric"]}
    for name, value in row.items():
        if name not in ("metric", "timestamp", "value") and value not in (None, ""):
            labels[name] = value
    if "Hostname" in labels:  # a dcgm-exporter target per node
        labels["job"] = "dcgm-exporter"
        labels["instance"] = f"{labels['Hostname']}:9400"
    else:  # a training series, scraped from the job's rank-0 trainer
        labels["exported_job"] = labels.pop("job")
        labels["job"] = "trainer"
        labels["instance"] = f"{labels['exported_job']}-rank0:8000"
    return sorted(labels.items())


def _label_bytes(labels: list[tuple[str, str]]) -> bytes:
    """``TimeSeries.labels`` of one series, serialized by the protobuf message classes."""
    from metricvault.wire.proto.messages import WriteRequest

    request = WriteRequest()
    series = request.timeseries.add()
    for name, value in labels:
        series.labels.add(name=name, value=value)
    body: bytes = series.SerializeToString()
    return body


class _Encoder:
    """Global series ids and the cached ``TimeSeries`` heads (tag, length, labels) per series."""

    def __init__(self) -> None:
        self.ids: dict[tuple[tuple[str, str], ...], int] = {}
        self.labels: list[list[tuple[str, str]]] = []
        self.label_bytes: list[bytes] = []
        self._heads: dict[tuple[int, int], bytes] = {}

    def series_ids(self, chunk: Any) -> np.ndarray:
        """The global series id of every row of a simulator chunk (rows grouped by series)."""
        import pyarrow.compute as pc

        keys = [n for n in chunk.column_names if n not in ("timestamp", "value")]
        changed = np.zeros(chunk.num_rows, bool)
        changed[0] = True
        for name in keys:
            codes = pc.dictionary_encode(chunk[name]).combine_chunks().indices
            codes = pc.fill_null(codes, -1).to_numpy()
            changed[1:] |= codes[1:] != codes[:-1]
        starts = np.flatnonzero(changed)
        run_sid = np.empty(starts.size, np.int64)
        for i, row in enumerate(chunk.select(keys).take(starts).to_pylist()):
            labels = _prometheus_labels(row)
            key = tuple(labels)
            if key not in self.ids:
                self.ids[key] = len(self.labels)
                self.labels.append(labels)
                self.label_bytes.append(_label_bytes(labels))
            run_sid[i] = self.ids[key]
        row_sid: np.ndarray = run_sid[np.cumsum(changed) - 1]
        return row_sid

    def head(self, sid: int, samples: int) -> bytes:
        """``WriteRequest.timeseries`` tag and length, then the series' labels."""
        key = (sid, samples)
        head = self._heads.get(key)
        if head is None:
            labels = self.label_bytes[sid]
            size = len(labels) + SAMPLE_RECORD_BYTES * samples
            head = self._heads[key] = b"\x0a" + _varint(size) + labels
        return head

    def request(self, sids: np.ndarray, records: np.ndarray) -> bytes:
        """One serialized WriteRequest: the batch's samples grouped by series, time-ordered."""
        by_series = np.argsort(sids, kind="stable")
        sids, flat = sids[by_series], records[by_series].tobytes()
        bounds = np.flatnonzero(np.diff(sids)) + 1
        starts = np.concatenate(([0], bounds)).tolist()
        ends = np.concatenate((bounds, [sids.size])).tolist()
        parts: list[bytes] = []
        width = SAMPLE_RECORD_BYTES
        for s, e, sid in zip(starts, ends, sids[starts].tolist(), strict=True):
            parts.append(self.head(sid, e - s))
            parts.append(flat[s * width : e * width])
        return b"".join(parts)


def _simulated_chunks(args: argparse.Namespace, needed: int) -> Iterator[Any]:
    """Simulator chunks (one hour each) until at least ``needed`` samples."""
    from metricvault.sim import ClusterSpec, generate, series_count

    probe = ClusterSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=1, seed=args.seed)
    steps = needed / series_count(probe) * 1.1 + 720  # scrape gaps, and a whole last hour
    days = steps * probe.interval_s / 86_400
    spec = ClusterSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=days, seed=args.seed
    )
    rows = 0
    for chunk in generate(spec, chunk_hours=1.0):
        yield chunk
        rows += chunk.num_rows
        if rows >= needed:
            return
    raise SystemExit(f"the simulator gave {rows:,} samples, fewer than {needed:,}; a bench bug")


def build_payloads(args: argparse.Namespace, path: Path) -> PayloadSet:
    """Simulate, order like a Prometheus queue, encode and compress; write them to ``path``."""
    import cramjam

    started = time.perf_counter()
    encoder = _Encoder()
    sid_left = np.empty(0, np.int64)
    rec_left = np.empty((0, SAMPLE_RECORD_BYTES), np.uint8)
    written = raw_total = compressed_total = 0
    first_ms, last_ms = 2**63, 0
    with open(path, "wb") as out:
        out.write(FILE_MAGIC + struct.pack("<QQ", args.requests, args.batch))
        for chunk in _simulated_chunks(args, args.requests * args.batch):
            sid = encoder.series_ids(chunk)
            ts = chunk["timestamp"].to_numpy()
            order = np.lexsort((sid, ts))  # scrape order: by time, then series
            sid, ts = sid[order], ts[order]
            if np.any((np.diff(ts) == 0) & (np.diff(sid) == 0)):
                raise SystemExit("a (series, timestamp) occurs twice; this is a bench bug")
            records = _sample_records(ts, chunk["value"].to_numpy()[order])
            sid_left = np.concatenate((sid_left, sid))
            rec_left = np.concatenate((rec_left, records))
            first_ms, last_ms = min(first_ms, int(ts[0])), max(last_ms, int(ts[-1]))
            while sid_left.size >= args.batch and written < args.requests:
                b_sid, b_rec = sid_left[: args.batch], rec_left[: args.batch]
                sid_left, rec_left = sid_left[args.batch :], rec_left[args.batch :]
                raw = encoder.request(b_sid, b_rec)
                compressed = bytes(cramjam.snappy.compress_raw(raw))
                if written == 0:
                    _check_first_payload(raw, compressed, encoder, b_sid)
                out.write(struct.pack("<Q", len(compressed)))
                out.write(compressed)
                written += 1
                raw_total += len(raw)
                compressed_total += len(compressed)
            if written == args.requests:
                break
    return PayloadSet(
        path=str(path),
        requests=args.requests,
        samples=args.requests * args.batch,
        series=len(encoder.labels),  # series met in the chunks read (a few may come later)
        labels_per_series=float(np.mean([len(labels) for labels in encoder.labels])),
        raw_bytes=raw_total,
        compressed_bytes=compressed_total,
        first_ms=first_ms,
        last_ms=last_ms,  # of the last chunk read; the payloads end a little earlier
        build_s=time.perf_counter() - started,
    )


def _check_first_payload(
    raw: bytes, compressed: bytes, encoder: _Encoder, sids: np.ndarray
) -> None:
    """The hand-assembled bytes parse as the WriteRequest the message classes would build,
    and the gateway's own decoder accepts them with every sample."""
    import cramjam

    from metricvault.ingest.protocols.remote_write import decode_remote_write
    from metricvault.wire.proto.messages import WriteRequest

    if bytes(cramjam.snappy.decompress_raw(compressed)) != raw:
        raise SystemExit("snappy round trip failed")
    parsed = WriteRequest.FromString(raw)
    if sum(len(s.samples) for s in parsed.timeseries) != sids.size:
        raise SystemExit("first payload: sample count differs after parsing")
    expected = WriteRequest()
    for series in parsed.timeseries:  # rebuilt with the message classes from our own labels
        labels = tuple((label.name, label.value) for label in series.labels)
        if [n for n, _ in labels] != sorted({n for n, _ in labels}):
            raise SystemExit(f"labels not sorted by name or not unique: {labels}")
        one = expected.timeseries.add()
        for name, value in encoder.labels[encoder.ids[labels]]:
            one.labels.add(name=name, value=value)
        for sample in series.samples:
            one.samples.add(value=sample.value, timestamp=sample.timestamp)
    if expected != parsed:
        raise SystemExit("first payload differs from the WriteRequest the message classes build")
    decoded = decode_remote_write(
        compressed,
        content_type=CONTENT_TYPE,
        content_encoding="snappy",
        version_header=REMOTE_WRITE_VERSION,
    )
    if decoded.samples != sids.size or decoded.table.num_rows != sids.size:
        raise SystemExit(
            f"first payload: the gateway decoder sees {decoded.samples} samples, not {sids.size}"
        )


def read_payloads(path: str) -> list[tuple[bytes, int]]:
    """(body, samples) per request, as written by build_payloads."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != FILE_MAGIC:
        raise SystemExit(f"{path} is not a payload file of this benchmark")
    count, batch = struct.unpack_from("<QQ", data, 8)
    pos, out = 24, []
    for _ in range(count):
        (size,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        out.append((data[pos : pos + size], batch))
        pos += size
    return out


# --- the load process -------------------------------------------------------------------------


@dataclass
class LoadResult:
    url: str
    connections: int
    requests_sent: int = 0  # acknowledged requests
    samples_acked: int = 0
    elapsed_s: float = 0.0  # first send to last acknowledgement
    retries: int = 0  # 429/503 answers that were slept on and resent
    retry_sleep_s: float = 0.0
    connection_errors: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # status -> requests refused for good
    stopped_by: str = ""  # "payloads" or "duration"
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    slowest_window_rate: float = 0.0  # samples/s in the slowest WINDOW_S window
    load_cpu_s: float = 0.0  # CPU seconds the load process used

    @property
    def rate(self) -> float:
        return self.samples_acked / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _retry_after(response: http.client.HTTPResponse) -> float:
    value = response.getheader("Retry-After", "1") or "1"
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        return 1.0


REMOTE_WRITE_HEADERS = {
    "Content-Type": CONTENT_TYPE,
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": REMOTE_WRITE_VERSION,
    "User-Agent": "metricvault-bench/ingest",
}
OTLP_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "gzip",  # the OpenTelemetry Collector's otlphttp default
    "User-Agent": "metricvault-bench/ingest",
}


def run_load(
    url: str,
    payloads: list[tuple[bytes, int]],
    connections: int,
    duration_s: float,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Send the payloads (each once) over ``connections`` threads until done or out of time."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
    headers = headers or REMOTE_WRITE_HEADERS
    result = LoadResult(url=url, connections=connections)
    lock = threading.Lock()
    next_index = iter(range(len(payloads)))
    latencies: list[float] = []
    done_at: list[tuple[float, int]] = []  # (completion time, samples)
    started = time.perf_counter()
    deadline = started + duration_s
    cpu_before = time.process_time()

    def take() -> int | None:
        with lock:
            if time.perf_counter() >= deadline:
                result.stopped_by = result.stopped_by or "duration"
                return None
            index = next(next_index, None)
            if index is None:
                result.stopped_by = result.stopped_by or "payloads"
            return index

    def worker() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        errors = 0
        while (index := take()) is not None:
            body, samples = payloads[index]
            while True:
                sent = time.perf_counter()
                try:
                    conn.request("POST", path, body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                except (OSError, http.client.HTTPException):
                    conn.close()  # reconnect and resend: both peers are idempotent for this
                    errors += 1
                    with lock:
                        result.connection_errors += 1
                    if errors > MAX_CONNECTION_ERRORS:
                        return
                    time.sleep(0.2)
                    continue
                answered = time.perf_counter()
                if response.status in (429, 503):
                    pause = _retry_after(response)
                    with lock:
                        result.retries += 1
                        result.retry_sleep_s += pause
                    time.sleep(pause)
                    continue
                with lock:
                    if 200 <= response.status < 300:
                        result.requests_sent += 1
                        result.samples_acked += samples
                        latencies.append(answered - sent)
                        done_at.append((answered - started, samples))
                    else:
                        key = str(response.status)
                        result.failed[key] = result.failed.get(key, 0) + 1
                break
        conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.load_cpu_s = time.process_time() - cpu_before
    if done_at:
        result.elapsed_s = max(t for t, _ in done_at)
        lat_ms = np.asarray(latencies) * 1000
        result.p50_ms = float(np.percentile(lat_ms, 50))
        result.p99_ms = float(np.percentile(lat_ms, 99))
        result.max_ms = float(lat_ms.max())
        result.slowest_window_rate = _slowest_window(done_at, result.elapsed_s)
    return result


def _slowest_window(done_at: list[tuple[float, int]], elapsed_s: float) -> float:
    """Samples/s of the slowest whole WINDOW_S window (the whole run if shorter)."""
    windows = int(elapsed_s // WINDOW_S)
    if windows < 1:
        return sum(n for _, n in done_at) / elapsed_s
    per = np.zeros(windows)
    for t, n in done_at:
        w = int(t // WINDOW_S)
        if w < windows:
            per[w] += n
    return float(per.min() / WINDOW_S)


def load_main(payload_path: str) -> int:
    """``--load``: read the payloads once, then one JSON command per stdin line, one answer each."""
    payloads = read_payloads(payload_path)
    print(json.dumps({"ready": len(payloads)}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        result = run_load(
            command["url"],
            payloads,
            command["connections"],
            command["duration_s"],
            command.get("headers"),
        )
        print(json.dumps(asdict(result)), flush=True)
    return 0


class LoadProcess:
    """The load generator as a separate process (this script with ``--load``)."""

    def __init__(self, payload_path: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)]),
        }
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--load", payload_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self._answer()
        self.count = int(ready["ready"])

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the load process exited (status {self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(
        self,
        url: str,
        connections: int,
        duration_s: float,
        headers: dict[str, str] | None = None,
    ) -> LoadResult:
        assert self.process.stdin is not None
        command = {
            "url": url,
            "connections": connections,
            "duration_s": duration_s,
            "headers": headers,
        }
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return LoadResult(**self._answer())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- the servers ------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants (gateway workers, their helpers), from /proc.

    Reads the parent pid of every process once (``/proc/<pid>/task/*/children`` needs a kernel
    option that is not always there)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _own_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # exited between listing and reading
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_hwm_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU seconds so far of a server process and all its descendants (``metricvault serve``
    with ``gateway_workers > 1`` is a supervisor whose workers do the work)."""
    if not os.path.exists(f"/proc/{pid}"):
        return float("nan")
    return sum(_own_cpu_seconds(p) for p in process_tree(pid))


def rss_mib(pid: int) -> float:
    """Sum of the peak resident memory (``VmHWM``) of a server process and its descendants.

    Each process's own peak, added up: an upper bound of the tree's peak at any one moment
    (the peaks need not coincide, and shared library pages count once per process)."""
    if not os.path.exists(f"/proc/{pid}"):
        return float("nan")
    return sum(_own_hwm_mib(p) for p in process_tree(pid))


def http_get(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


STARTED_WINDOW_S = 0.5  # a gateway worker is started once it idles this long...
STARTED_CPU_S = 0.025  # ...using less CPU than this


class GatewayProcess:
    """``metricvault serve`` on a free port with a fresh vault and ``workers`` gateway worker
    processes (``--set gateway_workers``), stopped by SIGTERM."""

    def __init__(self, data_dir: Path, log_path: Path, workers: int) -> None:
        from bench.peers import free_port

        self.workers = workers
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
        args = [
            sys.executable,
            "-m",
            "metricvault.cli",
            "serve",
            "--data",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--set",
            "gateway_maintain=false",
            "--set",
            f"gateway_workers={workers}",
        ]
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/write"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited:\n{self.log_tail()}")
            try:
                ready = http_get(self.port, "/-/ready")[0] == 200
            except OSError:
                ready = False
            # with workers, the supervisor plus one process per worker (it may add a helper)
            if ready and (self.workers == 1 or len(self.worker_pids()) >= self.workers):
                self.wait_workers_started(deadline)
                return
            time.sleep(0.1)
        raise RuntimeError(f"the gateway was not ready in {timeout_s} s:\n{self.log_tail()}")

    def wait_workers_started(self, deadline: float) -> None:
        """/-/ready is answered by whichever worker is up first; a worker still starting
        (imports, flushing the other buffers) accepts no connection, so a load started then
        lands whole on the first worker and stays there (keep-alive). Wait until every
        worker is idle: under STARTED_CPU_S of CPU each over STARTED_WINDOW_S."""
        if self.workers == 1:
            return
        before = {pid: _own_cpu_seconds(pid) for pid in self.worker_pids()}
        while time.monotonic() < deadline:
            time.sleep(STARTED_WINDOW_S)
            now = {pid: _own_cpu_seconds(pid) for pid in self.worker_pids()}
            if all(now[pid] - before.get(pid, 0.0) < STARTED_CPU_S for pid in now):
                return
            before = now
        raise RuntimeError(f"the gateway's workers did not settle:\n{self.log_tail()}")

    def worker_pids(self) -> list[int]:
        """The live descendants of the serve process (its workers, when there are several)."""
        return process_tree(self.process.pid)[1:]

    def metrics(self) -> dict[str, float]:
        """The gateway's own counters (metricvault_* lines of /metrics), summed over labels."""
        status, body = http_get(self.port, "/metrics")
        found: dict[str, float] = {}
        if status != 200:
            return found
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_part, _, value = line.rpartition(" ")
            name = name_part.split("{", 1)[0]
            try:
                found[name] = found.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return found

    def stop(self, timeout_s: float = 120.0) -> float:
        """SIGTERM (drain and flush), wait; returns the seconds it took."""
        started = time.perf_counter()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"the gateway did not stop in {timeout_s} s on SIGTERM") from exc
        return time.perf_counter() - started

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class SystemRun:
    name: str
    load: LoadResult | None = None
    server_cpu_s: float = float("nan")  # CPU seconds of the server and its workers, during the load
    server_rss_mib: float = float("nan")  # peak resident memory, summed over those processes
    check: str = ""  # the correctness check, in words
    check_ok: bool | None = None
    note: str = ""
    profile: list[str] = field(default_factory=list)  # --profile: the top functions, in words

    @property
    def server_cores(self) -> float:
        if self.load is None or self.load.elapsed_s <= 0:
            return float("nan")
        return self.server_cpu_s / self.load.elapsed_s


PROFILE_TOP = 15
PROFILE_TOP_PER_THREAD = 8


def _start_profiler(
    directory: str | None, pid: int, name: str, gil: bool = False
) -> tuple[Any, Path] | None:
    """py-spy sampling ``pid`` and its subprocesses (the workers) until it exits or is
    stopped; ``gil``: only the thread holding each process's GIL, named in each stack."""
    if not directory:
        return None
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(binary).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    out = Path(directory).resolve() / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [binary, "record", "-p", str(pid), "--subprocesses", "--function", "--nonblocking"]
    command += ["--format", "raw", "--rate", "100", "-o", str(out)]
    command += ["--gil", "--threads"] if gil else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return process, out


def _stop_profiler(spy: tuple[Any, Path]) -> None:
    """End the recording now (py-spy writes its file on SIGINT)."""
    process, _ = spy
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)


def _finish_profiler(spy: tuple[Any, Path]) -> list[str]:
    process, out = spy
    try:
        process.wait(timeout=60)  # it writes its file when the gateway has exited
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    return summarize_profile(out)


# Leaf frames of threads that only wait (py-spy --nonblocking samples some of them as busy):
# the gateway's idle pool threads, the event loop's select, queued group-commit appends.
PROFILE_WAITS = ("Condition.wait ", "Event.wait ", "Queue.get ", "EpollSelector.select ", "sleep ")


def summarize_profile(path: Path, top: int = PROFILE_TOP) -> list[str]:
    """The top functions of py-spy's raw stacks, by own and by total (inclusive) time, as a
    share of the samples of the gateway's busy threads: stacks that end in a wait
    (``PROFILE_WAITS``) are counted apart and left out of the shares."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    threads: dict[str, dict[str, int]] = {}  # thread name -> own time (--threads stacks)
    samples = waiting = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            re.sub(r"^(\S+) \((?:.*/)?([^/]+)(:\d+)?\)$", r"\1 (\2)", f) for f in stack.split(";")
        ]
        thread = next((f.partition("): ")[2] for f in frames if f.startswith("thread (")), "")
        frames = [f for f in frames if not f.startswith(("process ", "thread ("))]
        if not frames:
            continue
        if frames[-1].startswith(PROFILE_WAITS):
            waiting += count
            continue
        samples += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        if thread:
            by_thread = threads.setdefault(thread, {})
            by_thread[frames[-1]] = by_thread.get(frames[-1], 0) + count
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + count
    if not samples:
        return [f"profile {path}: no samples"]
    lines = [
        f"profile {path.name}: {samples:,} busy samples (100 Hz; {waiting:,} more ended in a "
        "wait and are left out)"
    ]
    for title, table in (("own", own), ("total", total)):
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        lines.append(
            f"top {top} by {title} time: "
            + "; ".join(f"{name} {count / samples:.1%}" for name, count in ranked)
        )
    for thread, table in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:PROFILE_TOP_PER_THREAD]
        lines.append(
            f"thread {thread!r} {sum(table.values()) / samples:.1%}, its top by own time: "
            + "; ".join(f"{name} {count / samples:.1%}" for name, count in ranked)
        )
    return lines


def gateway_label(workers: int, otlp: bool = False) -> str:
    default = ", default" if workers == DEFAULT_GATEWAY_WORKERS else ""
    via = "OTLP, " if otlp else ""
    return f"metricvault ({via}{workers} worker{'s' if workers > 1 else ''}{default})"


def bench_gateway(
    load: LoadProcess, args: argparse.Namespace, workdir: Path, workers: int, otlp: bool = False
) -> SystemRun:
    from metricvault.store.vault import Vault as LocalVault

    run = SystemRun(gateway_label(workers, otlp))
    data_dir = workdir / "vault"
    gateway = GatewayProcess(data_dir, workdir / "gateway.log", workers)
    try:
        gateway.wait_ready()
        log(
            f"  gateway ready on port {gateway.port} (pid {gateway.process.pid}, "
            f"descendants {gateway.worker_pids()})"
        )
        spy = _start_profiler(args.profile, gateway.process.pid, workdir.name, args.profile_gil)
        cpu_before = cpu_seconds(gateway.process.pid)
        if otlp:
            url = gateway.url.replace("/api/v1/write", "/v1/metrics")
            run.load = load.run(url, args.connections, args.duration, OTLP_HEADERS)
        else:
            run.load = load.run(gateway.url, args.connections, args.duration)
        run.server_cpu_s = cpu_seconds(gateway.process.pid) - cpu_before
        if spy is not None and args.profile_gil:
            _stop_profiler(spy)  # the load only, not the drain and flush at SIGTERM
        run.server_rss_mib = rss_mib(gateway.process.pid)
        counters = gateway.metrics()
    finally:
        stop_s = gateway.stop()
    log(f"  gateway stopped by SIGTERM in {stop_s:.1f} s (drain + flush)")
    if spy is not None:
        run.profile = _finish_profiler(spy)
    with LocalVault.open_local(str(data_dir)) as vault:
        vault.flush()
        stored = int(vault.stats()["tiers"]["raw"]["rows"])
    acked = run.load.samples_acked
    run.check_ok = stored == acked
    run.check = f"vault raw rows after SIGTERM + flush {stored:,} vs acknowledged {acked:,}"
    stored_counter = counters.get("metricvault_samples_stored_total")
    flushes = counters.get("metricvault_flush_duration_seconds_count", 0.0)
    flush_s = counters.get("metricvault_flush_duration_seconds_sum", 0.0)
    run.note = (
        f"SIGTERM to exit {stop_s:.1f} s; the gateway's timed flushes: {flushes:.0f}, "
        f"{flush_s:.1f} s in all"
    )
    if stored_counter is not None:
        run.note += f"; /metrics samples stored {stored_counter:,.0f}"
    return run


def bench_vm(load: LoadProcess, args: argparse.Namespace, workdir: Path) -> SystemRun:
    from bench.peers import (
        VM_INSTALL_HINT,
        VictoriaMetrics,
        find_victoria_metrics,
        victoria_metrics_version,
    )

    binary = find_victoria_metrics()
    run = SystemRun(
        f"VictoriaMetrics {victoria_metrics_version()}" if binary else "VictoriaMetrics"
    )
    if args.no_vm:
        run.note = "skipped (--no-vm)"
        return run
    if binary is None:
        log(VM_INSTALL_HINT)
        run.note = VM_INSTALL_HINT
        return run
    with VictoriaMetrics(binary, workdir) as vm:  # -search.latencyOffset=1s, fresh data dir
        assert vm.process is not None
        pid = vm.process.pid
        log(f"  VictoriaMetrics ready on port {vm.port} (pid {pid})")
        cpu_before = cpu_seconds(pid)
        run.load = load.run(
            f"http://127.0.0.1:{vm.port}/api/v1/write", args.connections, args.duration
        )
        run.server_cpu_s = cpu_seconds(pid) - cpu_before
        run.server_rss_mib = rss_mib(pid)
        inserted = _vm_rows_inserted(vm.port)
    acked = run.load.samples_acked
    run.check_ok = inserted == acked
    run.check = (
        f"vm_rows_inserted_total{{type=promremotewrite}} {inserted:,} vs acknowledged {acked:,}"
    )
    return run


def _vm_rows_inserted(port: int) -> int:
    _status, body = http_get(port, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith('vm_rows_inserted_total{type="promremotewrite"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return -1


# --- report -----------------------------------------------------------------------------------

HEADERS = (
    "system",
    "samples acked",
    "samples/s",
    "slowest 5 s window",
    "p50 ms",
    "p99 ms",
    "max ms",
    "retries (429/503)",
    "errors",
    "server CPU (cores)",
    "samples per server CPU-s",
    "server peak RSS MiB",
    "load CPU (cores)",
    "stopped by",
    "check",
)


def _f(value: float, digits: int = 1) -> str:
    return NA if value != value else f"{value:,.{digits}f}"


def result_rows(runs: list[SystemRun]) -> list[tuple[str, ...]]:
    rows = []
    for run in runs:
        load = run.load
        if load is None:
            rows.append((run.name, *([NA] * (len(HEADERS) - 2)), "skipped (see note)"))
            continue
        failed = sum(load.failed.values())
        errors = f"{failed} refused {load.failed}" if failed else "0"
        if load.connection_errors:
            errors += f", {load.connection_errors} connection"
        verdict = NA if run.check_ok is None else ("OK" if run.check_ok else "MISMATCH")
        rows.append(
            (
                run.name,
                f"{load.samples_acked:,}",
                f"{load.rate:,.0f}",
                f"{load.slowest_window_rate:,.0f}",
                _f(load.p50_ms),
                _f(load.p99_ms),
                _f(load.max_ms),
                f"{load.retries} ({load.retry_sleep_s:.0f} s slept)",
                errors,
                _f(run.server_cores, 2),
                _f(_per_cpu(run), 0),
                _f(run.server_rss_mib, 0),
                _f(load.load_cpu_s / load.elapsed_s if load.elapsed_s else float("nan"), 2),
                f"{load.stopped_by} after {load.elapsed_s:.1f} s",
                verdict,
            )
        )
    return rows


def verdict_lines(runs: list[SystemRun]) -> list[str]:
    gateways = [run for run in runs if run.name.startswith("metricvault")]
    vm = next((run for run in runs if not run.name.startswith("metricvault")), None)
    lines = []
    for mv in gateways:
        if mv.load is None:
            continue
        ok = mv.load.rate >= TARGET_SAMPLES_PER_S
        lines.append(
            f"Target: {mv.name} >= {TARGET_SAMPLES_PER_S:,} samples/s sustained: "
            f"{'PASS' if ok else 'MISS'} ({mv.load.rate:,.0f} samples/s)"
        )
    for mv in gateways:
        if mv.load is not None and vm is not None and vm.load is not None and vm.load.rate > 0:
            lines.append(
                f"Ratio {mv.name} / VictoriaMetrics: {mv.load.rate / vm.load.rate:.3f} "
                f"(p99 {mv.load.p99_ms:,.1f} ms vs {vm.load.p99_ms:,.1f} ms); per server "
                f"CPU-second: {_per_cpu(mv) / _per_cpu(vm):.3f} (load-independent: what each "
                "would do with the same cores)"
            )
    for run in runs:
        if run.check:
            state = NA if run.check_ok is None else ("OK" if run.check_ok else "MISMATCH")
            lines.append(f"Check {run.name}: {run.check}: {state}")
        if run.note:
            lines.append(f"Note {run.name}: {run.note}")
        lines += [f"Profile {run.name}: {line}" for line in run.profile]
    return lines


def _per_cpu(run: SystemRun) -> float:
    """Acknowledged samples per CPU-second of the server (NaN if not measured)."""
    if run.load is None or not run.server_cpu_s > 0:
        return float("nan")
    return run.load.samples_acked / run.server_cpu_s


def describe(payloads: PayloadSet, args: argparse.Namespace) -> list[str]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    span_h = (payloads.last_ms - payloads.first_ms) / 3_600_000
    return [
        f"command: `{' '.join(['bench/ingest.py', *sys.argv[1:]])}`",
        f"run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: "
        f"{os.cpu_count()} CPUs, {memory:.0f} GiB RAM, Python {platform.python_version()}; "
        f"load average at start {LOAD_AT_START:.1f} (other work here skews timings)",
        f"payloads: {payloads.requests:,} remote_write 1.0 requests of {args.batch:,} samples "
        f"({payloads.samples:,} samples, {payloads.series:,} series, "
        f"{payloads.labels_per_series:.1f} labels per series incl. __name__, "
        f"{span_h:.1f} h of a {args.nodes} x {args.gpus_per_node} GPU simulated cluster); "
        f"{payloads.raw_bytes / payloads.requests / 1024:,.0f} KiB protobuf -> "
        f"{payloads.compressed_bytes / payloads.requests / 1024:,.0f} KiB snappy per request; "
        f"built in {payloads.build_s:.1f} s",
        f"load: one separate process, {args.connections} keep-alive connections (http.client "
        f"threads), each payload sent once, stop after all payloads or {args.duration:g} s; "
        "samples/s = acknowledged samples / (first send to last acknowledgement); latency per "
        "acknowledged request (send to response read); the same process and payloads for both",
        "metricvault: `metricvault serve --set gateway_maintain=false --set gateway_workers=N` "
        f"for N in {', '.join(map(str, args.workers))} (the default is "
        f"{DEFAULT_GATEWAY_WORKERS}), a fresh vault in the temp dir each time (each 204 is "
        "fsynced to the SQLite ingest buffer of the worker); VictoriaMetrics: fresh data dir, "
        "`-search.latencyOffset=1s`",
        "server CPU and peak RSS: the server process and all its descendants (the gateway "
        "workers), from /proc; RSS is the sum of each process's VmHWM",
    ] + (
        [
            "OTLP rows (--otlp): the same requests re-encoded as OTLP/HTTP export requests "
            "(one gauge per metric name, a data point per sample, the labels as attributes, "
            "protobuf, gzip level 1) sent to POST /v1/metrics by the same kind of load process"
        ]
        if args.otlp
        else []
    )


def print_rich(head: list[str], runs: list[SystemRun]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=shutil.get_terminal_size((200, 40)).columns)
    table = Table(title="ingest: remote_write 1.0 (OTLP rows: the same samples as OTLP/HTTP)")
    for i, name in enumerate(HEADERS):
        table.add_column(name, justify="left" if i in (0, 13, 14) else "right")
    for row in result_rows(runs):
        table.add_row(*row)
    for line in head:
        console.print(f"[dim]{line}[/]")
    console.print(table)
    for line in verdict_lines(runs):
        console.print(line)


def markdown(head: list[str], runs: list[SystemRun]) -> str:
    out = ["# metricvault ingest benchmark", ""]
    out += [f"- {line}" for line in head]
    out += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(row) + " |" for row in result_rows(runs)]
    out += [""] + [f"- {line}" for line in verdict_lines(runs)] + [""]
    return "\n".join(out)


# --- main -------------------------------------------------------------------------------------


def _gateway_bench(
    load: LoadProcess, args: argparse.Namespace, workers: int, otlp: bool = False
) -> Callable[[Path], SystemRun]:
    return lambda workdir: bench_gateway(load, args, workdir, workers, otlp)


def build_otlp_payloads(path: str, out_path: Path) -> float:
    """The remote_write payloads re-encoded as OTLP/HTTP export requests (protobuf, gzip): the
    same samples, one gauge metric per metric name, one data point per sample, every label but
    ``__name__`` an attribute (no resource attributes, so no ``target_info``: the vault gets
    exactly the remote_write series). Returns the seconds it took."""
    import gzip

    import cramjam
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from metricvault.wire.proto.messages import WriteRequest

    started = time.perf_counter()
    payloads = read_payloads(path)
    with open(out_path, "wb") as out:
        out.write(FILE_MAGIC + struct.pack("<QQ", len(payloads), payloads[0][1]))
        for body, _ in payloads:
            written = WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
            request = ExportMetricsServiceRequest()
            scope = request.resource_metrics.add().scope_metrics.add()
            metrics: dict[str, Any] = {}
            for series in written.timeseries:
                labels = {label.name: label.value for label in series.labels}
                name = labels.pop("__name__")
                if name not in metrics:
                    metrics[name] = scope.metrics.add(name=name)
                gauge = metrics[name].gauge
                for sample in series.samples:
                    point = gauge.data_points.add(
                        time_unix_nano=sample.timestamp * 1_000_000, as_double=sample.value
                    )
                    for key, value in labels.items():
                        point.attributes.add(key=key).value.string_value = value
            packed = gzip.compress(request.SerializeToString(), compresslevel=1)
            out.write(struct.pack("<Q", len(packed)))
            out.write(packed)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        return load_main(args.load)
    root = Path(tempfile.mkdtemp(prefix="metricvault-ingest-", dir=args.workdir))
    load: LoadProcess | None = None
    loads: list[LoadProcess] = []
    try:
        log(f"building {args.requests:,} payloads of {args.batch:,} samples ...")
        payloads = build_payloads(args, root / "payloads.bin")
        log(
            f"  {payloads.samples:,} samples, {payloads.series:,} series, "
            f"{payloads.compressed_bytes / 2**20:,.1f} MiB snappy, in {payloads.build_s:.1f} s"
        )
        load = LoadProcess(payloads.path)
        log(f"load process ready (pid {load.process.pid}, {load.count:,} payloads)")
        runs = []
        systems: list[tuple[str, str, Callable[[Path], SystemRun]]] = [
            (gateway_label(w), f"metricvault-{w}w", _gateway_bench(load, args, w))
            for w in args.workers
        ]
        if args.otlp:  # the same samples again, as OTLP/HTTP, through POST /v1/metrics
            log("re-encoding the payloads as OTLP export requests ...")
            otlp_path = root / "otlp.bin"
            log(f"  done in {build_otlp_payloads(payloads.path, otlp_path):.1f} s")
            otlp_load = LoadProcess(str(otlp_path))
            loads.append(otlp_load)
            systems += [
                (gateway_label(w, True), f"otlp-{w}w", _gateway_bench(otlp_load, args, w, True))
                for w in args.workers
            ]
        systems.append(("VictoriaMetrics", "VictoriaMetrics", lambda d: bench_vm(load, args, d)))
        for name, dirname, bench in systems:
            log(f"{name}:")
            workdir = root / dirname
            workdir.mkdir()
            started = time.perf_counter()
            run = bench(workdir)
            if run.load is not None:
                log(
                    f"  {run.load.samples_acked:,} samples acked, {run.load.rate:,.0f} samples/s, "
                    f"p99 {run.load.p99_ms:,.1f} ms ({time.perf_counter() - started:.1f} s)"
                )
            runs.append(run)
    finally:
        if load is not None:
            load.close()
        for other in loads:
            other.close()
        if args.keep:
            log(f"files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    head = describe(payloads, args)
    print_rich(head, runs)
    text = markdown(head, runs)
    if args.markdown:
        Path(args.markdown).write_text(text)
        log(f"markdown report written to {args.markdown}")
    else:
        sys.stdout.write("\n" + text)
    return 0 if all(run.check_ok is not False for run in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
