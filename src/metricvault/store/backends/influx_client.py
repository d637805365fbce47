"""Talking to InfluxDB 1.x over HTTP: the ``influxdb://`` URI, queries, writes, retries, errors.

Standard library only (``http.client``): one keep-alive connection per thread. Every request
we send is idempotent (InfluxQL reads and DDL, ``SELECT ... INTO`` and line-protocol writes,
where a point with the same series and time overwrites), so connection errors and 5xx answers
are retried with exponential backoff, a bounded number of times. InfluxDB's own messages are
kept in the errors we raise, translated to metricvault's hierarchy at this boundary.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from metricvault.errors import (
    ConfigError,
    InputError,
    MetricVaultError,
    NotFoundError,
    StorageError,
)
from metricvault.redact import redact_url

log = logging.getLogger("metricvault")

SCHEMES = {"influxdb": "http", "influxdbs": "https"}
DEFAULT_PORT = 8086
USER_ENV, PASSWORD_ENV = "METRICVAULT_INFLUX_USER", "METRICVAULT_INFLUX_PASSWORD"
SETUP_HINT = "create it with `metricvault influx setup --url {uri}`"


@dataclass(frozen=True)
class InfluxTarget:
    """Where the database is: parsed from ``influxdb[s]://[user[:pass]@]host[:port]/db``."""

    scheme: str  # http or https
    host: str
    port: int
    database: str
    user: str = ""
    password: str = ""
    ca_file: str = ""  # ?ca=/path/ca.pem: trust this CA for influxdbs:// (else the system's)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def uri(self) -> str:
        """The URI without the password (for messages and ``stats()``)."""
        scheme = "influxdbs" if self.scheme == "https" else "influxdb"
        user = f"{urllib.parse.quote(self.user, safe='')}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{user}{host}:{self.port}/{self.database}"


def is_influx_uri(uri: str) -> bool:
    return uri.split("://", 1)[0].lower() in SCHEMES if "://" in uri else False


def parse_uri(uri: str, env: Mapping[str, str] | None = None) -> InfluxTarget:
    """Parse the URI; credentials missing from it come from ``METRICVAULT_INFLUX_USER`` /
    ``METRICVAULT_INFLUX_PASSWORD``."""
    env = os.environ if env is None else env
    parts = urllib.parse.urlsplit(uri)
    scheme = SCHEMES.get(parts.scheme.lower())
    example = "influxdb://user:pass@127.0.0.1:8086/gpu_metrics_db"
    if scheme is None:
        raise ConfigError(f"{uri!r} is not an InfluxDB URI: use {example} (influxdbs:// for TLS)")
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not parts.hostname or not database or "/" in database:
        raise ConfigError(
            f"InfluxDB URI {redact_url(uri)!r} needs a host and exactly one database name as its "
            f"path, e.g. {example}"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ConfigError(f"InfluxDB URI {redact_url(uri)!r} has an invalid port: {exc}") from exc
    options = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(options) - {"ca"})
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} in InfluxDB URI {redact_url(uri)!r}; the only "
            "option is ?ca=/path/to/ca.pem (a CA to trust for influxdbs://)"
        )
    user = urllib.parse.unquote(parts.username or "") or env.get(USER_ENV, "")
    password = urllib.parse.unquote(parts.password or "") or env.get(PASSWORD_ENV, "")
    return InfluxTarget(
        scheme, parts.hostname, port, database, user, password, options.get("ca", [""])[-1]
    )


# --------------------------------------------------------------------------- InfluxQL text
def ident(name: str) -> str:
    """A double-quoted InfluxQL identifier (database, policy, measurement, tag key)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(text: str) -> str:
    """A single-quoted InfluxQL string literal (tag values in WHERE)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# --------------------------------------------------------------------------- HTTP
