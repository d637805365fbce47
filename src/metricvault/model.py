"""The data model: series, labels, series ids, metric kinds and Arrow schemas.

A series is a metric name plus a label set. Its canonical form sorts labels by name, and its
``series_id`` is the first 8 bytes of BLAKE2b over the canonical form, read as a signed int64
(Arrow and Parquet have no unsigned 64-bit type that every engine reads). Two different label
sets with one id are detected by the series index and refused, never merged.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Literal

from metricvault.errors import LabelError

try:  # hashlib.blake2b *is* _blake2.blake2b; but `import hashlib` loads OpenSSL's libcrypto,
    # ~3 MB of RSS in every process that imports metricvault (the edge agent's budget is 25 MB)
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

if TYPE_CHECKING:
    import pyarrow as pa

# The name rules below are the only copy: the decoders, ``normalize``, the agent's encoder and
# the CLI import them (separate copies drift apart, and then a name one accepts another refuses).
# This module imports no pyarrow
# (the Arrow schemas at the end are built on first use), so the agent can import the rules.
METRIC_NAME_PATTERN = "[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME_PATTERN = "[a-zA-Z_][a-zA-Z0-9_]*"
_METRIC_NAME_FULL = re.compile(METRIC_NAME_PATTERN)
_LABEL_NAME_FULL = re.compile(LABEL_NAME_PATTERN)
METRIC_NAME_LABEL = "__name__"  # the label that carries the metric name on the wire
MAX_LABEL_VALUE_BYTES = 4096
MAX_LABELS = 64
# Control characters refused in label values: Unicode category Cc (C0, DEL, C1) except tab,
# line feed and carriage return, which real text (and Prometheus' text format, escaped) holds.
# Prometheus itself only requires valid UTF-8; we refuse these because no sender means them
# (they come from binary data or bugs), and they make values unreadable in every UI.
CONTROL_CHARACTERS_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

TIERS = ("raw", "1m", "1h")  # finest first; rollup tiers are named by their resolution
# Bucket width of each rollup tier, coarsest first (the order the query layer tries them).
TIER_RESOLUTION_MS: dict[str, int] = {"1h": 3_600_000, "1m": 60_000}
AGGREGATES = (
    "mean", "min", "max", "count", "sum", "last", "increase", "stddev",
    "p50", "p90", "p95", "p99",
)  # fmt: skip
# Range functions the rollup rows answer only past the raw horizon, where nothing else is left
# (from each row's m2 and quantile sketch; within raw retention they read raw samples, so the
# answers there stay exactly Prometheus's).
PAST_HORIZON_FUNCTIONS = frozenset({"stddev_over_time", "stdvar_over_time", "quantile_over_time"})
# The quantiles among them, answered from each rollup row's quantile sketch (store/rollup.py).
QUANTILE_AGGREGATES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
# Label names that are column names of a table the store takes or hands back, beside the label
# columns: the long shape (metric, timestamp or ts, value, and one column per aggregate when
# queried with a step) and the series table (series_id, metric, kind). A label of such a name
# would be hidden by, or hide, the column: ``kind="prod"`` once showed as the series' kind.
# The aggregates added later (stddev and the quantiles) are not reserved: a sender whose series
# carry a ``p99`` label kept writing; a query asking for that aggregate over such series is
# refused instead (store/query.py shape), which loses nothing.
RESERVED_AGGREGATES = ("mean", "min", "max", "count", "sum", "last", "increase")
RESERVED_LABEL_NAMES = frozenset({"metric", "timestamp", "ts", "value", "series_id", "kind"}) | (
    frozenset(RESERVED_AGGREGATES)
)
RESERVED_COLUMNS = RESERVED_LABEL_NAMES  # the name earlier issues used
# Prometheus's staleness marker: the NaN with this exact bit pattern ends a series (a sample,
# not a value); stored as written, left out of raw query output and of rollups.
STALE_NAN_BITS = 0x7FF0000000000002
_MAX_SHOWN_NAME = 60


def shown_name(name: str) -> str:
    """A name quoted (JSON style, so control characters are visible) and clipped for messages."""
    suffix = f"...({len(name):,} chars)" if len(name) > _MAX_SHOWN_NAME else ""
    return json.dumps(name[:_MAX_SHOWN_NAME], ensure_ascii=False) + suffix


def is_metric_name(name: str) -> bool:
    return _METRIC_NAME_FULL.fullmatch(name) is not None


def is_label_name(name: str) -> bool:
    """The pattern alone, as PromQL checks a label name it is given (``__`` names allowed);
    :func:`label_name_problem` is the rule for names written to the vault."""
    return _LABEL_NAME_FULL.fullmatch(name) is not None


@lru_cache(maxsize=4096)
def label_name_problem(name: str) -> str | None:
    """Why ``name`` may not be a label name, or None when it may: the one rule of every path.

    ``__name__`` is refused too: where a wire format carries the metric name as that label, the
    decoder takes it out before asking. Cached: a handful of distinct names recur in every
    request (bounded, as a hostile sender can make up names without end).
    """
    if not isinstance(name, str) or _LABEL_NAME_FULL.fullmatch(name) is None:
        if not isinstance(name, str):
            return f"invalid label name {name!r}: label names are strings"
        if not name:
            return (
                f'invalid label name "": the name is empty; drop the label or give it a name '
                f"matching {LABEL_NAME_PATTERN}"
            )
        return (
            f"invalid label name {shown_name(name)}: label names must match "
            f"{LABEL_NAME_PATTERN} (Prometheus data model); rename it, e.g. replace other "
            "characters with '_'"
        )
    if name.startswith("__"):
        return (
            f"invalid label name {shown_name(name)}: names starting with '__' are reserved by "
            "Prometheus for internal use; rename the label (or drop it when relabelling)"
        )
    if name in RESERVED_LABEL_NAMES:
        return (
            f"invalid label name {shown_name(name)}: it is reserved, as metricvault's tables "
            f"have a column of that name ({', '.join(sorted(RESERVED_LABEL_NAMES))}) that the "
            f"label would shadow; rename it, e.g. to 'exported_{name}' (a relabel rule can)"
        )
    return None


def label_name_ok(name: str) -> bool:
    return label_name_problem(name) is None


def metric_name_problem(metric: str) -> str | None:
    """Why ``metric`` may not be a metric name, or None when it may."""
    if isinstance(metric, str) and _METRIC_NAME_FULL.fullmatch(metric) is not None:
        return None
    shown = shown_name(metric) if isinstance(metric, str) else repr(metric)
    return (
        f"invalid metric name {shown}: names must match {METRIC_NAME_PATTERN} "
        "(Prometheus data model); rename the metric, e.g. replace '-' and '.' with '_'"
    )


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


KindSource = Literal["metadata", "explicit", "repair"]


@dataclass(frozen=True)
class KindChange:
    """A metric's kind changed (or a change was refused): from ``old`` to ``new`` at ``at_ms``,
    because of exposition metadata, ``metricvault kind set`` or ``metricvault check
    --repair``. Applied changes are kept in the catalog (``Snapshot.kind_changes``)."""

    metric: str
    old: str
    new: str
    at_ms: int
    source: str  # a KindSource


@dataclass(frozen=True)
class KindUpdate:
    """What exposition metadata did to the metrics' kinds: the changes made and refused."""

    applied: tuple[KindChange, ...] = ()
    refused: tuple[KindChange, ...] = ()


