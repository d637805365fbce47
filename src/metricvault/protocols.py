"""The store boundary: what a backend offers, as typed protocols and capabilities to check.

A leaf module (it imports only the leaf modules :mod:`metricvault.errors`,
:mod:`metricvault.experiment`, :mod:`metricvault.model` and :mod:`metricvault.selector`, and
numpy), so every layer can name the boundary without importing a backend. Four classes are stores:
``Vault`` (local disk, S3), ``InfluxVault`` (``influxdb://``), ``SnapshotVault`` (a
``.parquet`` experiment snapshot, read-only) and ``GatewayVault`` (a gateway URL, write and
registry only). Each says what it can do in ``capabilities``; :func:`metricvault.open` and
:func:`require` turn a missing capability into a clear :class:`UnsupportedError`, and the
protocols let mypy catch the same mistake where the backend is known statically (a
``SnapshotVault`` is not a :class:`ServingStore`, so ``create_app(snapshot)`` does not type).

=============  ==========================================================================
capability     protocol and methods
=============  ==========================================================================
``read``       :class:`Reading`: ``query``, ``series``, ``stats``, and the
               typed read seam :class:`SampleSource` the query engines read through:
               ``select``, ``select_buckets``, ``select_kept``, ``horizons``,
               ``samples_per_row``
``write``      :class:`Writing`: ``write``, ``set_metric_kinds``, ``flush``,
               ``min_writable_ms``
``maintain``   :class:`Maintaining`: ``maintain``
``experiments`` :class:`HasExperiments`: ``experiments`` (an :class:`ExperimentRegistry`)
``sql``        ``sql`` (DuckDB views; the embedded store and snapshots)
``export``     :class:`Exporting`: ``sample_reader`` and the registry (``archive export``)
``serve``      :class:`ServingStore`: what ``metricvault serve`` needs — all of write,
               maintain and experiments, plus ``buffered``, ``state_dir``, ``uri``,
               ``series_count`` and ``flush_other_buffers``
``catalog``    ``catalog_version()``: versions of the files it reads, which the query caches
               compare to know whether a kept answer still holds (the embedded store only)
=============  ==========================================================================

The read seam
-------------
An engine (PromQL, the rule evaluator, the UI's JSON) asks for the samples of the series its
matchers select in a closed time range, and says in :class:`SelectHints` what they are for
(the function, its range, the step, the evaluation start and end: Prometheus's
``SelectHints``). Where rollup rows can answer the function exactly (or, before the raw
horizon, are all that is left), ``select_buckets`` returns them and the *store* has chosen
the tier; None means "read raw samples". Matchers are applied in the order given, so a
caller that puts its tenant matcher first narrows to the tenant's series before any matcher
of the user's runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from metricvault.errors import UnsupportedError
from metricvault.experiment import Experiment
from metricvault.model import KindUpdate
from metricvault.selector import Matcher

if TYPE_CHECKING:  # numpy is imported where arrays are made: `import metricvault` stays light
    import numpy as np
    import pyarrow as pa

Capability = Literal["read", "write", "maintain", "experiments", "sql", "serve", "export"]
CAPABILITIES: tuple[Capability, ...] = (
    "read", "write", "maintain", "experiments", "sql", "serve", "export",
)  # fmt: skip

# What ``serve`` implies: a gateway writes, maintains on a timer and serves the registry.
_IMPLIES: dict[str, frozenset[str]] = {"serve": frozenset({"write", "maintain", "experiments"})}

# What each capability is for, in the words of the error that says it is missing.
_PURPOSE: dict[str, str] = {
    "read": "reading (query, series, stats)",
    "write": "writing samples",
    "maintain": "maintenance (metricvault maintain)",
    "experiments": "the experiment registry (metricvault experiment ...)",
    "sql": "SQL views (metricvault sql)",
    "serve": "serving a gateway (metricvault serve: it writes, maintains and keeps experiments)",
    "export": "archive export (metricvault archive export reads every series' samples or rollups)",
}


class Store(Protocol):
    """What every backend is: closeable, a context manager, with its capabilities."""

    capabilities: frozenset[str]

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


# --------------------------------------------------------------------------- the read seam
@dataclass
class SeriesSamples:
    """One series: ``labels`` include ``__name__``; ``ts`` (int64 ms, ascending, unique) and
    ``values`` (float64, may hold NaN and stale markers) have the same length."""

    labels: dict[str, str]
    ts: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        import numpy as np

        self.ts = np.asarray(self.ts, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.ts.shape != self.values.shape:
            raise ValueError(
                f"series {self.labels}: {self.ts.size} timestamps but {self.values.size} values; "
                "give one value per timestamp"
            )


@dataclass(frozen=True)
class SelectHints:
    """What a selection is for, so the store can choose how to answer it. ``start_ms`` and
    ``end_ms`` are the first and last evaluation (reference) time, every ``step_ms`` (0: one
    time, or all pinned with ``@``); ``range_ms`` the range selector's width (0: an instant
    selector); ``func`` the function the selection feeds (None: none, or not one the store
    can answer from rollups); ``left_open``: windows are ``(t - range, t]`` (Prometheus 3)."""

    func: str | None = None
    range_ms: int = 0
    step_ms: int = 0
    start_ms: int = 0
    end_ms: int = 0
    left_open: bool = False


@dataclass(frozen=True)
class Horizons:
    """Where a store's data ends, as one value: raw samples before ``raw_start_ms`` are gone
    (0: none dropped); rollups are complete before ``rolled_up_until_ms`` (None: everywhere;
    0: nowhere, or the store keeps none); a counter's bucket increase looks back up to
    ``counter_lookback_ms`` for the sample before it."""

    raw_start_ms: int = 0
    rolled_up_until_ms: int | None = 0
    counter_lookback_ms: int = 0


# The range functions rollup rows can answer (promql/tiers.py has the arithmetic), and the
# columns each bucket row carries for them.
BUCKET_FUNCTIONS = frozenset(
    {
        "rate", "increase", "delta", "count_over_time", "sum_over_time", "avg_over_time",
        "min_over_time", "max_over_time", "last_over_time", "present_over_time",
    }
)  # fmt: skip
BUCKET_COLUMNS = (
    "ts", "count", "sum", "min", "max", "first", "first_ts", "last", "last_ts", "increase",
    "nonfinite",
)  # fmt: skip
# The columns every bucket function reads (promql/tiers.py: window positions, the sample
# at a window's end (a bucket's first), the exactness check), and those each reads beside
# them; a function not named (the spread ones) reads all of BUCKET_COLUMNS, ``m2`` and the
# sketches. The window cache reads its rows as ``sum_over_time``'s (promql/window_cache.py
# ``_ROW_HINT``), so that one keeps ``min`` and ``max``.
_BUCKET_ROWS = ("ts", "count", "first", "first_ts", "nonfinite")
_LAST = ("last", "last_ts")  # a window's newest sample and its time
_BUCKET_OWN: dict[str | None, tuple[str, ...]] = {
    None: _LAST,  # a plain selector's samples
    "rate": (*_LAST, "increase"),
    "increase": (*_LAST, "increase"),
    "delta": _LAST,
    "count_over_time": (),
    "present_over_time": (),
    "last_over_time": ("last",),
    "avg_over_time": ("sum",),
    "sum_over_time": ("sum", "min", "max"),
    "min_over_time": ("min",),
    "max_over_time": ("max",),
}


ALL_BUCKET_COLUMNS = (*BUCKET_COLUMNS, "m2")  # what the spread functions read


def bucket_columns(func: str | None) -> tuple[str, ...]:
    """The :data:`BUCKET_COLUMNS` (and ``m2``) that ``func``'s answer reads from the rows of
    :meth:`SampleSource.select_buckets`: a store may leave the others out of
    :attr:`SeriesBuckets.columns` (it need not)."""
    own = _BUCKET_OWN.get(func)
    if own is None:
        return ALL_BUCKET_COLUMNS
    return tuple(c for c in BUCKET_COLUMNS if c in _BUCKET_ROWS or c in own)


@dataclass
class SeriesBuckets:
    """One series' rollup rows, sorted by bucket start; ``columns`` maps each of
    :data:`BUCKET_COLUMNS` (at least those :func:`bucket_columns` names for the hints'
    function) to an array (float64, NaN where a row has no value; ``first_ts``/``last_ts``
    -1 there), and the rows' sketches (``sketch_start``, ``sketch_end``, ``sketch_held``,
    ``sketch_codes``, ``sketch_counts``)."""

    labels: dict[str, str]
    counter: bool
    columns: dict[str, np.ndarray]
    # Optional: where its rows are in BucketSelection.rows (start, end), of which its
    # columns are then the slices; None where the store lays out no such arrays.
    rows_at: tuple[int, int] | None = None


@dataclass
class BucketSelection:
    """Rollup rows of ``width_ms`` buckets chosen by the store for a :class:`SelectHints`.
    ``shifted``: the windows were moved to whole buckets, ``range_ms`` is their width then
    (only where raw samples are gone: the answer is then approximate)."""

    series: list[SeriesBuckets]
    raw_horizon_ms: int  # raw samples before this are gone (0: none dropped)
    counter_lookback_ms: int
    tiers: tuple[str, ...]  # the tiers that served the rows
    width_ms: int = 0
    shifted: bool = False
    range_ms: int = 0
    # Optional: every series' rows laid end to end, of which each SeriesBuckets' columns are
    # slices (the row columns only, not the sketches); the engine then checks all rows at
    # once instead of series by series. A store that has no such arrays leaves it None.
    rows: dict[str, np.ndarray] | None = None


class SampleSource(Protocol):
    """The typed read seam every readable backend implements (and ``MemorySource`` in tests)."""

    def select(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints | None = None,
    ) -> list[SeriesSamples]:
        """Samples in ``[start_ms, end_ms]`` (both ends included) of every series all
        ``matchers`` match, applied in order; staleness markers and NaN samples included."""
        ...

    def select_buckets(
        self, matchers: Sequence[Matcher], hints: SelectHints
    ) -> BucketSelection | None:
        """Rollup rows that answer ``hints.func`` over the hinted windows, from the tier the
        store chose; None: this store has none that can (read raw samples)."""
        ...

    def select_kept(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        """The real samples still held in ``[start_ms, end_ms]``: raw samples, and before the
        raw horizon each rollup bucket's first and last sample (what remote_read returns)."""
        ...

    def horizons(self) -> Horizons: ...

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        """About how many raw samples a row of ``tier`` summarises there (None: unknown)."""
        ...


