"""The public store classes: each store's own class plus the conveniences that live above the
store (``metricvault.Vault`` is :class:`Vault`; :func:`metricvault.open` returns these).

The store imports nothing above itself, so what needs the PromQL engine (``promql``), the
experiment analysis (``history``), the dispatcher (``Vault.open``) or a terminal library
(``maintain(progress=True)``) is added here, one layer up, by subclassing: a vault opened
this way is still an instance of the store's class, and the store's code never changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metricvault.config import Settings
from metricvault.conveniences import Conveniences
from metricvault.protocols import is_gateway_uri
from metricvault.store.vault import Vault as _VaultStore

if TYPE_CHECKING:
    from metricvault.open import AnyStore
    from metricvault.store.maintenance import ProgressCallback

__all__ = ["Vault", "open_backend"]


class Vault(Conveniences, _VaultStore):
    """A metric store on local disk or S3 (the store's :class:`metricvault.store.vault.Vault`
    with the conveniences). Open with :meth:`Vault.open` or :func:`metricvault.open`.

    >>> vault = Vault.open("./metricvault-data")
    >>> vault.write(frame)                       # durable when it returns
    >>> vault.query('DCGM_FI_DEV_GPU_UTIL{Hostname="node01"}', "-7d", "now", step="1h",
    ...             aggs=("mean", "max"))
    """

    @classmethod
    def open(
        cls,
        uri: str | None = None,
        settings: Settings | None = None,
        *,
        create: bool = True,
        buffer_name: str = "buffer",
        **overrides: Any,
    ) -> AnyStore:
        """Open the store at a directory or ``s3://bucket/prefix`` (``create``: make a new
        local vault if the directory does not exist; otherwise raise NotFoundError).
        ``buffer_name`` gives a writer process its own ingest buffer file (gateway workers);
        maintenance flushes every buffer file it finds, so none is ever left behind.

        ``influxdb://[user:pass@]host:port/db`` (or ``influxdbs://``) opens an InfluxDB 1.x
        database set up with ``metricvault influx setup``. A path ending in ``.parquet`` opens
        an experiment snapshot (``metricvault archive export``) read-only, with the same
        ``query``, ``series``, ``sql`` and ``stats``; an ``http(s)://`` gateway URL a
        write-only store. The result is typed as the backend it may be: use
        :func:`metricvault.open` with ``need=`` to be given (and typed) what you need.

        Keyword overrides are settings (see ``metricvault config``), e.g.
        ``Vault.open("s3://b/p", s3_endpoint="http://127.0.0.1:9000")``.
        """
        settings = (settings or Settings.load()).with_overrides(**overrides)
        return open_backend(uri or settings.data, settings, create=create, buffer_name=buffer_name)

    def maintain(
        self, now_ms: int | None = None, progress: bool | ProgressCallback = False
    ) -> dict[str, Any]:
        """Flush, compact, roll up, apply retention and expire snapshots. Idempotent.

        ``progress``: a ``ProgressCallback`` (``progress(step, done, total)``), or True for a
        rich bar on the terminal (metricvault.progressbar's, imported only then)."""
        if progress is True:
            from metricvault.progressbar import console_progress

            with console_progress() as bar:
                return super().maintain(now_ms, bar)
        return super().maintain(now_ms, progress)


def open_backend(target: str, settings: Settings, *, create: bool, buffer_name: str) -> AnyStore:
    """The store ``target`` names (a directory, ``s3://``, ``influxdb://``, a ``.parquet``
    snapshot or a gateway URL), as its public class: the one dispatcher by URI."""
    if _names_influx(target):  # InfluxDB 1.x: the same API, see docs/influxdb.md
        from metricvault.public_influx import InfluxVault

        return InfluxVault.open(target, settings)
    if target.endswith(".parquet"):  # a frozen experiment snapshot: read-only
        from metricvault.archive.opened import SnapshotVault

        return SnapshotVault(target, settings)
    if is_gateway_uri(target):  # a gateway: writes and the registry over HTTP
        from metricvault.store.backends.gateway import GatewayVault

        return GatewayVault(target)
    return Vault.open_local(target, settings, create=create, buffer_name=buffer_name)


def _names_influx(target: str) -> bool:
    """Whether ``target`` is an InfluxDB URI. A directory, ``s3://`` or a gateway URL is told
    apart by its scheme alone: the InfluxDB client module (http.client, email) costs a cold
    ``open`` of a local vault tens of milliseconds."""
    scheme = target.split("://", 1)[0].lower() if "://" in target else ""
    if scheme in ("", "s3", "file", "http", "https"):
        return False
    from metricvault.store.backends import is_influx_uri

    return is_influx_uri(target)
