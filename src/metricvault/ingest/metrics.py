"""The gateway's own metrics, exposed at ``/metrics`` in Prometheus text format."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

# The *_created companion series only add noise to a scrape of the gateway.
disable_created_metrics()  # type: ignore[no-untyped-call]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.received = Counter(
            "metricvault_samples_received",
            "Samples decoded from write requests",
            ["protocol"],
            registry=r,
        )
        self.stored = Counter(
            "metricvault_samples_stored",
            "Samples acknowledged (durable in the buffer)",
            ["protocol"],
            registry=r,
        )
        self.dropped = Counter(
            "metricvault_samples_dropped",
            "Samples received but not stored, by reason (stale markers, non-finite, histograms)",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "metricvault_requests_rejected", "Requests refused, by reason", ["reason"], registry=r
        )
        self.duration = Histogram(
            "metricvault_request_duration_seconds",
            "Write request latency",
            ["endpoint"],
            registry=r,
        )
        self.flush = Histogram(
            "metricvault_flush_duration_seconds", "Time to flush the buffer to Parquet", registry=r
        )
        self.buffer_samples = Gauge(
            "metricvault_buffer_samples", "Samples waiting in the ingest buffer", registry=r
        )
        self.buffer_bytes = Gauge(
            "metricvault_buffer_bytes", "Bytes waiting in the ingest buffer", registry=r
        )
        self.series = Gauge("metricvault_series", "Series known to the vault", registry=r)
