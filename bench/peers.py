"""Peers that the store benchmark compares metricvault with: VictoriaMetrics, run for real.

VictoriaMetrics 1.79 (Debian: ``apt-get install -y victoria-metrics``) is started on 127.0.0.1
on a free port with a fresh data directory, loaded through ``POST /api/v1/import`` (JSON lines:
one line per series with its ``values`` and ``timestamps`` arrays, the format VictoriaMetrics
itself exports; floats are written by Arrow's shortest round-trip formatting, so every value and
millisecond timestamp is sent exactly), flushed, force-merged, measured and stopped by its PID.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.datasets import FIXED_COLUMNS

VM_BINARY = "victoria-metrics"
VM_INSTALL_HINT = (
    "VictoriaMetrics is not installed: run `apt-get update && apt-get install -y "
    "victoria-metrics` (Debian bookworm ships 1.79.5), then rerun; skipping this peer"
)
MAX_ROWS_PER_IMPORT_SLICE = 500_000  # keeps every JSON line far below -import.maxLineLen
MAX_BODY_BYTES = 16 * 1024 * 1024
MERGE_POLL_S = 0.5
MERGE_STABLE_POLLS = 3


def find_victoria_metrics() -> str | None:
    return shutil.which(VM_BINARY)


def victoria_metrics_version() -> str:
    """The Debian package version (the Debian build reports no version of its own)."""
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", VM_BINARY],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def dir_bytes(path: Path) -> int:
    """Apparent size (like ``du -sb``) of the regular files under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


# --- JSON-lines import body -------------------------------------------------------------------


def _exact_strings(array: pa.ChunkedArray) -> pa.ChunkedArray:
    """Shortest round-trip decimal text of each value, in VictoriaMetrics' spelling for NaN/Inf."""
    text = pc.cast(array, pa.string())
    if pa.types.is_floating(array.type) and not pc.all(pc.is_finite(array)).as_py():
        for arrow, vm in (("^nan$", "NaN"), ("^inf$", "Inf"), ("^-inf$", "-Inf")):
            text = pc.replace_substring_regex(text, arrow, vm)
    return text


def _metric_json(row: dict[str, Any], labels: list[str]) -> str:
    metric = {"__name__": row["metric"]}
    metric.update({k: row[k] for k in labels if row[k] not in (None, "")})
    return json.dumps(metric, ensure_ascii=False, separators=(",", ":"))


def import_lines(table: pa.Table) -> list[bytes]:
    """One ``/api/v1/import`` JSON line per series in ``table`` (long shape)."""
    labels = [name for name in table.column_names if name not in FIXED_COLUMNS]
    keys = ["metric", *labels]
    texts = table.select(keys).append_column("t", _exact_strings(table["timestamp"]))
    texts = texts.append_column("v", _exact_strings(table["value"]))
    grouped = texts.group_by(keys, use_threads=False).aggregate([("t", "list"), ("v", "list")])
    values = pc.binary_join(grouped["v_list"], ",")
    stamps = pc.binary_join(grouped["t_list"], ",")
    heads = pa.array([_metric_json(row, labels) for row in grouped.select(keys).to_pylist()])
    lines = pc.binary_join_element_wise(
        '{"metric":', heads, ',"values":[', values, '],"timestamps":[', stamps, "]}", ""
    )
    return [line.encode() for line in lines.to_pylist()]


def import_bodies(table: pa.Table) -> Iterator[bytes]:
    """Request bodies of at most about MAX_BODY_BYTES each."""
    for start in range(0, table.num_rows, MAX_ROWS_PER_IMPORT_SLICE):
        body: list[bytes] = []
        size = 0
        for line in import_lines(table.slice(start, MAX_ROWS_PER_IMPORT_SLICE)):
            if body and size + len(line) > MAX_BODY_BYTES:
                yield b"\n".join(body)
                body, size = [], 0
            body.append(line)
            size += len(line) + 1
        if body:
            yield b"\n".join(body)


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmSizes:
    data_bytes: int  # data/ : small + big parts of samples
    indexdb_bytes: int  # indexdb/ : series index
    total_bytes: int  # the whole -storageDataPath


class VictoriaMetricsError(RuntimeError):
    pass


