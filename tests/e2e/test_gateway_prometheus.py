"""End-to-end: an unmodified Prometheus remote-writes into ``metricvault serve`` (issue 3, test 1).

Debian's ``prometheus`` scrapes a test exporter (served from this process), itself and the
gateway every second and remote-writes everything into the gateway for ~20 s. The oracle is
Prometheus itself: for every series of those jobs, the samples the vault holds over a window
``(t0, t1]`` must equal, timestamp for timestamp and bit for bit, what Prometheus's own
``/api/v1/query`` returns for a range selector at ``t1``.

The exporter's hand-written exposition covers what the gateway has to get right:

- a counter named without ``_total`` (only the metadata Prometheus sends says it is a counter)
  and a gauge named like a counter (``_total``; the metadata says gauge);
- a labelled gauge one of whose series disappears halfway (Prometheus then sends a staleness
  marker, which must be dropped, not stored as NaN);
- a classic histogram, label values that need escaping and non-ASCII text, floats that need
  all 17 digits and ones with two decimals.
"""

from __future__ import annotations

import http.server
import math
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from metricvault.store.vault import Vault

from .conftest import GatewayProcess, PrometheusServer, http_get, metric_sum, parse_exposition

pytestmark = pytest.mark.e2e

EXPORTER_JOB = "mv-e2e-exporter"
SELF_JOB = "prometheus"
GATEWAY_JOB = "metricvault-gateway"
JOBS = (EXPORTER_JOB, SELF_JOB, GATEWAY_JOB)
RUN_S = 16.0  # of scraping and remote-writing, from the first scrape on
DROP_GPU_AFTER_S = 7.0  # then gpu="3" vanishes from the exporter: a staleness marker follows
FIRST_SCRAPE_WAIT_S = 15.0  # Prometheus applies its scrape config ~5 s after start
TAIL_MS = 2_000  # the newest samples are left out of the comparison (they may be in flight)
SEND_WAIT_S = 20.0
# label values that text exposition has to escape, and non-ASCII text
PATHS = ("/api/v1/write", 'a "quoted", spaced\\path\nnext', "héllo→wörld")
BUCKETS = (0.005, 0.05, 0.5, 5.0)

# metric -> the kind the vault must store: from the metadata Prometheus sends, which is the
# only source for the first two (their names say the opposite)
EXPECTED_KINDS = {
    "mv_e2e_work_units": "counter",
    "mv_e2e_queue_total": "gauge",
    "mv_e2e_requests_total": "counter",
    "mv_e2e_temperature_celsius": "gauge",
    "mv_e2e_latency_seconds_bucket": "counter",
    "mv_e2e_latency_seconds_count": "counter",
    "mv_e2e_latency_seconds_sum": "counter",
}


