"""The store boundary: what a backend offers, as typed protocols and capabilities to check.

A leaf module (it imports only the leaf modules :mod:`metricvault.errors` and
:mod:`metricvault.experiment`), so every
layer can name the boundary without importing a backend. Four classes are stores:
``Vault`` (local disk, S3), ``InfluxVault`` (``influxdb://``), ``SnapshotVault`` (a
``.parquet`` experiment snapshot, read-only) and ``GatewayVault`` (a gateway URL, write and
registry only). Each says what it can do in ``capabilities``; :func:`metricvault.open` and
:func:`require` turn a missing capability into a clear :class:`UnsupportedError`, and the
protocols let mypy catch the same mistake where the backend is known statically (a
``SnapshotVault`` is not a :class:`ServingStore`, so ``create_app(snapshot)`` does not type).

=============  ==========================================================================
capability     protocol and methods
=============  ==========================================================================
``read``       :class:`Reading`: ``query``, ``series``, ``stats``, ``history``
``write``      :class:`Writing`: ``write``, ``set_metric_kinds``, ``flush``,
               ``min_writable_ms``
``maintain``   :class:`Maintaining`: ``maintain``
``experiments`` :class:`HasExperiments`: ``experiments`` (an :class:`ExperimentRegistry`)
``sql``        ``sql`` (DuckDB views; the embedded store and snapshots)
``serve``      :class:`ServingStore`: what ``metricvault serve`` needs — all of write,
               maintain and experiments, plus ``buffered``, ``state_dir``, ``uri``,
               ``series_count`` and ``flush_other_buffers``
=============  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from metricvault.errors import UnsupportedError
from metricvault.experiment import Experiment

Capability = Literal["read", "write", "maintain", "experiments", "sql", "serve"]
CAPABILITIES: tuple[Capability, ...] = ("read", "write", "maintain", "experiments", "sql", "serve")

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
}


class Store(Protocol):
    """What every backend is: closeable, a context manager, with its capabilities."""

    capabilities: frozenset[str]

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class Reading(Store, Protocol):
    """Reading: the long-shape query API every readable backend answers alike."""

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

    def series(self, selector: str | None = None, output: str = "pandas") -> Any: ...

    def stats(self, now: int | None = None) -> dict[str, Any]: ...

    def history(self, experiment: Any, metrics: Sequence[str], **options: Any) -> Any: ...


class Writing(Store, Protocol):
    """Writing: durable when ``write`` returns (see ``Vault.write``)."""

    def write(
        self,
        data: Any,
        kinds: Mapping[str, str] | None = None,
        *,
        admit_new_series: Callable[[int], None] | None = None,
    ) -> int: ...

    def set_metric_kinds(self, kinds: Mapping[str, str]) -> None: ...

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