class VictoriaMetrics:
    """A VictoriaMetrics process of our own: start, load, flush/merge, measure, query, stop."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.data_dir = workdir / "victoria-metrics-data"
        self.log_path = workdir / "victoria-metrics.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._conn: http.client.HTTPConnection | None = None

    # -- lifecycle --

    def __enter__(self) -> VictoriaMetrics:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 30.0) -> None:
        self.port = free_port()
        args = [
            self.binary,
            f"-storageDataPath={self.data_dir}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=1s",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise VictoriaMetricsError(f"victoria-metrics exited:\n{self.log_tail()}")
            try:
                if self._request("GET", "/health")[0] == 200:
                    return
            except OSError:
                self._reset_connection()
            time.sleep(0.1)
        raise VictoriaMetricsError(
            f"victoria-metrics not healthy in {timeout_s} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        self._reset_connection()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- HTTP on one keep-alive connection --

    def _reset_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _request(
        self, method: str, path: str, body: bytes | None = None, timeout_s: float = 600.0
    ) -> tuple[int, bytes]:
        fresh = self._conn is None
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            self._conn.request(method, path, body=body)
            response = self._conn.getresponse()
            return response.status, response.read()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # VictoriaMetrics closes a keep-alive connection left idle (a loaded machine
            # between two imports): once more on a new one
            self._reset_connection()
            if fresh:
                raise
            return self._request(method, path, body, timeout_s)
        except (OSError, http.client.HTTPException):
            self._reset_connection()
            raise

    def _get_ok(self, path: str) -> bytes:
        status, payload = self._request("GET", path)
        if status != 200:
            raise VictoriaMetricsError(f"GET {path} -> {status}: {payload[:500]!r}")
        return payload

    # -- load and measure --

    def ingest(self, table: pa.Table) -> tuple[float, float]:
        """Import a long-shape table; returns (seconds formatting, seconds in POST requests)."""
        format_s = post_s = 0.0
        bodies = import_bodies(table)
        while True:
            started = time.perf_counter()
            body = next(bodies, None)
            posted = time.perf_counter()
            format_s += posted - started
            if body is None:
                return format_s, post_s
            status, payload = self._request("POST", "/api/v1/import", body)
            if status not in (200, 204):
                raise VictoriaMetricsError(f"/api/v1/import -> {status}: {payload[:500]!r}")
            post_s += time.perf_counter() - posted

    def force_flush(self) -> None:
        self._get_ok("/internal/force_flush")

    def force_merge_and_wait(self, max_rounds: int = 5, timeout_s: float = 3600.0) -> float:
        """Force-merge until a round changes no part; returns seconds (with settle polling).

        A forced merge skips parts that a background merge holds, so one round can leave
        several parts per partition; the next round merges those.
        """
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        before: object = None
        for _ in range(max_rounds):
            self._get_ok("/internal/force_merge")
            after = self._wait_settled(deadline)
            if after == before:
                break
            before = after
        return time.perf_counter() - started

    def _wait_settled(self, deadline: float) -> object:
        """Wait until no merge runs, no rows are pending and the files stop changing."""
        previous: object = None
        stable = 0
        while stable < MERGE_STABLE_POLLS:
            if time.monotonic() > deadline:
                raise VictoriaMetricsError("force_merge did not settle before the deadline")
            time.sleep(MERGE_POLL_S)
            current = (self._part_listing(), self._busy())
            stable = stable + 1 if current == previous and not current[1] else 0
            previous = current
        return previous

    def _part_listing(self) -> tuple[tuple[str, int], ...]:
        found = []
        for sub in ("data", "indexdb"):
            for root, _dirs, files in os.walk(self.data_dir / sub):
                found += [
                    (os.path.join(root, f), os.path.getsize(os.path.join(root, f))) for f in files
                ]
        return tuple(sorted(found))

    def _busy(self) -> bool:
        """Whether /metrics shows merges running or rows not yet in parts."""
        text = self._get_ok("/metrics").decode()
        for line in text.splitlines():
            if line.startswith(("vm_active_merges{", "vm_pending_rows{")) and float(
                line.rsplit(" ", 1)[1]
            ):
                return True
        return False

    def sizes(self) -> VmSizes:
        return VmSizes(
            data_bytes=dir_bytes(self.data_dir / "data"),
            indexdb_bytes=dir_bytes(self.data_dir / "indexdb"),
            total_bytes=dir_bytes(self.data_dir),
        )

    # -- query --

    def _query(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        payload = self._get_ok(f"{path}?{urlencode({**params, 'nocache': '1'})}")
        answer = json.loads(payload)
        if answer.get("status") != "success":
            raise VictoriaMetricsError(f"{path} {params}: {answer}")
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def instant(self, expr: str, at_ms: int) -> int:
        """Runs an instant query; returns the number of result series."""
        return len(self._query("/api/v1/query", {"query": expr, "time": _seconds(at_ms)}))

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> int:
        """Runs a range query (rollup cache off); returns the number of result points."""
        params = {
            "query": expr,
            "start": _seconds(start_ms),
            "end": _seconds(end_ms),
            "step": f"{step_ms}ms",
        }
        return sum(len(series["values"]) for series in self._query("/api/v1/query_range", params))

    def series_count(self) -> int:
        answer = json.loads(self._get_ok("/api/v1/series/count"))
        return int(answer["data"][0])

    def export(self, selector: str) -> tuple[np.ndarray, np.ndarray]:
        """All raw samples of the matching series (timestamps ms, values), sorted by time."""
        payload = self._get_ok(f"/api/v1/export?{urlencode({'match[]': selector})}")
        ts: list[int] = []
        values: list[float] = []
        for line in payload.splitlines():
            row = json.loads(line)
            ts += row["timestamps"]
            values += [float(v) for v in row["values"]]
        order = np.argsort(np.asarray(ts, np.int64), kind="stable")
        return np.asarray(ts, np.int64)[order], np.asarray(values, np.float64)[order]


def _seconds(ms: int) -> str:
    return f"{ms // 1000}.{ms % 1000:03d}"