class Reading(SampleSource, Store, Protocol):
    """Reading: the long-shape query API every readable backend answers alike, and the read
    seam the engines use."""

    def query(
        self,
        selector: str,
        start: Any = ...,
        end: Any = ...,
        step: str | int | None = None,
        aggs: Sequence[str] = ("mean",),
        output: str = "pandas",
        stale_markers: bool = False,
    ) -> Any: ...

    def series(
        self,
        selector: str | None = None,
        output: str = "pandas",
        *,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> Any:
        """The series table; ``start_ms``/``end_ms`` narrow it to the series with samples
        then, where the store keeps first/last-seen times (capability ``series_times``;
        others list every series)."""
        ...

    def stats(self, now: int | None = None) -> dict[str, Any]: ...


class Writing(Store, Protocol):
    """Writing: durable when ``write`` returns (see ``Vault.write``)."""

    def write(
        self,
        data: Any,
        kinds: Mapping[str, str] | None = None,
        *,
        admit_new_series: Callable[[int], None] | None = None,
    ) -> int: ...

    def set_metric_kinds(self, kinds: Mapping[str, str]) -> KindUpdate: ...

    def flush(self) -> int: ...

    def min_writable_ms(self) -> int: ...


class Maintaining(Store, Protocol):
    def maintain(self, now_ms: int | None = None, progress: bool = False) -> dict[str, Any]: ...


@runtime_checkable
class ExperimentRegistry(Protocol):
    """``vault.experiments``: the same methods, checks and messages on every backend."""

    def create(self, experiment_id: str, selector: str, **fields: Any) -> Experiment: ...

    def get(self, experiment_id: str) -> Experiment: ...

    def __contains__(self, experiment_id: str) -> bool: ...

    def ids(self) -> list[str]: ...

    def list(self) -> list[Experiment]: ...

    def update(self, experiment_id: str, **changes: Any) -> Experiment: ...

    def end(self, experiment_id: str, at: Any = "now") -> Experiment: ...


class HasExperiments(Store, Protocol):
    @property
    def experiments(self) -> ExperimentRegistry: ...


class SeriesLookup(Protocol):
    """A store's series index as an export reads it: ids by selector, and what each is."""

    def match(self, selector: Any) -> list[int]: ...

    def get(self, series_id: int) -> Any:
        """The series' ``series_id``, ``metric``, ``labels`` (a dict), ``labels_json``."""
        ...

    def kind(self, series_id: int) -> str: ...

    def is_counter(self, series_id: int) -> bool: ...


class SampleReader(Protocol):
    """Every series' raw samples and per-bucket partials by series id: what the shared query
    layer (``store/reading.py``) and the archive export read through."""

    @property
    def index(self) -> SeriesLookup: ...

    @property
    def lookback_ms(self) -> int:
        """How far back a counter's previous sample is looked for."""
        ...

    @property
    def raw_horizon_ms(self) -> int:
        """Raw samples before this were dropped by retention (0: none)."""
        ...

    def raw_samples(self, series_ids: list[int], start: int, end: int) -> pa.Table:
        """``series_id, ts, value`` with ``start <= ts < end``, sorted by series and time."""
        ...

    def partials(self, series_ids: list[int], start: int, end: int, step: int) -> pa.Table:
        """Per (series, bucket of ``step`` ms aligned to the epoch; -1: one bucket over the
        range): ``series_id, ts, count, sum, min, max, last, last_ts, increase``."""
        ...


class Exporting(HasExperiments, Protocol):
    """What ``metricvault archive export`` reads: the registry and every series' data."""

    def sample_reader(self) -> SampleReader: ...


class ReadWriteStore(Reading, Writing, Protocol):
    """Reading and writing (``metricvault import``, the demo, ``track`` on a vault)."""


class TrackingStore(Writing, HasExperiments, Protocol):
    """What a training run (``metricvault.track``) writes to: samples and its experiment."""


class ServingStore(Reading, Writing, Maintaining, HasExperiments, Protocol):
    """What the gateway (``metricvault serve``) runs over."""

    @property
    def uri(self) -> str: ...

    @property
    def state_dir(self) -> Path:
        """A local directory for the gateway's lock and metrics files."""
        ...

    def buffered(self) -> tuple[int, int]:
        """Samples and bytes written but not yet flushed to data files."""
        ...

    def series_count(self) -> int: ...

    def flush_other_buffers(self) -> int: ...


def is_gateway_uri(uri: str) -> bool:
    """Whether ``uri`` names a gateway (``metricvault serve``) rather than a store."""
    return uri.startswith(("http://", "https://"))


def capabilities_of(store: object) -> frozenset[str]:
    return frozenset(getattr(store, "capabilities", frozenset()))


def has(store: object, capability: str) -> bool:
    """Whether ``store`` can do ``capability`` (``serve`` implies write, maintain, experiments)."""
    caps = capabilities_of(store)
    return capability in caps and _IMPLIES.get(capability, frozenset()) <= caps


def require(store: object, capability: str, what: str = "") -> None:
    """UnsupportedError unless ``store`` has ``capability``; ``what`` names the store in the
    message (its URI or path). Says what the store can do instead, and where to turn."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of {', '.join(CAPABILITIES)}")
    if has(store, capability):
        return
    kind = getattr(store, "backend_name", type(store).__name__)
    can = ", ".join(sorted(capabilities_of(store))) or "nothing"
    raise UnsupportedError(
        f"{what or kind} is {_article(kind)} {kind}, which cannot do "
        f"{_PURPOSE[capability]}: it supports {can}. "
        f"{getattr(store, 'unsupported_hint', '')}".rstrip()
    )


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"