def metadata_kind_update(
    kinds: Mapping[str, str],
    known: Mapping[str, str],
    explicit: frozenset[str] | set[str],
    at_ms: int,
) -> KindUpdate:
    """The changes exposition metadata (``kinds``: metric -> type) may make, given the kinds
    ``known`` from earlier metadata or operators and the metrics an operator set (``explicit``).

    A type that is not a kind (``unknown``, missing) says nothing, and a ``gauge`` never
    downgrades a counter that earlier metadata or an operator made, nor one of dcgm-exporter's
    counters (exporters that cannot say ``counter`` for them send ``unknown`` or ``gauge``, and
    re-kinding them would stop ``rate`` from reading their rollups); a counter guessed only
    from a ``_total``-like name yields to the exporter's ``gauge``. A kind an
    operator set is never changed by metadata. Refused changes are returned, not applied."""
    applied, refused = [], []
    for metric, proposed in kinds.items():
        if proposed not in KINDS:
            continue
        current = known.get(metric) or kind_from_name(metric)
        if proposed == current:
            continue
        change = KindChange(metric, current, proposed, at_ms, "metadata")
        if metric in explicit or (current == "counter" and _counter_known(metric, known)):
            refused.append(change)
        else:
            applied.append(change)
    return KindUpdate(tuple(applied), tuple(refused))