# --------------------------------------------------------------------------- the exporter
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exporter:
    """Text exposition (format 0.0.4) whose values move on every scrape."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.scrapes = 0
        self.gpus = ["0", "1", "2", "3"]
        self.requests = dict.fromkeys(PATHS, 0)
        self.work = 0.0
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.latency_sum = 0.0

    def drop_gpu(self, gpu: str) -> None:
        with self.lock:
            self.gpus.remove(gpu)

    def render(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            return "".join(self._families()).encode()

    def _families(self) -> Iterator[str]:
        rng = self.rng
        for path in PATHS:
            self.requests[path] += rng.randint(0, 5)
        self.work += rng.random() * 10  # full 53-bit floats
        for _ in range(rng.randint(0, 4)):
            latency = rng.expovariate(10)
            self.latency_sum += latency
            for i, bound in enumerate((*BUCKETS, math.inf)):
                self.buckets[i] += latency <= bound
        yield "# HELP mv_e2e_requests_total Requests served.\n"
        yield "# TYPE mv_e2e_requests_total counter\n"
        for path in PATHS:
            labels = f'code="200",path="{_escape(path)}"'
            yield f"mv_e2e_requests_total{{{labels}}} {self.requests[path]}\n"
        yield "# HELP mv_e2e_work_units Work done; a counter whose name does not say so.\n"
        yield "# TYPE mv_e2e_work_units counter\n"
        yield f"mv_e2e_work_units {self.work!r}\n"
        yield "# HELP mv_e2e_queue_total Items queued now; a gauge named like a counter.\n"
        yield "# TYPE mv_e2e_queue_total gauge\n"
        yield f"mv_e2e_queue_total {rng.randint(0, 40)}\n"
        yield "# HELP mv_e2e_temperature_celsius GPU temperature.\n"
        yield "# TYPE mv_e2e_temperature_celsius gauge\n"
        for gpu in self.gpus:
            value = rng.uniform(30, 90) if gpu != "0" else rng.randint(3000, 9000) / 100
            yield f'mv_e2e_temperature_celsius{{gpu="{gpu}"}} {value!r}\n'
        yield "# HELP mv_e2e_latency_seconds Request latency.\n"
        yield "# TYPE mv_e2e_latency_seconds histogram\n"
        for le, count in zip((*BUCKETS, "+Inf"), self.buckets, strict=True):
            yield f'mv_e2e_latency_seconds_bucket{{le="{le}"}} {count}\n'
        yield f"mv_e2e_latency_seconds_sum {self.latency_sum!r}\n"
        yield f"mv_e2e_latency_seconds_count {self.buckets[-1]}\n"


@pytest.fixture
def exporter() -> Iterator[tuple[Exporter, str]]:
    """The exporter on a free loopback port: ``(exporter, "127.0.0.1:PORT")``."""
    state = Exporter(seed=20260301)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="exporter", daemon=True)
    thread.start()
    try:
        yield state, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------- helpers
SeriesKey = tuple[tuple[str, str], ...]  # sorted (label, value) pairs, __name__ included
Samples = dict[SeriesKey, list[tuple[int, float | str]]]  # NaN as "NaN": NaN != NaN


def prometheus_samples(prom: PrometheusServer, t0_ms: int, t1_ms: int) -> tuple[Samples, int]:
    """Every sample of JOBS in ``(t0, t1]`` from Prometheus's own TSDB (NaN as the string
    "NaN", so that it compares equal; the API never shows staleness markers), and how many
    NaN/±Inf samples there were (Prometheus's own summaries report NaN quantiles while they
    have no observations); the vault stores them too (issue 13)."""
    seconds = -(-(t1_ms - t0_ms) // 1000) + 1
    jobs = "|".join(JOBS)
    data = prom.api(
        "query", query=f'{{__name__=~".+",job=~"{jobs}"}}[{seconds}s]', time=f"{t1_ms / 1000:.3f}"
    )
    assert data["resultType"] == "matrix", data["resultType"]
    out: Samples = {}
    non_finite = 0
    for series in data["result"]:
        key = tuple(sorted(series["metric"].items()))
        points = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        points = [(t, v) for t, v in points if t0_ms < t <= t1_ms]
        non_finite += sum(1 for _, v in points if not math.isfinite(v))
        if points:
            out[key] = [(t, _comparable(v)) for t, v in points]
    return out, non_finite


def _comparable(value: float) -> float | str:
    return "NaN" if math.isnan(value) else value


def vault_samples(vault: Vault, t0_ms: int, t1_ms: int) -> Samples:
    jobs = "|".join(JOBS)
    table = vault.query(f'{{job=~"{jobs}"}}', t0_ms + 1, t1_ms + 1, output="arrow")
    label_names = [c for c in table.column_names if c not in ("timestamp", "metric", "value")]
    ts = table["timestamp"].cast(pa.int64()).to_pylist()
    values = table["value"].to_pylist()
    metrics = table["metric"].to_pylist()
    labels = {name: table[name].to_pylist() for name in label_names}
    out: Samples = {}
    for row, (t, v, metric) in enumerate(zip(ts, values, metrics, strict=True)):
        pairs = [("__name__", metric)]
        pairs += [(n, labels[n][row]) for n in label_names if labels[n][row] is not None]
        out.setdefault(tuple(sorted(pairs)), []).append((t, _comparable(v)))
    return out


def describe_differences(expected: Samples, actual: Samples, limit: int = 8) -> str:
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    lines = [
        f"{len(expected)} series in Prometheus, {len(actual)} in the vault; "
        f"{len(missing)} missing from the vault, {len(extra)} only in the vault"
    ]
    lines += [f"  missing: {dict(k)} ({len(expected[k])} samples)" for k in missing[:limit]]
    lines += [f"  extra: {dict(k)} ({len(actual[k])} samples)" for k in extra[:limit]]
    differing = [k for k in sorted(set(expected) & set(actual)) if expected[k] != actual[k]]
    lines.append(f"{len(differing)} series with different samples")
    for key in differing[:limit]:
        want, got = dict(expected[key]), dict(actual[key])
        only_p = sorted(set(want) - set(got))
        only_v = sorted(set(got) - set(want))
        changed = [(t, want[t], got[t]) for t in sorted(set(want) & set(got)) if want[t] != got[t]]
        lines.append(
            f"  {dict(key)}: {len(want)} vs {len(got)} samples; timestamps only in Prometheus "
            f"{only_p[:5]}, only in the vault {only_v[:5]}; values (ts, prometheus, vault) "
            f"{changed[:3]}; duplicates in the vault: {len(actual[key]) - len(got)}"
        )
    return "\n".join(lines)


def wait_sent_until(prom: PrometheusServer, t_ms: int) -> None:
    """Wait (bounded) until Prometheus says it has sent samples newer than ``t_ms``."""
    name = "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"
    deadline = time.monotonic() + SEND_WAIT_S
    while time.monotonic() < deadline:
        if metric_sum(prom.self_metrics(), name) * 1000 >= t_ms:
            return
        time.sleep(0.2)
    pytest.fail(
        f"Prometheus did not send samples past {t_ms} ms within {SEND_WAIT_S:.0f} s (is the "
        f"gateway refusing them?); its remote-write metrics:\n{prom.remote_storage_report()}\n"
        f"its log:\n{prom.log_tail()}"
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- the test
def test_prometheus_remote_write_equals_prometheus_tsdb(
    gateway: Any, prometheus: Any, exporter: tuple[Exporter, str]
) -> None:
    state, target = exporter
    gw: GatewayProcess = gateway()
    started_ms = now_ms()
    prom: PrometheusServer = prometheus(
        f"{gw.url}/api/v1/write",
        {EXPORTER_JOB: [target], GATEWAY_JOB: [f"127.0.0.1:{gw.port}"]},
        self_job=SELF_JOB,
    )
    deadline = time.monotonic() + FIRST_SCRAPE_WAIT_S
    while state.scrapes == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state.scrapes, f"Prometheus never scraped the exporter:\n{prom.log_tail()}"
    time.sleep(DROP_GPU_AFTER_S)
    state.drop_gpu("3")
    time.sleep(RUN_S - DROP_GPU_AFTER_S)
    assert state.scrapes >= RUN_S / 2, f"Prometheus scraped the exporter {state.scrapes} times"

    t1 = now_ms() - TAIL_MS
    wait_sent_until(prom, t1 + 1_000)
    expected, non_finite = prometheus_samples(prom, started_ms, t1)
    report = prom.remote_storage_report()
    gateway_metrics = parse_exposition(http_get(f"{gw.url}/metrics")[1].decode())
    assert prom.stop() == 0, f"prometheus did not stop cleanly:\n{prom.log_tail()}"
    gw.stop_gracefully()

    with Vault.open_local(str(gw.data_dir), create=False) as vault:
        # SIGTERM flushed: nothing is left in the ingest buffer for this reader to flush
        assert vault.buffer.depth()[0] == 0, f"SIGTERM left {vault.buffer.depth()} buffered"
        actual = vault_samples(vault, started_ms, t1)
        jobs = "|".join(JOBS)
        with_markers = vault.query(
            f'{{job=~"{jobs}"}}', started_ms + 1, t1 + 1, output="arrow", stale_markers=True
        )
        series = vault.series(output="arrow").to_pandas()

    context = (
        f"\nPrometheus remote-write metrics:\n{report}\nPrometheus log:\n{prom.log_tail(3000)}"
        f"\ngateway log:\n{gw.log_tail(3000)}"
    )
    exporter_series = {k: len(v) for k, v in expected.items() if ("job", EXPORTER_JOB) in k}
    assert len(exporter_series) >= 15, f"Prometheus holds too little: {exporter_series}"
    assert min(exporter_series.values()) >= DROP_GPU_AFTER_S - 2, exporter_series
    print(
        f"compared {len(expected)} series, {sum(map(len, expected.values()))} samples "
        f"({non_finite} NaN included) over {(t1 - started_ms) / 1000:.1f} s"
    )
    assert expected == actual, describe_differences(expected, actual) + context

    # staleness markers: Prometheus sent some (gpu="3" vanished) and the vault stores them
    # (raw query leaves them out, stale_markers=True shows them); nothing is dropped
    bits = with_markers["value"].to_numpy(zero_copy_only=False).view(np.uint64)
    markers = with_markers.filter(pa.array(bits == np.uint64(0x7FF0000000000002)))
    assert markers.num_rows >= 1, f"the vault holds no staleness marker{context}"
    assert not any("metricvault_samples_dropped_total" in k for k in gateway_metrics), (
        gateway_metrics
    )
    gpu3 = actual[
        (
            ("__name__", "mv_e2e_temperature_celsius"),
            ("gpu", "3"),
            ("instance", target),
            ("job", EXPORTER_JOB),
        )
    ]
    assert gpu3[-1][0] < t1 - 5_000, "gpu 3 should have stopped well before the end"

    # metadata: the kind of each metric follows the TYPE Prometheus sent, not its name
    kinds = {
        metric: sorted(set(series.loc[series["metric"] == metric, "kind"]))
        for metric in EXPECTED_KINDS
    }
    assert kinds == {m: [k] for m, k in EXPECTED_KINDS.items()}, kinds


def test_exporter_values_cover_both_float_shapes() -> None:
    """The exporter really sends 17-digit floats and two-decimal ones (guards the test)."""
    text = Exporter(seed=1).render().decode()
    values = parse_exposition(text)
    temps = [v for k, v in values.items() if k.startswith("mv_e2e_temperature_celsius")]
    assert any(len(repr(v)) > 15 for v in temps), temps
    assert any(round(v, 2) == v for v in temps), temps
    assert np.isfinite(list(values.values())).all()
