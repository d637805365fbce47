"""Errors raised by metricvault.

Every error carries the HTTP status a gateway answers with and a message that says what was
wrong, how big it was, which limit applies and how to fix it. Third-party exceptions are
translated at the boundary (``raise X(...) from exc``).

    MetricVaultError (500)
    ├── InputError (400)             input that can never succeed as sent
    │   ├── LabelError               bad metric or label name, label value, duplicate label
    │   ├── SelectorError            a PromQL series selector that does not parse
    │   ├── TimeRangeError           an unparseable or inverted start/end/step
    │   └── ValueRangeError          NaN/Inf where not allowed, absurd timestamps
    ├── TooLargeError (413)          a body or batch over a configured limit
    ├── UnsupportedError (415)       an encoding or content type we do not speak
    ├── NotFoundError (404)          a vault, experiment or snapshot that does not exist
    ├── ConflictError (409)          an experiment id or archive tag that exists with other content
    ├── ArchiveError (409)           git/DVC refused or is not set up (not a repo, no remote, dirty)
    ├── ConfigError (400)            a settings file or override that is invalid
    ├── MissingDependencyError (500) an optional extra (e.g. polars) is not installed
    ├── SeriesCollisionError (500)   two label sets hashed to one series id (never silently merged)
    ├── BackpressureError (503)      buffer over its limit; retry after ``retry_after_s``
    └── StorageError (503)           the store could not be read or written (retryable)
        ├── DiskFullError            the disk is full; retry after ``retry_after_s``
        └── CorruptionError          a vault file fails its checksum or does not parse
"""

from __future__ import annotations


class MetricVaultError(Exception):
    """Base class: ``status`` is the HTTP status a gateway answers with."""

    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(MetricVaultError):
    status = 400


class LabelError(InputError):
    pass


class SelectorError(InputError):
    pass


class TimeRangeError(InputError):
    pass


class ValueRangeError(InputError):
    pass


class TooLargeError(MetricVaultError):
    status = 413


class UnsupportedError(MetricVaultError):
    status = 415


class NotFoundError(MetricVaultError):
    status = 404


class ConflictError(MetricVaultError):
    status = 409


class ArchiveError(MetricVaultError):
    status = 409


class ConfigError(MetricVaultError):
    status = 400


class MissingDependencyError(MetricVaultError):
    """The message names the extra to install (``pip install 'metricvault[polars]'``)."""


class SeriesCollisionError(MetricVaultError):
    status = 500


class BackpressureError(MetricVaultError):
    status = 503

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StorageError(MetricVaultError):
    status = 503


class DiskFullError(StorageError):
    def __init__(self, message: str, retry_after_s: int = 30) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CorruptionError(StorageError):
    """Retrying will not help until ``metricvault check --repair`` (or a restore) has run."""