def _counter_known(metric: str, known: Mapping[str, str]) -> bool:
    """A counter that metadata's ``gauge`` may not downgrade: one earlier metadata or an
    operator made a counter, or one of dcgm-exporter's counters. A counter guessed only from
    a ``_total``-like name yields to the exporter's first word on it: a gauge named like a
    counter (``queue_total``) is a gauge."""
    return known.get(metric) == "counter" or metric in DCGM_COUNTERS


def explicit_metrics(changes: Iterable[KindChange]) -> frozenset[str]:
    """The metrics whose latest kind change (of ``changes``, oldest first) an operator made
    (``metricvault kind set``, ``check --repair``): metadata does not change those."""
    latest = {c.metric: c.source for c in changes}
    return frozenset(m for m, source in latest.items() if source != "metadata")


def admissible_write_kinds(kinds: Mapping[str, str], known: Mapping[str, str]) -> dict[str, str]:
    """``kinds`` (a write's, for the series it creates) without the ones metadata may not set
    (see :func:`metadata_kind_update`): a known kind stays the new series' kind."""
    out = {}
    for metric, proposed in kinds.items():
        current = known.get(metric)
        if current is not None:
            out[metric] = current
        elif proposed == "gauge" and metric in DCGM_COUNTERS:
            continue  # dcgm-exporter's counter stands
        else:
            out[metric] = proposed
    return out


def validate_metric_name(metric: str) -> None:
    problem = metric_name_problem(metric)
    if problem is not None:
        raise LabelError(problem)


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
        problem = label_name_problem(name)
        if problem is not None:
            raise LabelError(f"metric {metric!r}: {problem}")
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


class SeriesRows(list[tuple[int, str, str, str]]):
    """A batch's distinct series as (series_id, metric, labels_json, kind) rows, and ``keys``:
    per row, a number that stands for exactly that row in this process (the decoder's series
    cache gives them, never one for two rows), so a store can remember the rows it checked
    against its series table and skip them the next time."""

    __slots__ = ("keys",)
    keys: Any  # int64 numpy array, one per row


# SeriesRows keys: process-wide numbers, never given twice (each decoder cache, or each of its
# generations, takes a block of its own), so the store can remember the rows it checked.
_KEYS_LOCK = threading.Lock()
_NEXT_KEY = [0]


def series_key_block(size: int) -> int:
    """The first of ``size`` SeriesRows keys no one else is given."""
    with _KEYS_LOCK:
        first = _NEXT_KEY[0]
        _NEXT_KEY[0] += size
    return first


class DistinctSeriesRows(SeriesRows):
    """Rows whose series ids a decoder knows to be distinct (each row a different id), so the
    store need not look for two rows with one id (a collision, or one series twice)."""

    __slots__ = ()


def series_id_of(canonical: str) -> int:
    digest = blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


# Timestamps outside MIN_TS_MS .. MAX_TS_MS (durations.py) are refused as absurd.


@cache
def _arrow_schemas() -> dict[str, pa.Schema]:
    import pyarrow as pa

    return {
        "SAMPLE_SCHEMA": pa.schema(
            [
                pa.field("series_id", pa.int64(), nullable=False),
                pa.field("ts", pa.int64(), nullable=False),
                pa.field("value", pa.float64(), nullable=False),
            ]
        ),
        "SERIES_SCHEMA": pa.schema(
            [
                pa.field("series_id", pa.int64(), nullable=False),
                pa.field("metric", pa.string(), nullable=False),
                pa.field("labels", pa.string(), nullable=False),  # canonical JSON object
                pa.field("kind", pa.string(), nullable=False),
            ]
        ),
    }


if TYPE_CHECKING:
    SAMPLE_SCHEMA: pa.Schema
    SERIES_SCHEMA: pa.Schema


