"""Errors raised by metricvault: every exception class of the package is defined here.

Every error carries the HTTP status a gateway answers with and a message that says what was
wrong, how big it was, which limit applies and how to fix it. Third-party exceptions are
translated at the boundary (``raise X(...) from exc``). Errors a caller may simply retry derive
from :class:`RetryLater`, whose ``retry_after_s`` the gateway sends as ``Retry-After``.

    MetricVaultError (500)
    ├── InputError (400)             input that can never succeed as sent
    │   ├── LabelError               bad metric or label name, label value, duplicate label
    │   ├── SelectorError            a PromQL series selector that does not parse
    │   ├── TimeRangeError           an unparseable or inverted start/end/step
    │   ├── TemplateError            a rule template that does not parse or fails (Go's words)
    │   └── ValueRangeError          NaN/Inf where not allowed, absurd timestamps
    ├── AuthError (401)              no or unknown gateway credentials
    ├── ForbiddenError (403)         a cookie-authenticated write without its CSRF token
    ├── NotFoundError (404)          a vault, experiment or snapshot that does not exist
    ├── ReadOnlyError (405)          a write to something opened read-only (a snapshot file)
    ├── ConflictError (409)          an experiment id or archive tag that exists with other content
    ├── ArchiveError (409)           git/DVC refused or is not set up (not a repo, no remote, dirty)
    ├── SpoolLockedError (409)       another agent holds the push spool directory (a RuntimeError)
    ├── TooLargeError (413)          a body or batch over a configured limit
    ├── UnsupportedError (415)       an encoding or content type we do not speak
    ├── ConfigError (400)            a settings file or override that is invalid
    │   ├── RuleFileError            a rule file Prometheus would refuse (promtool's lines)
    │   └── CredentialError          a client credential given twice, unreadable or empty
    ├── UnitTestError (400)          a promtool rule unit-test file that cannot be run
    ├── PromQLError (400/422)        a PromQL query that is bad (400) or fails on the data (422)
    │   └── ResolutionError (400)    a range query over 11,000 points per series
    ├── MissingDependencyError (500) an optional extra (e.g. polars) is not installed
    ├── NvmlUnavailable (500)        NVML cannot start: no driver or library (a RuntimeError)
    ├── SeriesCollisionError (500)   two label sets hashed to one series id (never silently merged)
    ├── RetryLater (503)             retrying after ``retry_after_s`` seconds can succeed
    │   ├── CardinalityError (429)   a tenant creates new series faster than allowed
    │   ├── BackpressureError (503)  the ingest buffer is over its limit
    │   └── DiskFullError (503)      the disk is full (also a StorageError)
    └── StorageError (503)           the store could not be read or written (retryable)
        ├── DiskFullError            (see RetryLater)
        ├── CommitConflictError      another writer's catalog commit voided this one's work
        └── CorruptionError          a vault file fails its checksum or does not parse
            └── CorruptBatch         an ingest-buffer row that is not a sample batch

Private exceptions (a leading ``_``) that a module raises and catches itself, to unwind a
parser or a scrape, are not part of this tree and stay beside the code they unwind.

Warning categories (for ``warnings.warn``, never raised): ``ApproximateAnswer``, a query
answered where the data cannot give the exact answer (PromQL past the raw retention).
"""

from __future__ import annotations

from typing import ClassVar


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


class AuthError(MetricVaultError):
    """401: no or unknown credentials."""

    status = 401


class ForbiddenError(MetricVaultError):
    """403: a known caller, but the request may not be made (e.g. no CSRF token)."""

    status = 403


class TooLargeError(MetricVaultError):
    status = 413


class UnsupportedError(MetricVaultError):
    status = 415


class NotFoundError(MetricVaultError):
    status = 404


class ReadOnlyError(MetricVaultError):
    status = 405


class ConflictError(MetricVaultError):
    status = 409


class ArchiveError(MetricVaultError):
    status = 409


class SpoolLockedError(MetricVaultError, RuntimeError):
    """Another process (or another open Spool) holds the spool directory. Also a
    RuntimeError, so ``except RuntimeError`` around opening a spool still catches it."""

    status = 409


class ConfigError(MetricVaultError):
    status = 400


