"""The data model: series, labels, series ids, metric kinds and Arrow schemas.

A series is a metric name plus a label set. Its canonical form sorts labels by name, and its
``series_id`` is the first 8 bytes of BLAKE2b over the canonical form, read as a signed int64
(Arrow and Parquet have no unsigned 64-bit type that every engine reads). Two different label
sets with one id are detected by the series index and refused, never merged.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from metricvault.errors import LabelError

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_LABEL_VALUE_BYTES = 4096
MAX_LABELS = 64
# Control characters refused in label values: Unicode category Cc (C0, DEL, C1) except tab,
# line feed and carriage return, which real text (and Prometheus' text format, escaped) holds.
# Prometheus itself only requires valid UTF-8; we refuse these because no sender means them
# (they come from binary data or bugs), and they make values unreadable in every UI.
CONTROL_CHARACTERS_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Columns of the long shape that are not labels; a label may not take one of these names.
RESERVED_COLUMNS = frozenset({"metric", "timestamp", "value", "ts"})

Kind = Literal["gauge", "counter"]
KINDS: tuple[Kind, ...] = ("gauge", "counter")

# dcgm-exporter fields that are cumulative counters although their names do not say so.
DCGM_COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    }
)
COUNTER_SUFFIXES = ("_total", "_count", "_bucket", "_sum", "_created")


def kind_from_name(metric: str) -> Kind:
    """Guess a metric's kind from its name when no exposition metadata says otherwise."""
    if metric in DCGM_COUNTERS or metric.endswith(COUNTER_SUFFIXES):
        return "counter"
    return "gauge"


def validate_metric_name(metric: str) -> None:
    if not isinstance(metric, str) or not METRIC_NAME_RE.match(metric):
        raise LabelError(
            f"invalid metric name {metric!r}: names must match [a-zA-Z_:][a-zA-Z0-9_:]* "
            "(Prometheus data model); rename the metric, e.g. replace '-' and '.' with '_'"
        )


def validate_labels(labels: Mapping[str, str], metric: str = "") -> dict[str, str]:
    """Check label names and values; return the labels with empty values dropped.

    An empty label value means "label absent" (Prometheus semantics), so it is removed.
    """
    if len(labels) > MAX_LABELS:
        raise LabelError(
            f"series {metric!r} has {len(labels)} labels; the limit is {MAX_LABELS}: "
            "drop high-cardinality or redundant labels before sending"
        )
    clean: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not LABEL_NAME_RE.match(name) or name.startswith("__"):
            raise LabelError(
                f"invalid label name {name!r} on metric {metric!r}: names must match "
                "[a-zA-Z_][a-zA-Z0-9_]* and must not start with '__' (reserved)"
            )
        if name in RESERVED_COLUMNS:
            raise LabelError(
                f"label name {name!r} on metric {metric!r} is reserved for a column of the "
                f"long table shape ({', '.join(sorted(RESERVED_COLUMNS))}); rename the label"
            )
        if value is None:
            continue
        if not isinstance(value, str):
            raise LabelError(
                f"label {name!r} on metric {metric!r} has a {type(value).__name__} value "
                f"{value!r}; label values must be strings"
            )
        control = CONTROL_CHARACTERS_RE.search(value)
        if control:
            raise LabelError(
                f"series {_shown(metric, labels)}: label {name!r} contains the control "
                f"character U+{ord(control.group()):04X} at position {control.start()}; label "
                "values are text and may not hold control characters other than tab, LF and "
                "CR: remove it (or escape binary data, e.g. as hex)"
            )
        if len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_VALUE_BYTES:
            raise LabelError(
                f"label {name!r} on metric {metric!r} is {len(value.encode())} bytes long; the "
                f"limit is {MAX_LABEL_VALUE_BYTES} bytes: do not put free text into labels"
            )
        if value:
            clean[name] = value
    return clean


def _shown(metric: str, labels: Mapping[str, str]) -> str:
    """The series as PromQL shows it, values escaped, for error messages."""
    inner = ",".join(f"{k}={json.dumps(str(v)[:60])}" for k, v in labels.items() if v)
    return f"{metric}{{{inner}}}"


@dataclass(frozen=True, slots=True)
class Series:
    """A metric name plus its (validated, sorted) labels."""

    metric: str
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, metric: str, labels: Mapping[str, str] | None = None) -> Series:
        validate_metric_name(metric)
        clean = validate_labels(labels or {}, metric)
        return cls(metric, tuple(sorted(clean.items())))

    @property
    def canonical(self) -> str:
        """``metric{a="x",b="y"}`` with labels sorted and values JSON-escaped."""
        inner = ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in self.labels)
        return f"{self.metric}{{{inner}}}"

    @property
    def series_id(self) -> int:
        return series_id_of(self.canonical)

    @property
    def labels_json(self) -> str:
        return json.dumps(dict(self.labels), sort_keys=True, ensure_ascii=False)

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


def series_id_of(canonical: str) -> int:
    digest = hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


# Timestamps outside MIN_TS_MS .. MAX_TS_MS (durations.py) are refused as absurd.


SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("series_id", pa.int64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)

SERIES_SCHEMA = pa.schema(
    [
        pa.field("series_id", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("labels", pa.string(), nullable=False),  # canonical JSON object
        pa.field("kind", pa.string(), nullable=False),
    ]
)

TIERS = ("raw", "1m", "1h")  # finest first; rollup tiers are named by their resolution
AGGREGATES = ("mean", "min", "max", "count", "sum", "last", "increase")
