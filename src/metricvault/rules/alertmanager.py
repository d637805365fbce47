"""Delivery of alerts to one or more Alertmanagers through their v2 API, as Prometheus does it.

What the evaluator hands over, and when (:class:`Resender`, Prometheus's ``needsSending``):

- a firing alert is sent when it starts firing and again every ``resend_delay`` (1 m) while it
  fires, with ``endsAt`` = now + 4 x max(resend_delay, group interval): Alertmanager resolves it
  by itself if two evaluations or sends in a row go missing;
- a resolved alert is sent at once with ``endsAt`` = the time it resolved, and again every
  ``resend_delay`` for ``resolved_retention`` (15 m), so an Alertmanager that was down then still
  hears of it;
- pending alerts are never sent.

Delivery (:class:`Notifier`): every Alertmanager has its own queue and sender thread, so a dead
one neither delays nor starves the others. A queue holds the newest state of each alert (keyed
by its label set: a resend replaces the queued copy rather than adding one), is sent in batches
of ``MAX_BATCH`` as ``POST /api/v2/alerts`` (the JSON Prometheus sends: labels, annotations,
startsAt, endsAt, generatorURL), and what fails to arrive stays queued and is retried with
exponential back-off: nothing is lost while Alertmanager is down, and the resends keep the
firing alerts queued. A queue holds at most ``capacity`` alerts; when it is full the oldest
*resolved* alert is dropped first, a firing one only when nothing else is left (and counted in
``dropped``, by reason). An answer of 400 (a batch Alertmanager can never accept) drops that
batch, as Prometheus does; 401 re-reads a credential file once.

Grouping, deduplication, silences, inhibition and routing are Alertmanager's job.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from metricvault.client_auth import ClientAuth
from metricvault.errors import ConfigError

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
RESEND_DELAY_S = 60.0  # Prometheus's --rules.alert.resend-delay
RESOLVED_RETENTION_S = 15 * 60.0  # how long Prometheus keeps sending a resolved alert
QUEUE_CAPACITY = 10_000  # Prometheus's --alertmanager.notification-queue-capacity
MAX_BATCH = 64  # alerts per request, as Prometheus's notifier
TIMEOUT_S = 10.0
MIN_BACKOFF_S = 0.25
MAX_BACKOFF_S = 30.0
USER_AGENT = "metricvault-rules"

AlertState = Literal["inactive", "pending", "firing"]
LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def rfc3339(epoch_s: float) -> str:
    """Go's RFC 3339 with milliseconds, in UTC, as Alertmanager parses it."""
    stamp = datetime.fromtimestamp(epoch_s, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def generator_url(external_url: str, expr: str) -> str:
    """The link Prometheus puts in ``generatorURL``: its graph page in table view."""
    return f"{external_url.rstrip('/')}/graph?g0.expr={quote(expr, safe='')}&g0.tab=1"


@dataclass(frozen=True)
class Alert:
    """One alert as Alertmanager receives it; times in epoch seconds."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    ends_at: float
    generator_url: str = ""

    @classmethod
    def from_outgoing(cls, alert: OutgoingMs) -> Alert:
        """The evaluator's ``rules.group.OutgoingAlert`` (times in ms) as sent here."""
        return cls(
            dict(alert.labels),
            dict(alert.annotations),
            alert.starts_at / 1000.0,
            alert.ends_at / 1000.0,
            alert.generator_url,
        )

    @property
    def key(self) -> LabelKey:
        return label_key(self.labels)

    def resolved(self, now: float) -> bool:
        return self.ends_at <= now

    def payload(self) -> dict[str, object]:
        body: dict[str, object] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_at),
            "endsAt": rfc3339(self.ends_at),
        }
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body


class OutgoingMs(Protocol):
    """An alert due for sending with its times in epoch ms (``rules.group.OutgoingAlert``)."""

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...

    @property
    def starts_at(self) -> int: ...

    @property
    def ends_at(self) -> int: ...

    @property
    def generator_url(self) -> str: ...


class RuleAlert(Protocol):
    """What the evaluator knows of one alert of a rule (firing, pending, or resolved and kept
    for ``resolved_retention`` as Prometheus keeps it)."""

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...

    @property
    def state(self) -> AlertState: ...

    @property
    def fired_at(self) -> float | None: ...

    @property
    def resolved_at(self) -> float | None: ...