class RuleFileError(ConfigError):
    """A rule file Prometheus would refuse: ``problems`` holds each of promtool's lines."""

    def __init__(self, path: str, problems: list[str] | tuple[str, ...] = ()) -> None:
        self.path = path
        self.problems = list(problems)
        listed = "\n".join(f"{path}: {p}" for p in self.problems)
        super().__init__(
            f"{listed}\n(the rule file {path} is refused as Prometheus refuses it; fix it and "
            "check it with `metricvault rules check` or `promtool check rules`)"
        )


class CredentialError(ConfigError, ValueError):
    """A client credential (push, Alertmanager) given twice, unreadable or empty; still a
    ValueError, as the agent's push credentials raised before."""


class UnitTestError(MetricVaultError):
    """A promtool rule unit-test file that cannot be run (not a failing test)."""

    status = 400


class TemplateError(InputError):
    """A rule template that does not parse or fails while it runs (Go's message, ``template:
    ...``); while alerts are evaluated it is rendered into the annotation, as Prometheus does."""


class PromQLError(MetricVaultError):
    """``kind`` is the Prometheus API error type: ``bad_data`` (the query can never succeed:
    syntax, types, bad parameters; HTTP 400) or ``execution`` (it failed on the data, e.g.
    many-to-many matching, duplicate label sets; HTTP 422). Messages are worded as Prometheus
    words them, so clients that match on them (Grafana, promtool) behave the same."""

    def __init__(self, message: str, kind: str = "execution") -> None:
        super().__init__(message)
        self.kind = kind  # also "timeout" (503) and "internal" (500) from the HTTP API
        self.status = {"bad_data": 400, "timeout": 503, "internal": 500}.get(kind, 422)


class ResolutionError(PromQLError):
    """A range query with more than 11,000 points per series. The message is Prometheus's
    (HTTP API clients match on it); callers with other words for the step (the CLI's
    ``--step``) build theirs from ``range_ms`` and ``step_ms``."""

    PROMETHEUS_MESSAGE = (
        "exceeded maximum resolution of 11,000 points per timeseries. "
        "Try decreasing the query resolution (?step=XX)"
    )

    def __init__(
        self, message: str = PROMETHEUS_MESSAGE, *, range_ms: int = 0, step_ms: int = 1
    ) -> None:
        super().__init__(message, kind="bad_data")
        self.range_ms = range_ms
        self.step_ms = step_ms

    @property
    def smallest_step_s(self) -> int:
        """The smallest whole-second step the range allows."""
        return -(-self.range_ms // (11_000 * 1000))


class MissingDependencyError(MetricVaultError):
    """The message names the extra to install (``pip install 'metricvault[polars]'``)."""


class NvmlUnavailable(MetricVaultError, RuntimeError):
    """NVML could not be started: no NVIDIA driver, no NVML library, or mismatched versions.
    Also a RuntimeError, so ``except RuntimeError`` around starting NVML still catches it."""


class SeriesCollisionError(MetricVaultError):
    status = 500


class RetryLater(MetricVaultError):
    """The request may succeed if sent again after ``retry_after_s`` seconds; the gateway
    answers with ``status`` and a ``Retry-After`` header. Subclasses set the default wait."""

    status = 503
    default_retry_after_s: ClassVar[int] = 5

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s


class CardinalityError(RetryLater):
    """429: too many new series for a tenant right now; retrying later can succeed."""

    status = 429
    default_retry_after_s = 60


class BackpressureError(RetryLater):
    status = 503
    default_retry_after_s = 5


class StorageError(MetricVaultError):
    status = 503


class DiskFullError(StorageError, RetryLater):
    """A StorageError (the store cannot be written) that retrying later can fix."""

    default_retry_after_s = 30


class CommitConflictError(StorageError):
    """Another writer of the vault committed first and replaced what this commit replaces
    (maintenance work done twice): the work is discarded and the next round redoes it."""


class CorruptionError(StorageError):
    """Retrying will not help until ``metricvault check --repair`` (or a restore) has run."""


class CorruptBatch(CorruptionError):
    """A buffer row whose payload is not a sample batch (damaged on disk, or not ours)."""


class ApproximateAnswer(UserWarning):
    """An answer that is not exactly what the raw samples would give, and why (e.g. PromQL
    windows answered from rollups past the raw retention; docs/promql.md)."""
