"""``metricvault.open(uri)``: one dispatcher for every kind of store.

=====================================  =====================================================
URI                                    store
=====================================  =====================================================
a directory, ``s3://bucket/prefix``    :class:`metricvault.public.Vault` (everything)
``influxdb://`` / ``influxdbs://``     :class:`metricvault.public_influx.InfluxVault`
a path ending in ``.parquet``          :class:`metricvault.archive.opened.SnapshotVault`
                                       (read-only: query, series, sql, stats)
``http://`` / ``https://`` (gateway)   :class:`metricvault.store.backends.gateway.GatewayVault`
                                       (write and the experiment registry)
=====================================  =====================================================

``need=`` names the capability the caller needs (see :mod:`metricvault.protocols`); a store
without it is refused with UnsupportedError before any work, and the return type says what the
caller may use, so mypy catches ``open(uri).maintain()`` where only reading was asked for.

Above ``store`` and ``archive`` in the import layers (docs/architecture.md), with
:mod:`metricvault.public`, which holds the public classes and the dispatcher by URI; the
backends import only the leaf modules and their own package.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

from metricvault.protocols import (
    Exporting,
    HasExperiments,
    Maintaining,
    Reading,
    ReadWriteStore,
    ServingStore,
    Store,
    TrackingStore,
    Writing,
    is_gateway_uri,
    require,
)

if TYPE_CHECKING:
    from metricvault.archive.opened import SnapshotVault
    from metricvault.config import Settings
    from metricvault.public import Vault
    from metricvault.public_influx import InfluxVault
    from metricvault.store.backends.gateway import GatewayVault

    AnyStore: TypeAlias = Vault | InfluxVault | SnapshotVault | GatewayVault

__all__ = ["is_gateway_uri", "open", "open_store"]


@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["read"] = ...,
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> Reading: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["write"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> Writing: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["read+write"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> ReadWriteStore: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["write+experiments"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> TrackingStore: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["maintain"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> Maintaining: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["experiments"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> HasExperiments: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["serve"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> ServingStore: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["export"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> Exporting: ...
@overload
def open(
    uri: str | os.PathLike[str] | None = ...,
    settings: Settings | None = ...,
    *,
    need: Literal["sql"],
    create: bool = ...,
    buffer_name: str = ...,
    **overrides: Any,
) -> Reading: ...
def open(
    uri: str | os.PathLike[str] | None = None,
    settings: Settings | None = None,
    *,
    need: str = "read",
    create: bool = True,
    buffer_name: str = "buffer",
    **overrides: Any,
) -> Store:
    """Open the store at ``uri`` (default: the ``data`` setting) for what ``need`` names:
    ``read`` (default), ``write``, ``read+write``, ``maintain``, ``experiments``, ``sql``,
    ``serve`` or ``export``. UnsupportedError if that store cannot do it; the store is closed
    again then.

    ``create``: make a new local vault if the directory does not exist (else NotFoundError).
    ``buffer_name`` gives a writer process its own ingest buffer file (gateway workers).
    Keyword overrides are settings (see ``metricvault config``), e.g.
    ``metricvault.open("s3://b/p", s3_endpoint="http://127.0.0.1:9000")``.

    >>> with metricvault.open("./metricvault-data") as vault:
    ...     vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-1d", step="1h")
    """
    store = open_store(uri, settings, create=create, buffer_name=buffer_name, **overrides)
    try:
        for capability in need.split("+"):
            require(store, capability, _name(store))
    except BaseException:
        store.close()
        raise
    return store


def open_store(
    uri: str | os.PathLike[str] | None = None,
    settings: Settings | None = None,
    *,
    create: bool = True,
    buffer_name: str = "buffer",
    **overrides: Any,
) -> AnyStore:
    """The store at ``uri``, whatever it can do: the concrete public class, for callers that
    check capabilities themselves (``metricvault.public.open_backend`` dispatches)."""
    from metricvault.config import Settings

    settings = (settings or Settings.load()).with_overrides(**overrides)
    target = os.fspath(uri) if uri is not None else settings.data
    if is_gateway_uri(target):
        # Not through the public classes: a training run writing through a gateway never
        # loads pyarrow (the store's classes import it).
        from metricvault.store.backends.gateway import GatewayVault

        return GatewayVault(target)
    from metricvault.public import open_backend

    return open_backend(target, settings, create=create, buffer_name=buffer_name)


def _name(store: object) -> str:
    return str(getattr(store, "uri", "") or getattr(store, "path", "") or type(store).__name__)