@dataclass
class _Sent:
    last_sent_at: float
    resolved_at: float | None


class Resender:
    """Which alerts are due to be sent at an evaluation: Prometheus's ``needsSending``, keyed
    by (rule, label set). Not thread-safe: the evaluator calls it from its group's thread."""

    def __init__(
        self,
        resend_delay_s: float = RESEND_DELAY_S,
        resolved_retention_s: float = RESOLVED_RETENTION_S,
    ) -> None:
        if not resend_delay_s > 0 or not resolved_retention_s >= 0:
            raise ConfigError(
                f"resend delay {resend_delay_s} s and resolved retention {resolved_retention_s}"
                " s: the delay must be positive and the retention not negative (defaults 60, 900)"
            )
        self.resend_delay_s = resend_delay_s
        self.resolved_retention_s = resolved_retention_s
        self._sent: dict[tuple[str, LabelKey], _Sent] = {}

    def due(
        self,
        rule: str,
        alerts: Iterable[RuleAlert],
        now: float,
        interval_s: float,
        url: str = "",
    ) -> list[Alert]:
        """The alerts of ``rule`` to send at ``now`` (its group's ``interval_s``), marked sent."""
        out: list[Alert] = []
        seen: set[LabelKey] = set()
        valid_for = 4 * max(self.resend_delay_s, interval_s)
        for alert in alerts:
            key = label_key(alert.labels)
            seen.add(key)
            if alert.state == "pending" or alert.fired_at is None:
                continue
            resolved_at = alert.resolved_at
            if resolved_at is not None and now - resolved_at > self.resolved_retention_s:
                continue
            sent = self._sent.get((rule, key))
            newly_resolved = resolved_at is not None and (
                sent is None or sent.resolved_at != resolved_at
            )
            recent = sent is not None and now - sent.last_sent_at <= self.resend_delay_s
            if recent and not newly_resolved:
                continue
            self._sent[(rule, key)] = _Sent(now, resolved_at)
            ends_at = resolved_at if resolved_at is not None else now + valid_for
            out.append(
                Alert(dict(alert.labels), dict(alert.annotations), alert.fired_at, ends_at, url)
            )
        for stale in [k for k in self._sent if k[0] == rule and k[1] not in seen]:
            del self._sent[stale]
        return out

    def forget(self, rule: str) -> None:
        """A rule removed by a reload: its bookkeeping goes with it."""
        for key in [k for k in self._sent if k[0] == rule]:
            del self._sent[key]


# --------------------------------------------------------------------------- credentials, TLS
class AlertmanagerAuth(ClientAuth):
    """The credentials for one Alertmanager (:class:`~metricvault.client_auth.ClientAuth`):
    none, a bearer token or basic auth, directly, from a file (re-read on a 401) or as
    ``user:password@`` in the URL."""

    def __init__(
        self,
        *,
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        basic_auth: tuple[str, str] | None = None,
        basic_auth_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            bearer_token=bearer_token,
            bearer_token_file=bearer_token_file,
            basic_auth=basic_auth,
            basic_auth_file=basic_auth_file,
            purpose="alertmanager",
            hint="a bearer token, a credential file or user:password@ in the URL",
        )


def _ssl_context(verify_tls: bool | str, client_cert: str, client_key: str) -> ssl.SSLContext:
    """``True``: the system's CAs; a path: that CA bundle; ``False``: no verification."""
    import ssl

    context = (
        ssl.create_default_context(cafile=verify_tls)
        if isinstance(verify_tls, str)
        else ssl.create_default_context()
    )
    if verify_tls is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        context.load_cert_chain(client_cert, client_key or None)
    return context


