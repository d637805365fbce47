"""State the gateway keeps per OTLP stream: running totals of DELTA streams, and the start
times of cumulative streams already given their zero sample.

DELTA -> cumulative: each DELTA sum or histogram point is added to its stream's total, keyed
by (tenant, Prometheus metric name, labels); the sample stored is the total at the point's
time. Limits, by design (documented in docs/gateway.md):

- the state lives in one gateway worker's memory: with ``gateway_workers > 1`` each worker
  adds up the deltas it receives, so a stream must reach one worker (one exporter's keep-alive
  connection does); it is lost on restart, and the next delta starts the total again from
  that delta, which PromQL reads as a counter reset (``rate``/``increase`` stay right);
- a point at or before the stream's last time is refused (a resend of a counted delta, or out
  of order), counted in ``partial_success``;
- explicit histogram bounds that change, or an exponential histogram's zero threshold, start
  the total again; so does a NO_RECORDED_VALUE point (stored as a staleness marker);
- at most :data:`MAX_STREAMS` streams per worker: the least recently updated is forgotten.

Nothing changes until :meth:`Pending.commit`, called once the request is stored, so a refused
request (429, 503) can be sent again and counts once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from metricvault.ingest.protocols.otlp_points import (
    HISTOGRAM,
    STALE_NAN,
    DeltaPoint,
    Hist,
    Labels,
    Points,
    hist_rows,
)

MAX_STREAMS = 500_000
Key = tuple[str, str, Labels]  # tenant, base metric name, labels


@dataclass
class Total:
    start_ns: int
    last_ns: int
    value: float | Hist


@dataclass
class Pending:
    """The rows one request adds, and the state it changes once stored."""

    streams: OtlpStreams
    totals: dict[Key, Total | None] = field(default_factory=dict)  # None: forget the stream
    starts: dict[Key, int] = field(default_factory=dict)

    def commit(self) -> None:
        self.streams.commit(self)


class OtlpStreams:
    def __init__(self, max_streams: int = MAX_STREAMS) -> None:
        self.max_streams = max_streams
        self.totals: OrderedDict[Key, Total] = OrderedDict()
        self.starts: OrderedDict[Key, int] = OrderedDict()
        self.lock = threading.Lock()

    def apply(self, points: Points, tenant: str, min_ms: int = 0) -> Pending:
        """Add the request's delta totals and new zero samples to ``points``' rows (in
        place); what to remember is returned, to commit after the request is stored."""
        pending = Pending(self)
        with self.lock:
            self._zero_samples(points, tenant, min_ms, pending)
            for number, delta in enumerate(points.deltas):
                self._add(points, tenant, number, delta, pending)
        return pending

    def _zero_samples(self, points: Points, tenant: str, min_ms: int, pending: Pending) -> None:
        for start in points.starts:
            key = (tenant, *start.key)
            if self.starts.get(key) == start.start_ns or pending.starts.get(key) == start.start_ns:
                continue
            pending.starts[key] = start.start_ns
            if start.start_ns // 1_000_000 < min_ms:
                continue  # before the raw horizon: too old to write, and long since reset
            for metric, labels in start.rows:
                points.add(metric, labels, start.start_ns // 1_000_000, 0.0)

    def _add(
        self, points: Points, tenant: str, number: int, delta: DeltaPoint, pending: Pending
    ) -> None:
        key = (tenant, *delta.key)
        known = pending.totals[key] if key in pending.totals else self.totals.get(key)
        base, labels = delta.key
        ts_ms = delta.time_ns // 1_000_000
        if delta.value is None:  # NO_RECORDED_VALUE: the stream ends
            pending.totals[key] = None
            self._rows(points, base, labels, ts_ms, delta, None)
            return
        if known is not None and delta.time_ns <= known.last_ns:
            points.reject(
                1,
                f"DELTA point of {base}{_shown(labels)} at time_unix_nano {delta.time_ns} is not "
                f"after the last one added up ({known.last_ns}): a resend of a counted delta, "
                "or out of order; it was not added again",
            )
            return
        if known is None or not _same_layout(known.value, delta.value):
            total = Total(delta.start_ns or delta.time_ns, delta.time_ns, delta.value)
        elif isinstance(known.value, Hist) and isinstance(delta.value, Hist):
            total = Total(known.start_ns, delta.time_ns, known.value.plus(delta.value))
        else:
            assert isinstance(known.value, float) and isinstance(delta.value, float)
            total = Total(known.start_ns, delta.time_ns, known.value + delta.value)
        pending.totals[key] = total
        self._rows(points, base, labels, ts_ms, delta, total.value)

    @staticmethod
    def _rows(
        points: Points,
        base: str,
        labels: Labels,
        ts_ms: int,
        delta: DeltaPoint,
        value: float | Hist | None,
    ) -> None:
        if delta.kind != HISTOGRAM:
            points.add(base, labels, ts_ms, STALE_NAN if value is None else float(value))  # type: ignore[arg-type]
            return
        hist = value if isinstance(value, Hist) else Hist(0, None, {}, ())
        for metric, row_labels, row_value in hist_rows(base, labels, hist):
            points.add(metric, row_labels, ts_ms, STALE_NAN if value is None else row_value)

    def commit(self, pending: Pending) -> None:
        with self.lock:
            for key, total in pending.totals.items():
                if total is None:
                    self.totals.pop(key, None)
                else:
                    self.totals[key] = total
                    self.totals.move_to_end(key)
            for key, start in pending.starts.items():
                self.starts[key] = start
                self.starts.move_to_end(key)
            for table in (self.totals, self.starts):
                while len(table) > self.max_streams:
                    table.popitem(last=False)


def _same_layout(known: Any, new: Any) -> bool:
    if isinstance(known, Hist) and isinstance(new, Hist):
        return known.layout == new.layout
    return isinstance(known, float) and isinstance(new, float)


def _shown(labels: Labels) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in labels) + "}"