class InfluxClient:
    """Queries and writes against one database; thread-safe (a connection per thread)."""

    def __init__(
        self,
        target: InfluxTarget,
        *,
        timeout_s: float = 30.0,
        attempts: int = 5,
        backoff_s: float = 0.1,
        max_backoff_s: float = 4.0,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._local = threading.local()
        self._ssl = self._ssl_context() if target.scheme == "https" else None

    def _ssl_context(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=self.target.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the CA file {self.target.ca_file!r} given in ?ca= of "
                f"{self.target.uri}: {exc}"
            ) from exc

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ------------------------------------------------------------------ requests
    def query(
        self,
        statement: str,
        *,
        epoch: str = "ms",
        database: bool = True,
        exact_floats: bool = False,
        chunked: bool = False,
    ) -> list[dict[str, Any]]:
        """Run InfluxQL (several statements may be joined by ';'); the ``results`` list.

        ``exact_floats`` parses integers in the answer as floats: Go writes ``-0.0`` as ``-0``
        and 1e17 as ``100000000000000000``, which must come back as the same float64."""
        params = {"q": statement, "epoch": epoch}
        if database:
            params["db"] = self.target.database
        if chunked:  # the server streams JSON documents, one per line, bounding its memory
            params.update(chunked="true", chunk_size="20000")
        body = urllib.parse.urlencode(params).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        status, data = self._request("POST", "/query", body, headers)
        if status != 200:
            raise self._http_error(status, data, f"InfluxQL {_short(statement)!r}")
        results = _decode_results(data, exact_floats)
        for result in results:
            if "error" in result:
                raise self._query_error(str(result["error"]), statement)
        return results

    def series(self, statement: str, **kwargs: Any) -> list[dict[str, Any]]:
        """The result series of a one-statement query, partial chunks joined per series."""
        results = self.query(statement, chunked=True, **kwargs)
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for result in results:
            for series in result.get("series", []):
                key = (series.get("name", ""), json.dumps(series.get("tags"), sort_keys=True))
                known = merged.get(key)
                if known is None:
                    merged[key] = {**series, "values": list(series.get("values", []))}
                else:
                    known["values"].extend(series.get("values", []))
        return list(merged.values())

    def write(self, body: bytes | Callable[[], bytes], rp: str, precision: str = "ms") -> None:
        """POST line protocol; durable once this returns (InfluxDB acknowledged it).

        ``body`` may be a function, called for each attempt (markers stamp the send time)."""
        query = urllib.parse.urlencode(
            {"db": self.target.database, "rp": rp, "precision": precision}
        )
        status, data = self._request(
            "POST", f"/write?{query}", body, {"Content-Type": "text/plain; charset=utf-8"}
        )
        if status != 204:
            raise self._http_error(status, data, f"the write to {rp}")

    def ping(self) -> str:
        """The server's version (``X-Influxdb-Version``)."""
        status, _ = self._request("GET", "/ping", b"", {})
        if status != 204:
            raise StorageError(f"{self.target.base_url}/ping answered HTTP {status}, not 204")
        return str(getattr(self._local, "version", ""))

    def _request(
        self, method: str, path: str, body: bytes | Callable[[], bytes], headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """Send with bounded retries on connection errors and 5xx; (status, body)."""
        last = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            payload = body() if callable(body) else body
            try:
                status, data = self._send(method, path, payload, headers)
            except ssl.SSLCertVerificationError as exc:  # retrying cannot help
                self.close()
                raise ConfigError(
                    f"TLS verification of {self.target.base_url} failed ({exc.verify_message}): "
                    "give the CA that signed its certificate with ?ca=/path/ca.pem in the URI"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()  # the connection may be half-dead; open a fresh one next time
                last = f"{type(exc).__name__}: {exc}"
                log.debug("InfluxDB %s %s failed (%s); retrying", method, path, last)
                continue
            if status < 500:
                return status, data
            last = f"HTTP {status}: {_message(data)}"
            log.warning("InfluxDB answered %s to %s %s; retrying", last, method, path)
        raise StorageError(
            f"InfluxDB at {self.target.base_url} did not accept {method} {path.split('?')[0]} "
            f"after {self.attempts} attempts (last: {last}); check that influxd is running and "
            f"the URI {self.target.uri} is right. Nothing is acknowledged until it succeeds"
        )

    def _send(
        self, method: str, path: str, payload: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        conn = self._connection()
        all_headers = {**headers, **self._auth_header()}
        conn.request(method, path, body=payload or None, headers=all_headers)
        resp = conn.getresponse()
        data = resp.read()
        self._local.version = resp.getheader("X-Influxdb-Version", "")
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return resp.status, data

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            t = self.target
            if self._ssl is not None:
                conn = http.client.HTTPSConnection(
                    t.host, t.port, timeout=self.timeout_s, context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(t.host, t.port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def _auth_header(self) -> dict[str, str]:
        if not self.target.user:
            return {}
        token = f"{self.target.user}:{self.target.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(token).decode()}

    # ------------------------------------------------------------------ errors
    def _http_error(self, status: int, data: bytes, what: str) -> MetricVaultError:
        message = _message(data)
        uri = self.target.uri
        if status in (401, 403):
            return ConfigError(
                f"InfluxDB at {self.target.base_url} refused {what} for user "
                f"{self.target.user or '(none)'} (HTTP {status}: {message}): put the right "
                f"user:password in the URI or in {USER_ENV}/{PASSWORD_ENV}, and grant the user "
                f"access to database {self.target.database!r}"
            )
        if status == 404 and "database not found" in message:
            return NotFoundError(
                f"database {self.target.database!r} does not exist on {self.target.base_url}: "
                + SETUP_HINT.format(uri=uri)
            )
        return InputError(f"InfluxDB refused {what} (HTTP {status}): {message}")

    def _query_error(self, message: str, statement: str) -> MetricVaultError:
        uri = self.target.uri
        if "database not found" in message:
            return NotFoundError(
                f"database {self.target.database!r} does not exist on {self.target.base_url}: "
                + SETUP_HINT.format(uri=uri)
            )
        if "retention policy not found" in message:
            return NotFoundError(
                f"InfluxDB says {message!r} in database {self.target.database!r}: "
                + SETUP_HINT.format(uri=uri)
            )
        if "authorized" in message or "authentication" in message:
            return self._http_error(403, json.dumps({"error": message}).encode(), "a query")
        return InputError(f"InfluxDB refused InfluxQL {_short(statement)!r}: {message}")


def _decode_results(data: bytes, exact_floats: bool) -> list[dict[str, Any]]:
    """One JSON document, or (chunked) one per line; their ``results`` concatenated."""
    parse_int = float if exact_floats else None
    results: list[dict[str, Any]] = []
    for line in data.splitlines():
        if line.strip():
            doc = json.loads(line, parse_int=parse_int)
            if "error" in doc:  # a whole-request error inside a 200 (chunked answers)
                results.append({"error": doc["error"]})
            results.extend(doc.get("results", []))
    return results


def _message(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    try:
        return str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        return text[:500]


def _short(statement: str, limit: int = 300) -> str:
    return statement if len(statement) <= limit else statement[:limit] + "..."