@dataclass(frozen=True)
class AlertmanagerTarget:
    """One Alertmanager: its base URL (``http://am:9093``, ``/api/v2/alerts`` is added) and how
    to reach it."""

    url: str
    auth: AlertmanagerAuth = field(default_factory=AlertmanagerAuth)
    verify_tls: bool | str = True
    client_cert: str = ""
    client_key: str = ""
    timeout_s: float = TIMEOUT_S

    @classmethod
    def parse(cls, url: str, **options: object) -> AlertmanagerTarget:
        """A target from a URL, ``user:password@`` in it becoming basic auth; a bad URL is a
        ConfigError saying what a good one looks like."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"alertmanager URL {url!r} is not an http:// or https:// URL "
                "(e.g. http://127.0.0.1:9093)"
            )
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ConfigError(f"alertmanager URL {url!r}: {exc}") from exc
        if "@" in parts.netloc:
            userinfo, _, hostport = parts.netloc.rpartition("@")
            user, _, password = userinfo.partition(":")
            if "auth" in options:
                raise ConfigError(f"alertmanager URL {url!r} has credentials and auth was given")
            options["auth"] = AlertmanagerAuth(basic_auth=(unquote(user), unquote(password)))
            parts = parts._replace(netloc=hostport)
        return cls(urlunsplit(parts).rstrip("/"), **options)  # type: ignore[arg-type]

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith(API_PATH) else base + API_PATH

    def __str__(self) -> str:
        return self.url


# --------------------------------------------------------------------------- delivery
@dataclass
class TargetStats:
    queue_length: int = 0
    sent: int = 0  # alerts Alertmanager accepted
    failed_attempts: int = 0  # requests that failed and were (or will be) retried
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> alerts
    last_error: str = ""


class _Queue:
    """The newest state of each alert not yet delivered to one Alertmanager, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: OrderedDict[LabelKey, Alert] = OrderedDict()

    def put(self, alert: Alert, now: float, stats: TargetStats) -> None:
        key = alert.key
        if key in self.items:
            self.items[key] = alert  # keep its place: a resend must not be starved
            return
        if len(self.items) >= self.capacity:
            victim = next((k for k, a in self.items.items() if a.resolved(now)), None)
            reason = "queue_full_resolved"
            if victim is None:
                victim, reason = next(iter(self.items)), "queue_full_firing"
            del self.items[victim]
            stats.dropped[reason] = stats.dropped.get(reason, 0) + 1
        self.items[key] = alert

    def head(self, count: int) -> list[Alert]:
        out = []
        for alert in self.items.values():
            out.append(alert)
            if len(out) == count:
                break
        return out

    def delivered(self, batch: Sequence[Alert]) -> None:
        """Remove what was sent, unless a newer state replaced it meanwhile."""
        for alert in batch:
            if self.items.get(alert.key) is alert:
                del self.items[alert.key]


