"""The agent's push mode: Prometheus remote-write 1.0 to the gateway, through an on-disk spool.

:func:`encode_write_request` (from ``metricvault.wire.remote_write``) turns samples into a
request body; :func:`samples_from_registry` reads them from a prometheus-client registry.
:class:`PushClient` spools every body first (``submit``), then a sender thread delivers the
spool in order, one request at a time, and deletes an entry only once the gateway answered 2xx
(stored) or a 4xx (it can never succeed).
Everything else is retried with the same bytes, so delivery is at-least-once; the gateway stores
a re-sent sample once, which makes the end result exactly-once.

Only the standard library's ``http.client`` talks HTTP: the agent needs no HTTP package, and
importing this module pulls in neither pyarrow nor numpy (the agent's memory budget is small).

Clock: samples carry the agent's wall-clock time. The client estimates its offset to the
gateway's clock (:func:`estimate_clock_offset`, the NTP round-trip method over
``GET /-/healthy``) and, when the clock is *confidently* off by more than
``correct_clock_above_s``, shifts the timestamps of what it submits by that offset.
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import math
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from metricvault import __version__
from metricvault.client_auth import ClientAuth
from metricvault.collect.spool import SPOOL_DROP_REASONS, Spool
from metricvault.redact import redact_url
from metricvault.wire.remote_write import (  # the encoder sits beside the decoder it mirrors
    SERVER_TIME_HEADER,
    SampleTuple,
    encode_write_request,
)

if TYPE_CHECKING:
    import ssl

    from prometheus_client import CollectorRegistry
    from prometheus_client.samples import Timestamp

    from metricvault.collect.families import Metric

__all__ = [
    "SERVER_TIME_HEADER",
    "USER_AGENT",
    "PushClient",
    "RegistrySamples",
    "SampleTuple",
    "encode_write_request",
    "estimate_clock_offset",
    "samples_from_families",
    "samples_from_registry",
]

log = logging.getLogger("metricvault.agent.push")

USER_AGENT = f"metricvault-agent/{__version__}"
WRITE_PATH = "/api/v1/write"
PROTOCOL_HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": USER_AGENT,
}

# Without SERVER_TIME_HEADER only Date tells the server's time. uvicorn (the gateway's server)
# renders Date once a second and truncates it to the second, so the server's time is in
# [Date, Date + 2 s): take the middle, +-1 s.
DATE_CENTER_S = 1.0
DATE_UNCERTAINTY_S = 1.0
CLOCK_SAMPLES = 5
CLOCK_TIMEOUT_S = 5.0
CLOCK_RETRY_S = 30.0  # after a failed estimate (gateway down): try again this much later
IDLE_POLL_S = 1.0  # the sender wakes this often with nothing to send (clock checks)
RETRY_AFTER_CAP_S = 300.0  # a Retry-After longer than this is taken as this
MIN_REQUEST_TIMEOUT_S = 0.05
JOIN_GRACE_S = 1.0
MAX_SHOWN_MESSAGE = 300
# Answers that say "later": retried with the same bytes.
RETRY_STATUSES = frozenset({408, 425, 429})
# Answers that may be about one request's content (checked with an empty request first).
BATCH_STATUSES = frozenset({400, 413})
EMPTY_REQUEST = b"\x00"  # a snappy-compressed empty WriteRequest: valid, stores nothing

_CREATED_FAMILIES = frozenset({"counter", "histogram", "summary"})
_NO_LABELS: Mapping[str, str] = MappingProxyType({})
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
# A keep-alive connection the server closed while it was idle fails like this on reuse.
_STALE_CONNECTION = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)


class RegistrySamples(list[SampleTuple]):
    """What :func:`samples_from_registry` returns: the samples, and how many were left out."""

    non_finite: int = 0  # NaN and +-Inf samples skipped (the gateway would drop them)


def samples_from_registry(
    registry: CollectorRegistry, now_ms: int, extra_labels: Mapping[str, str] = _NO_LABELS
) -> RegistrySamples:
    """Every sample of every family in ``registry`` (as an exposition would show them:
    counters as ``_total``, histograms as ``_bucket``/``_sum``/``_count``), without the
    ``_created`` companions and native histograms. A sample's timestamp is its own when it has
    one, else ``now_ms``. ``extra_labels`` win over a sample's labels of the same name, which
    are kept as ``exported_<name>`` (Prometheus's ``honor_labels: false``)."""
    return samples_from_families(registry.collect(), now_ms, extra_labels)


def samples_from_families(
    families: Iterable[Any], now_ms: int, extra_labels: Mapping[str, str] = _NO_LABELS
) -> RegistrySamples:
    """:func:`samples_from_registry` of the families themselves (the edge agent has no
    registry: it collects its sources directly)."""
    out = RegistrySamples()
    for family in families:
        created = f"{family.name}_created" if family.type in _CREATED_FAMILIES else None
        for sample in family.samples:
            if sample.name == created or sample.native_histogram is not None:
                continue
            if not math.isfinite(sample.value):
                out.non_finite += 1
                continue
            timestamp = now_ms if sample.timestamp is None else _timestamp_ms(sample.timestamp)
            labels = _with_extra(sample.labels, extra_labels)
            out.append((sample.name, labels, timestamp, float(sample.value)))
    return out


def _timestamp_ms(timestamp: float | Timestamp) -> int:
    if isinstance(timestamp, int | float):
        return round(timestamp * 1000)
    return timestamp.sec * 1000 + timestamp.nsec // 1_000_000


def _with_extra(labels: Mapping[str, str], extra: Mapping[str, str]) -> Mapping[str, str]:
    if not extra:
        return labels
    merged = {(f"exported_{k}" if k in extra else k): v for k, v in labels.items()}
    merged.update(extra)
    return merged


# --------------------------------------------------------------------------- HTTP
@dataclass(frozen=True)
class _Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def message(self) -> str:
        text = self.body.decode("utf-8", "replace").strip()
        return text[:MAX_SHOWN_MESSAGE] + ("..." if len(text) > MAX_SHOWN_MESSAGE else "")


class _Http:
    """One keep-alive connection to one URL; not thread-safe (one user thread)."""

    def __init__(self, url: str, context: ssl.SSLContext | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.url = url
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.context = context
        self._conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> _Response:
        reused = self._conn is not None
        try:
            return self._exchange(method, body, headers, timeout)
        except _STALE_CONNECTION:
            if not reused:
                raise
            # the server closed the idle connection: once more on a fresh one (a re-sent
            # write is stored once, so this is safe even if the first one arrived)
            return self._exchange(method, body, headers, timeout)

    def _exchange(
        self, method: str, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> _Response:
        conn = self._connection(timeout)
        try:
            conn.request(method, self.target, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
        except Exception:
            self.close()
            raise
        if response.will_close:
            self.close()
        return _Response(response.status, response.headers, data)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=timeout, context=self.context
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _ssl_context(verify_tls: bool | str) -> ssl.SSLContext:
    """``True``: the system's CAs; a path: that CA bundle; ``False``: no verification.

    ``ssl`` is imported here, for https only: it loads libssl and libcrypto (~4 MB of RSS),
    which an agent pushing over http (the edge agent) does without."""
    import ssl

    if isinstance(verify_tls, str):
        return ssl.create_default_context(cafile=verify_tls)
    context = ssl.create_default_context()
    if not verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _base_url(write_url: str) -> str:
    """``https://gw:9201/prefix`` from ``https://gw:9201/prefix/api/v1/write``."""
    parts = urlsplit(write_url)
    path = parts.path.rstrip("/")
    base = path.removesuffix(WRITE_PATH) if path.endswith(WRITE_PATH) else ""
    return f"{parts.scheme}://{parts.netloc}{base}"


# --------------------------------------------------------------------------- credentials
GATEWAY_TOKEN_ENV = "METRICVAULT_GATEWAY_TOKEN"  # the same variable metricvault.track reads


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(``url`` without userinfo, (user, password) from it or None); percent-escapes decoded
    (a ``@`` or ``:`` in a password is written ``%40`` / ``%3A``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=hostport)), (unquote(user), unquote(password))


class PushAuth(ClientAuth):
    """The push client's credentials (:class:`~metricvault.client_auth.ClientAuth`)."""

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> PushAuth:
        """A bearer token from ``METRICVAULT_GATEWAY_TOKEN`` if set, else no credentials."""
        token = env.get(GATEWAY_TOKEN_ENV, "").strip()
        return cls(bearer_token=token) if token else cls()


# --------------------------------------------------------------------------- clock
@dataclass(frozen=True)
class _ClockReading:
    offset: float  # server time - local time, seconds
    uncertainty: float
    rtt: float


def estimate_clock_offset(
    url_base: str,
    samples: int = CLOCK_SAMPLES,
    *,
    timeout_s: float = CLOCK_TIMEOUT_S,
    verify_tls: bool | str = True,
    headers: Mapping[str, str] | None = None,
) -> tuple[float, float]:
    """(offset, uncertainty) in seconds of the gateway's clock against this host's:
    ``local time + offset = gateway time``, within +-uncertainty.

    The round-trip method over ``GET {url_base}/-/healthy``: offset = server time - the midpoint
    of send and receive, uncertainty = rtt/2, from the sample with the smallest rtt. The server
    time comes from the ``X-Metricvault-Server-Time-Ms`` header, or, without it, from ``Date``
    (+-1 s more). Raises OSError, http.client.HTTPException or ValueError when no estimate can
    be made."""
    context = _ssl_context(verify_tls) if url_base.startswith("https:") else None
    http_ = _Http(url_base.rstrip("/") + "/-/healthy", context)
    try:
        return _estimate(http_, samples, timeout_s, headers or {})
    finally:
        http_.close()


def _estimate(
    http_: _Http, samples: int, timeout_s: float, headers: Mapping[str, str]
) -> tuple[float, float]:
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    # one connection: the first reading pays for connecting and is beaten by the others
    readings = [_read_clock(http_, timeout_s, headers) for _ in range(samples)]
    best = min(readings, key=lambda reading: reading.rtt)
    return best.offset, best.uncertainty


def _read_clock(http_: _Http, timeout_s: float, headers: Mapping[str, str]) -> _ClockReading:
    wall, started = time.time(), time.perf_counter()  # rtt from the monotonic clock
    response = http_.request("GET", None, headers, timeout_s)
    rtt = time.perf_counter() - started
    if response.status != 200:
        raise ValueError(f"GET {http_.url} answered HTTP {response.status}: {response.message}")
    server, resolution = _server_time(response.headers)
    return _ClockReading(server - (wall + rtt / 2), rtt / 2 + resolution, rtt)


def _server_time(headers: http.client.HTTPMessage) -> tuple[float, float]:
    """The server's time (epoch seconds) and how far off the header itself may be."""
    precise = headers.get(SERVER_TIME_HEADER)
    if precise:
        return float(precise) / 1000, 0.0
    date = headers.get("Date")
    if not date:
        raise ValueError(f"the answer carries neither {SERVER_TIME_HEADER} nor Date")
    try:
        return email.utils.parsedate_to_datetime(date).timestamp() + DATE_CENTER_S, (
            DATE_UNCERTAINTY_S
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"unreadable Date header {date!r}") from exc


# --------------------------------------------------------------------------- client
class PushClient:
    """Pushes submitted samples to a remote-write URL, in order, surviving gateway outages and
    agent restarts through ``spool``.

    ``correct_clock_above_s`` (default 0.5 s): timestamps are shifted by the estimated clock
    offset when the clock is off by more than this *beyond the estimate's uncertainty*
    (``|offset| - uncertainty > bound``). NTP-synced hosts are within milliseconds, so this
    never fires on a healthy host, and an uncertain estimate (a slow link, or a gateway that
    only sends Date) never moves data by mistake; past half a second a clock is broken, and the
    skew would be visible next to other hosts at the usual 1 s sampling. ``None`` disables the
    correction (the offset is still estimated and exported). ``clock_check_interval_s``: how
    often the offset is estimated (``None``: never).

    Credentials: ``auth`` (a :class:`PushAuth`), or ``bearer_token`` / ``basic_auth``, or the
    userinfo of ``url`` (``http://user:password@gw:9201/...``, taken out of the URL: the client's
    ``url`` never holds it, so it is safe to log). Give one.

    What the gateway answers decides what happens to the request at the head of the spool:

    - 2xx: stored, removed from the spool;
    - 408, 425, 429, 5xx, connection errors and timeouts: retried with the same bytes;
    - 400 and 413 name the request itself only when the endpoint accepts an *empty* request
      (a probe that stores nothing): then the request is dropped and counted under the reason
      ``http_400`` / ``http_413``; otherwise (a proxy's 400, say) they are treated like:
    - any other 4xx (401, 403, 404, 405, 415, ...): the configuration is wrong, not the data.
      Nothing is dropped; the error is logged once, loudly, with the fix, exported as
      ``metricvault_agent_push_config_error{code="..."} 1``, and the request is retried with
      backoff (a 401 first re-reads the credential file) until the configuration is fixed.

    ``check_endpoint_at_start``: the sender first sends the empty request and logs what is wrong
    (never fatal: the gateway may come up later).
    """

    def __init__(
        self,
        url: str,
        spool: Spool,
        *,
        timeout_s: float = 10.0,
        min_backoff_s: float = 0.1,
        max_backoff_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        auth: PushAuth | None = None,
        verify_tls: bool | str = True,
        correct_clock_above_s: float | None = 0.5,
        clock_check_interval_s: float | None = 300.0,
        check_endpoint_at_start: bool = True,
    ) -> None:
        if not 0 < min_backoff_s <= max_backoff_s:
            raise ValueError("need 0 < min_backoff_s <= max_backoff_s")
        url, userinfo = split_userinfo(url)
        if userinfo is not None:
            if basic_auth is not None or bearer_token is not None or auth is not None:
                raise ValueError(
                    f"the push URL {redact_url(url)} carries user:password and other "
                    "credentials were given too: give one"
                )
            basic_auth = userinfo
        if auth is None:
            auth = PushAuth(bearer_token=bearer_token, basic_auth=basic_auth)
        elif bearer_token is not None or basic_auth is not None:
            raise ValueError("give auth, or bearer_token / basic_auth, not both")
        self.url = url  # without userinfo: safe to log
        self.auth = auth
        self.check_endpoint_at_start = check_endpoint_at_start
        self.spool = spool
        self.timeout_s = timeout_s
        self.min_backoff_s, self.max_backoff_s = min_backoff_s, max_backoff_s
        self.correct_clock_above_s = correct_clock_above_s
        self.clock_check_interval_s = clock_check_interval_s
        context = _ssl_context(verify_tls) if url.startswith("https:") else None
        self._http = _Http(url, context)
        self._tls_context = context
        self._extra_headers = dict(headers or {})
        self._lock = threading.Lock()  # the counters, drops, config error and clock estimate
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._drops: dict[str, list[int]] = {}  # reason -> [requests, samples], not the spool's
        self._config_error: int | None = None  # the status of a refusal that is config's fault
        self._clock: tuple[float, float] | None = None
        self._shift_ms = 0
        self._work = threading.Event()  # something was submitted
        self._halt = threading.Event()  # stop() was called
        self._deadline = math.inf  # monotonic time when a stopping sender gives up
        self._next_clock_check = 0.0
        self._thread: threading.Thread | None = None
        self._rng = random.Random()

    # ------------------------------------------------------------------ public
    def submit(self, samples: Sequence[SampleTuple]) -> int | None:
        """Encode ``samples`` as one request and spool it (durable when this returns); the
        spool sequence number, or None when there was nothing to send (or it was too big for
        the spool). Timestamps are shifted by the clock correction in force, if any."""
        if not samples:
            return None
        shift = self._shift_ms
        if shift:
            samples = [(m, labels, t + shift, v) for m, labels, t, v in samples]
        seq = self.spool.append(encode_write_request(samples), len(samples))
        self._work.set()
        return seq

    def start(self) -> None:
        """Start the sender thread (it first estimates the clock offset)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the push client is already running")
        self._halt.clear()
        self._deadline = math.inf
        self._thread = threading.Thread(target=self._run, name="metricvault-push", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout_s: float = 5.0) -> bool:
        """Try for up to ``flush_timeout_s`` to deliver what is spooled, then stop the sender;
        what is left stays in the spool for the next start. True when the spool is empty."""
        thread = self._thread
        if thread is not None:
            self._deadline = time.monotonic() + max(0.0, flush_timeout_s)
            self._halt.set()
            self._work.set()
            thread.join(max(0.0, flush_timeout_s) + JOIN_GRACE_S)
            if thread.is_alive():
                log.warning("the push sender did not stop within %.1f s", flush_timeout_s)
            self._thread = None
        return self.spool.count == 0

    def check_clock(self) -> tuple[float, float]:
        """Estimate the clock offset now and update the correction; (offset, uncertainty).
        Raises like :func:`estimate_clock_offset`. The sender thread calls it every
        ``clock_check_interval_s``, first before its first request."""
        # a connection of its own, closed after: one check every few minutes needs no idle one
        http_ = _Http(_base_url(self.url) + "/-/healthy", self._tls_context)
        timeout = min(self.timeout_s, CLOCK_TIMEOUT_S)
        try:
            offset, uncertainty = _estimate(http_, CLOCK_SAMPLES, timeout, self._plain_headers())
        finally:
            http_.close()
        self._set_clock(offset, uncertainty)
        return offset, uncertainty

    def check_endpoint(self) -> int | None:
        """Send an empty remote_write request (it stores nothing) and log loudly what is wrong
        with the URL or the credentials; the HTTP status, or None when the receiver cannot be
        reached. Never raises for what the receiver answers: it may be fixed, or come up,
        later. The sender thread calls it once before its first request."""
        try:
            response = self._post(EMPTY_REQUEST)
        except _TRANSPORT_ERRORS as exc:
            log.warning(
                "push endpoint %s is not reachable yet (%s: %s); samples are spooled in %s "
                "until it is",
                self.url,
                type(exc).__name__,
                exc,
                self.spool.directory,
            )
            return None
        status = response.status
        if 200 <= status < 300:
            self._clear_config_error()
            log.info("push endpoint %s accepts remote_write (%s)", self.url, self.auth.description)
        elif status in RETRY_STATUSES or status >= 500:
            log.warning("push endpoint %s answered HTTP %d: %s", self.url, status, response.message)
        else:
            self._note_config_error(response)
        return status

    def count_dropped(self, reason: str, requests: int, samples: int) -> None:
        """Count data dropped before it reached the spool or at the gateway (exported under
        ``metricvault_agent_push_dropped_*{reason}`` with the spool's own drops)."""
        with self._lock:
            counts = self._drops.setdefault(reason, [0, 0])
            counts[0] += requests
            counts[1] += samples

    @property
    def config_error(self) -> int | None:
        """The HTTP status of a refusal that the configuration causes (401, 404, ...), while it
        lasts; None when the last answer was fine."""
        return self._config_error

    def dropped(self) -> dict[str, tuple[int, int]]:
        """(requests, samples) dropped by reason: the gateway's refusals and the spool's."""
        with self._lock:
            out = {reason: (r, n) for reason, (r, n) in self._drops.items()}
        for reason, (r, n) in self.spool.drops().items():
            before = out.get(reason, (0, 0))
            out[reason] = (before[0] + r, before[1] + n)
        return out

    # ------------------------------------------------------------------ counters
    @property
    def sent_samples(self) -> int:
        return self._counts["sent_samples"]

    @property
    def sent_requests(self) -> int:
        return self._counts["sent_requests"]

    @property
    def failed_attempts(self) -> int:
        """Attempts that failed and were retried (429, 5xx, connection errors, timeouts)."""
        return self._counts["failed_attempts"]

    @property
    def rejected_requests(self) -> int:
        """Requests the gateway refused for good (4xx other than 429), dropped."""
        return self._counts["rejected_requests"]

    @property
    def rejected_samples(self) -> int:
        return self._counts["rejected_samples"]

    @property
    def clock_offset_s(self) -> float | None:
        """The last estimate of gateway time - local time; None before the first."""
        return None if self._clock is None else self._clock[0]

    @property
    def clock_uncertainty_s(self) -> float | None:
        return None if self._clock is None else self._clock[1]

    @property
    def clock_correction_s(self) -> float:
        """The shift applied to submitted timestamps (0 when the clock is fine)."""
        return self._shift_ms / 1000

    def collect(self) -> Iterator[Metric]:
        """The agent's push self-metrics (prometheus-client custom-collector protocol)."""
        from metricvault.collect.families import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        with self._lock:
            counts, clock, config_error = dict(self._counts), self._clock, self._config_error
        for key, (name, help_text) in _COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=counts[key])
        info = InfoMetricFamily("metricvault_agent_push", "Where the agent pushes (no secrets)")
        info.add_metric([], {"url": self.url, "auth": self.auth.kind})
        yield info
        refused = GaugeMetricFamily(
            "metricvault_agent_push_config_error",
            "1 while the receiver refuses every request for a configuration reason (HTTP "
            "status in code: 401 credentials, 403 not allowed, 404/405 wrong URL, 415); the data "
            "stays spooled",
            labels=["code"],
        )
        if config_error is not None:
            refused.add_metric([str(config_error)], 1)
        yield refused
        dropped = self.dropped()
        for what, index in (("requests", 0), ("samples", 1)):
            family = CounterMetricFamily(
                f"metricvault_agent_push_dropped_{what}",
                f"{what.capitalize()} dropped unsent, by reason (spool_full, disk_full, "
                "larger_than_spool, unreadable, write_error, submit_error, http_400, http_413)",
                labels=["reason"],
            )
            for reason in sorted({*SPOOL_DROP_REASONS, *dropped}):
                family.add_metric([reason], dropped.get(reason, (0, 0))[index])
            yield family
        spool = self.spool
        gauges = [
            ("metricvault_agent_push_spool_requests", "Requests waiting in the spool", spool.count),
            ("metricvault_agent_push_spool_samples", "Samples waiting in the spool", spool.samples),
            ("metricvault_agent_push_spool_bytes", "Bytes waiting in the spool", spool.size_bytes),
            (
                "metricvault_agent_clock_correction_seconds",
                "Shift applied to pushed timestamps (0: the clock is fine)",
                self.clock_correction_s,
            ),
        ]
        if clock is not None:
            gauges += [
                (
                    "metricvault_agent_clock_offset_seconds",
                    "Estimated gateway clock minus this host's clock",
                    clock[0],
                ),
                (
                    "metricvault_agent_clock_offset_uncertainty_seconds",
                    "Uncertainty (+-) of the clock offset estimate",
                    clock[1],
                ),
            ]
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=value)
        for name, help_text, value in (
            (
                "metricvault_agent_spool_dropped_samples",
                "Samples the spool dropped unsent (full spool or full disk; by reason: "
                "metricvault_agent_push_dropped_samples_total)",
                spool.dropped_samples,
            ),
            (
                "metricvault_agent_spool_dropped_requests",
                "Requests the spool dropped unsent (full spool or full disk)",
                spool.dropped_requests,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)

    # ------------------------------------------------------------------ the sender thread
    def _run(self) -> None:
        attempt = 0  # failed attempts at the entry at the head of the spool
        try:
            if self.check_endpoint_at_start and not self._halt.is_set():
                self.check_endpoint()
            while time.monotonic() < self._deadline:
                self._check_clock_if_due()
                self._work.clear()  # before peek: a submit after it wakes the wait below
                entry = self.spool.peek()
                if entry is None:
                    if self._halt.is_set():
                        return
                    self._work.wait(IDLE_POLL_S)
                    continue
                delay = self._deliver(*entry, attempt)
                attempt = 0 if delay is None else attempt + 1
                if delay is not None:
                    self._pause(delay)
        except Exception:  # a bug must not silently stop delivery: say so loudly
            log.exception("the push sender stopped on an unexpected error")
        finally:
            self._http.close()

    def _deliver(self, seq: int, body: bytes, attempt: int) -> float | None:
        """One attempt; None when the entry is done with, else the delay before the next."""
        try:
            response = self._post(body)
        except _TRANSPORT_ERRORS as exc:
            return self._retry_later(attempt, f"{type(exc).__name__}: {exc}", None)
        status = response.status
        if 200 <= status < 300:
            self._delivered(seq, attempt)
            return None
        if status in RETRY_STATUSES or status >= 500:
            reason = f"HTTP {status}: {response.message}"
            return self._retry_later(attempt, reason, response.headers.get("Retry-After"))
        if status in BATCH_STATUSES:
            # A 400 from a proxy in front (plain HTTP to an HTTPS port, say) would refuse every
            # request: only when an empty request passes is it this request's own fault.
            try:
                probe = self._post(EMPTY_REQUEST)
            except _TRANSPORT_ERRORS as exc:
                return self._retry_later(attempt, f"{type(exc).__name__}: {exc}", None)
            if 200 <= probe.status < 300:
                self._refused(seq, response)
                return None
        return self._misconfigured(response, attempt)

    def _post(self, body: bytes) -> _Response:
        headers = {**self._plain_headers(), **PROTOCOL_HEADERS}
        return self._http.request("POST", body, headers, self._request_timeout())

    def _plain_headers(self) -> dict[str, str]:
        return {**self._extra_headers, **self.auth.headers()}

    def _delivered(self, seq: int, attempt: int) -> None:
        samples = self.spool.ack(seq)
        self._count(sent_samples=samples, sent_requests=1)
        self._clear_config_error()
        if attempt:
            log.info("push to %s works again after %d failed attempts", self.url, attempt)

    def _refused(self, seq: int, response: _Response) -> None:
        """A 400/413 for this request alone will come again however often it is sent: drop."""
        samples = self.spool.ack(seq)
        self._count(rejected_requests=1, rejected_samples=samples)
        self.count_dropped(f"http_{response.status}", 1, samples)
        log.error(
            "%s refused a request of %d samples with HTTP %d: %s; the request is dropped "
            "(an empty request is accepted, so it is this request's content)",
            self.url,
            samples,
            response.status,
            response.message,
        )

    def _misconfigured(self, response: _Response, attempt: int) -> float:
        """A refusal no request can get past: keep everything, say so once, retry slowly."""
        self._count(failed_attempts=1)
        if response.status == 401 and self.auth.reload():
            log.warning(
                "push to %s: HTTP 401; %s has changed: retrying with it",
                self.url,
                self.auth.description,
            )
            return 0.0
        self._note_config_error(response)
        return self._backoff(attempt)

    def _note_config_error(self, response: _Response) -> None:
        with self._lock:
            first = self._config_error != response.status
            self._config_error = response.status
        if not first:
            log.debug("push to %s still refused with HTTP %d", self.url, response.status)
            return
        hint = _CONFIG_HINTS.get(response.status, _OTHER_HINT).format(
            url=self.url, auth=self.auth.description
        )
        log.error(
            "push to %s refused with HTTP %d (%s): %s. Nothing is dropped: the %d spooled "
            "requests (%d samples) stay in %s and are retried every %.0f s at most; "
            'metricvault_agent_push_config_error{code="%d"} is 1 until this is fixed',
            self.url,
            response.status,
            response.message or "no message",
            hint,
            self.spool.count,
            self.spool.samples,
            self.spool.directory,
            self.max_backoff_s,
            response.status,
        )

    def _clear_config_error(self) -> None:
        with self._lock:
            code, self._config_error = self._config_error, None
        if code is not None:
            log.warning("push to %s works again (it answered HTTP %d before)", self.url, code)

    def _retry_later(self, attempt: int, reason: str, retry_after: str | None) -> float:
        self._count(failed_attempts=1)
        delay = _retry_after_s(retry_after)
        if delay is None:
            delay = self._backoff(attempt)
        level = logging.WARNING if attempt == 0 else logging.DEBUG  # once per outage
        log.log(level, "push to %s failed (%s); retrying in %.2f s", self.url, reason, delay)
        return delay

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter, between min_backoff_s and max_backoff_s."""
        ceiling = min(self.max_backoff_s, self.min_backoff_s * 2.0 ** min(attempt, 60))
        return self._rng.uniform(self.min_backoff_s, ceiling)

    def _pause(self, seconds: float) -> None:
        if not self._halt.is_set():
            self._halt.wait(seconds)  # stop() cuts a backoff short: the drain gets its tries
            return
        remaining = min(seconds, self._deadline - time.monotonic())
        if remaining > 0:
            time.sleep(remaining)

    def _request_timeout(self) -> float:
        remaining = self._deadline - time.monotonic()  # inf unless stopping
        return max(MIN_REQUEST_TIMEOUT_S, min(self.timeout_s, remaining))

    def _count(self, **increments: int) -> None:
        with self._lock:
            for key, n in increments.items():
                self._counts[key] += n

    # ------------------------------------------------------------------ clock
    def _check_clock_if_due(self) -> None:
        interval = self.clock_check_interval_s
        if interval is None or self._halt.is_set() or time.monotonic() < self._next_clock_check:
            return
        try:
            self.check_clock()
        except (*_TRANSPORT_ERRORS, ValueError) as exc:
            log.debug("cannot estimate the clock offset to %s: %s", self.url, exc)
            self._next_clock_check = time.monotonic() + min(interval, CLOCK_RETRY_S)
            return
        self._next_clock_check = time.monotonic() + interval

    def _set_clock(self, offset: float, uncertainty: float) -> None:
        bound = self.correct_clock_above_s
        off = bound is not None and abs(offset) - uncertainty > bound
        shift_ms = round(offset * 1000) if off else 0
        if bool(shift_ms) != bool(self._shift_ms):
            log.warning(
                "this host's clock is %+.3f s (+-%.3f s) off the gateway's: %s",
                -offset,
                uncertainty,
                "shifting pushed timestamps to the gateway's time"
                if shift_ms
                else "no longer shifting pushed timestamps",
            )
        with self._lock:
            self._clock = (offset, uncertainty)
            self._shift_ms = shift_ms


_COUNTERS: dict[str, tuple[str, str]] = {
    "sent_samples": ("metricvault_agent_push_sent_samples", "Samples the gateway stored (2xx)"),
    "sent_requests": ("metricvault_agent_push_sent_requests", "Requests the gateway stored"),
    "failed_attempts": (
        "metricvault_agent_push_failed_attempts",
        "Send attempts that failed and were retried (429, 5xx, connection errors, timeouts)",
    ),
    "rejected_requests": (
        "metricvault_agent_push_rejected_requests",
        "Requests the gateway refused for good (4xx other than 429), dropped",
    ),
    "rejected_samples": (
        "metricvault_agent_push_rejected_samples",
        "Samples in the requests the gateway refused for good",
    ),
}


_CONFIG_HINTS = {
    401: "the receiver wants credentials it does not accept from this agent (sent: {auth}); "
    "give --push-bearer-token-file, --push-basic-auth-file or user:password@ in the URL with "
    "a secret the gateway accepts (its auth_bearer_tokens / auth_basic_users, made with "
    "'metricvault hash-secret')",
    403: "the credentials ({auth}) are not allowed to write to {url}: use ones that are",
    404: "nothing receives remote_write at {url}: give a metricvault gateway's bare address "
    "(http://gateway:9201, its /api/v1/write is used) or the receiver's full remote_write URL",
    405: "{url} does not take POST, so it is not a remote_write endpoint: give the receiver's "
    "remote_write URL",
    415: "{url} does not take remote_write 1.0 (snappy-compressed protobuf): point --push at a "
    "Prometheus remote_write receiver",
}
_OTHER_HINT = (
    "{url} refuses even an empty remote_write request, so no request can pass: check --push"
)


def _retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date, read against
    ``now``, epoch seconds: the wall clock unless given)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            at = email.utils.parsedate_to_datetime(value).timestamp()
            seconds = at - (time.time() if now is None else now)
        except (TypeError, ValueError):
            return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_CAP_S)