def __getattr__(name: str) -> Any:
    # SAMPLE_SCHEMA and SERIES_SCHEMA are made when first asked for (PEP 562), so importing the
    # name rules costs no pyarrow (~40 MB): the agent's memory budget is small.
    # Any other missing name must not build them: `from model import X` probes names such as
    # __path__, and that alone would import pyarrow.
    if name in ("SAMPLE_SCHEMA", "SERIES_SCHEMA"):
        return _arrow_schemas()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Each row keeps a DDSketch (Masson, Rim, Lee, VLDB 2019) of its finite samples: the
# logarithmic key mapping of the ``ddsketch`` package at 1 % relative accuracy, stored as
# sorted signed codes with their counts (``sketch_keys``, ``sketch_counts``): a positive
# value's key plus SKETCH_BIAS, a negative value's negated, 0 for zero. Codes then sort as the
# values do, sketches of disjoint buckets merge by adding the counts of equal codes, and a
# quantile read from merged rows is within SKETCH_RELATIVE_ACCURACY of the sample at its rank.
SKETCH_RELATIVE_ACCURACY = 0.01
SKETCH_BIAS = 1 << 16  # above every key of a finite double at 1 % (about ±35,500)


class SketchMapping:
    """The ``ddsketch`` package's LogarithmicMapping, vectorised (its ``key``/``value`` take
    one float at a time; tests check both agree)."""

    def __init__(self, relative_accuracy: float = SKETCH_RELATIVE_ACCURACY) -> None:
        from ddsketch.mapping import LogarithmicMapping

        self.mapping = LogarithmicMapping(relative_accuracy)
        self.multiplier = float(self.mapping._multiplier)  # key = ceil(log2(v) * multiplier)
        self.gamma = float(self.mapping.gamma)
        self.min_possible = float(self.mapping.min_possible)

    def codes(self, values: Any) -> Any:
        import numpy as np

        v = np.asarray(values, dtype=np.float64)
        mag = np.abs(v)
        safe = np.where(mag > self.min_possible, mag, 1.0)
        with np.errstate(all="ignore"):
            keys = np.ceil(np.log2(safe) * self.multiplier).astype(np.int64) + SKETCH_BIAS
        return np.asarray(np.where(mag > self.min_possible, np.sign(v) * keys, 0), np.int32)

    def values(self, codes: Any) -> Any:
        import numpy as np

        c = np.asarray(codes, dtype=np.int64)
        keys = np.abs(c) - SKETCH_BIAS
        with np.errstate(all="ignore"):
            mag = np.exp2(keys / self.multiplier) * (2.0 / (1.0 + self.gamma))
        return np.asarray(np.where(c == 0, 0.0, np.sign(c) * mag))

    def sql(self, column: str) -> str:
        """The codes of ``column`` in DuckDB SQL (the same formula as :meth:`codes`)."""
        m, lo = repr(self.multiplier), repr(self.min_possible)
        key = f"(CAST(ceil(log2(abs({column})) * {m}) AS BIGINT) + {SKETCH_BIAS})"
        return (
            f"CAST(CASE WHEN {column} > {lo} THEN {key} WHEN {column} < -{lo} THEN -{key} "
            "ELSE 0 END AS INTEGER)"
        )


_mapping: SketchMapping | None = None


def sketch_mapping() -> SketchMapping:
    """The one mapping every row's sketch uses (built on first use: ``ddsketch`` imported
    only by what reads or writes sketches)."""
    global _mapping
    if _mapping is None:
        _mapping = SketchMapping()
    return _mapping


def sketch_quantile(codes: Any, counts: Any, q: float) -> float:
    """The value at quantile ``q`` of a sketch (DDSketch's ``get_quantile_value``: the
    bucket holding rank ``q * (n - 1)``); NaN when empty, ±Inf for ``q`` outside [0, 1] as
    Prometheus's ``quantile_over_time`` answers."""
    import numpy as np

    n = int(counts.sum())
    if n == 0 or np.isnan(q):
        return float("nan")
    if q < 0:
        return float("-inf")
    if q > 1:
        return float("inf")
    order = np.argsort(codes, kind="stable")
    cum = np.cumsum(counts[order])
    at = int(np.searchsorted(cum, q * (n - 1), side="right"))
    return float(sketch_mapping().values(codes[order][min(at, order.size - 1)]))
