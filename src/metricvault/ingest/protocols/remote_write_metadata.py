"""Remote-write metadata: metric types, units and help, and the kinds (counter or gauge) they
give the series: 1.0 sends per-family entries, 2.0 a per-series message."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from metricvault.errors import LabelError
from metricvault.ingest.protocols.remote_write_checks import METRIC_NAME, _Invalid, show
from metricvault.model import METRIC_NAME_PATTERN
from metricvault.wire.proto import messages

_METRIC_TYPES = (
    "unknown",
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
)


@dataclass(frozen=True)
class MetricMetadata:
    """Type, unit and help of one metric family, as the sender described it."""

    metric: str
    type: str  # counter, gauge, histogram, gaugehistogram, summary, info, stateset, unknown
    unit: str
    help: str


def metadata_v1(entries: Any) -> Iterable[MetricMetadata]:
    for index, entry in enumerate(entries):
        name = entry.metric_family_name
        if METRIC_NAME.fullmatch(name) is None:
            raise LabelError(
                f"metadata entry #{index}: metric family name {show(name)} is invalid; names "
                f"must match {METRIC_NAME_PATTERN}: fix the sender's metadata"
            )
        yield MetricMetadata(name, metric_type(entry.type), entry.unit, entry.help)


def kinds_v1(metadata: Iterable[MetricMetadata]) -> dict[str, str]:
    """Kinds of the series a family's samples arrive under (text format and OpenMetrics)."""
    kinds: dict[str, str] = {}
    for entry in metadata:
        family, kind = entry.metric, entry.type
        if kind == "counter":
            names = {family: "counter"}
            if not family.endswith("_total"):  # OpenMetrics names the family without _total
                names[f"{family}_total"] = "counter"
        elif kind == "histogram":
            names = {f"{family}{suffix}": "counter" for suffix in ("_bucket", "_count", "_sum")}
        elif kind == "summary":
            names = {family: "gauge", f"{family}_count": "counter", f"{family}_sum": "counter"}
        elif kind == "gaugehistogram":
            names = {f"{family}{suffix}": "gauge" for suffix in ("_bucket", "_gcount", "_gsum")}
        elif kind == "info":
            names = {family: "gauge", f"{family}_info": "gauge"}
        elif kind in ("gauge", "stateset"):
            names = {family: "gauge"}
        else:  # unknown: says nothing about the kind (the series' name decides, model.py)
            continue
        for name, name_kind in names.items():
            kinds.setdefault(name, name_kind)  # the first description of a name wins
    return kinds


def metadata_v2(
    all_series: Any, metrics: Any, symbols: list[str]
) -> tuple[tuple[MetricMetadata, ...], dict[str, str]]:
    described: dict[tuple[str, bytes], None] = {}
    for metric, entry in zip(metrics.to_pylist(), [s.metadata for s in all_series], strict=True):
        if entry:
            described.setdefault((metric, entry), None)
    entries: dict[MetricMetadata, None] = {}
    kinds: dict[str, str] = {}
    for metric, encoded in described:
        try:
            entry = messages.Metadata.FromString(encoded)
        except messages.DecodeError as exc:
            raise _Invalid from exc
        if entry.help_ref >= len(symbols) or entry.unit_ref >= len(symbols):
            raise _Invalid
        kind, help_text, unit = (
            metric_type(entry.type),
            symbols[entry.help_ref],
            symbols[entry.unit_ref],
        )
        if entry.type == 0 and not help_text and not unit:
            continue  # "unspecified" and nothing else: no metadata was sent
        entries.setdefault(MetricMetadata(metric, kind, unit, help_text), None)
        if entry.type and kind != "unknown":  # unknown says nothing about the kind
            kinds.setdefault(metric, _kind_of_series(metric, kind))
    return tuple(entries), kinds


def _kind_of_series(metric: str, kind: str) -> str:
    """2.0 metadata describes the series itself (``foo_bucket``), not its family (``foo``)."""
    if kind in ("counter", "histogram"):
        return "counter"
    if kind == "summary" and metric.endswith(("_count", "_sum")):
        return "counter"
    return "gauge"


def metric_type(number: int) -> str:
    return _METRIC_TYPES[number] if 0 <= number < len(_METRIC_TYPES) else "unknown"