class _Worker:
    def __init__(self, target: AlertmanagerTarget, capacity: int, notifier: Notifier) -> None:
        self.target = target
        self.queue = _Queue(capacity)
        self.stats = TargetStats()
        self.notifier = notifier
        self.context = (
            _ssl_context(target.verify_tls, target.client_cert, target.client_key)
            if target.url.startswith("https:")
            else None
        )
        self.wake = threading.Condition(notifier._lock)
        self.backoff_s = 0.0
        self.thread = threading.Thread(
            target=self._run, name=f"alertmanager {target.url}", daemon=True
        )

    def _run(self) -> None:
        lock = self.notifier._lock
        while True:
            with lock:
                while not self.queue.items and not self.notifier._closing:
                    self.wake.wait()
                if self.notifier._closing and (not self.queue.items or self.notifier._abandon):
                    return
                batch = self.queue.head(MAX_BATCH)
            outcome = self._post(batch)
            with lock:
                if outcome in ("ok", "drop"):
                    self.queue.delivered(batch)
                    if outcome == "ok":
                        self.stats.sent += len(batch)
                    else:
                        self.stats.dropped["rejected"] = self.stats.dropped.get(
                            "rejected", 0
                        ) + len(batch)
                    self.backoff_s = 0.0
                else:
                    self.stats.failed_attempts += 1
                    self.backoff_s = min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, self.backoff_s * 2))
                self.stats.queue_length = len(self.queue.items)
                self.notifier._changed(self)
                if outcome == "retry" and not self.notifier._closing:
                    self.wake.wait(self.backoff_s)  # woken early only by close()
                elif outcome == "retry":
                    return  # closing with an Alertmanager down: give up on the rest

    def _post(self, batch: Sequence[Alert]) -> Literal["ok", "drop", "retry"]:
        body = json.dumps([alert.payload() for alert in batch]).encode()
        for attempt in (1, 2):
            try:
                status, text = self._request(body)
            except (OSError, http.client.HTTPException) as exc:
                self._error(f"{type(exc).__name__}: {exc}")
                return "retry"
            if status == 401 and attempt == 1 and self.target.auth.reload():
                continue
            break
        if 200 <= status < 300:
            return "ok"
        self._error(f"HTTP {status}: {text[:200]}")
        if status == 400:
            log.error(
                "alertmanager %s refused %d alerts (HTTP 400: %s): dropped, as Prometheus does",
                self.target.url, len(batch), text[:200],
            )  # fmt: skip
            return "drop"
        return "retry"

    def _request(self, body: bytes) -> tuple[int, str]:
        parts = urlsplit(self.target.endpoint)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.target.timeout_s,
                context=self.context,
            )  # fmt: skip
        else:
            conn = http.client.HTTPConnection(
                parts.hostname or "", parts.port, timeout=self.target.timeout_s
            )
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **self.target.auth.headers(),
        }
        try:
            conn.request("POST", parts.path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def _error(self, message: str) -> None:
        if message != self.stats.last_error:
            log.warning("alertmanager %s: %s (kept queued, retrying)", self.target.url, message)
        self.stats.last_error = message


class Notifier:
    """Sends alerts to every configured Alertmanager, each through its own queue and thread.

    ``on_change(url, stats)`` is called (under the notifier's lock, keep it short) after every
    attempt, so the gateway's metrics can show the queue depth."""

    def __init__(
        self,
        targets: Sequence[AlertmanagerTarget | str],
        *,
        capacity: int = QUEUE_CAPACITY,
        external_labels: Mapping[str, str] | None = None,
        on_change: Callable[[str, TargetStats], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ConfigError(f"alertmanager queue capacity {capacity}: must be at least 1")
        self._lock = threading.Lock()
        self._closing = False
        self._abandon = False
        self._external = dict(external_labels or {})
        self._on_change = on_change
        parsed = [
            t if isinstance(t, AlertmanagerTarget) else AlertmanagerTarget.parse(t) for t in targets
        ]
        self._workers = [_Worker(target, capacity, self) for target in parsed]
        for worker in self._workers:
            worker.thread.start()

    @property
    def targets(self) -> list[AlertmanagerTarget]:
        return [worker.target for worker in self._workers]

    def send(self, alerts: Iterable[Alert], now: float | None = None) -> None:
        """Queue alerts for every Alertmanager; returns at once."""
        now = time.time() if now is None else now
        batch = [self._with_external(alert) for alert in alerts]
        if not batch or not self._workers:
            return
        with self._lock:
            for worker in self._workers:
                for alert in batch:
                    worker.queue.put(alert, now, worker.stats)
                worker.stats.queue_length = len(worker.queue.items)
                self._changed(worker)
                worker.wake.notify()

    def stats(self) -> dict[str, TargetStats]:
        with self._lock:
            return {
                w.target.url: TargetStats(
                    len(w.queue.items),
                    w.stats.sent,
                    w.stats.failed_attempts,
                    dict(w.stats.dropped),
                    w.stats.last_error,
                )
                for w in self._workers
            }

    def queue_length(self) -> int:
        with self._lock:
            return sum(len(w.queue.items) for w in self._workers)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty (or ``timeout_s`` passed); True when empty."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.queue_length() == 0:
                return True
            time.sleep(0.02)
        return self.queue_length() == 0

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop: try to deliver what is queued within ``timeout_s``, then give up on the rest."""
        self.drain(timeout_s)
        with self._lock:
            self._closing = True
            self._abandon = True
            for worker in self._workers:
                worker.wake.notify_all()
        for worker in self._workers:
            worker.thread.join(timeout=max(1.0, self._workers[0].target.timeout_s + 1))

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _with_external(self, alert: Alert) -> Alert:
        if not self._external:
            return alert
        labels = {**self._external, **alert.labels}  # the alert's own labels win
        return Alert(labels, alert.annotations, alert.starts_at, alert.ends_at, alert.generator_url)

    def _changed(self, worker: _Worker) -> None:
        if self._on_change is not None:
            try:
                self._on_change(worker.target.url, worker.stats)
            except Exception:  # a metrics hook must never stop delivery
                log.exception("alertmanager metrics hook failed")


def targets_from_urls(urls: Iterable[str], **options: object) -> list[AlertmanagerTarget]:
    """Targets for ``--alertmanager URL`` flags / the ``alertmanagers`` setting (deduplicated,
    in order)."""
    out: dict[str, AlertmanagerTarget] = {}
    for url in urls:
        target = AlertmanagerTarget.parse(url, **options)
        out.setdefault(target.url, target)
    return list(out.values())
