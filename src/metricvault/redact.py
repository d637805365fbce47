"""Keeping secrets out of every output: ``metricvault config``, logs, error messages.

Secrets are the settings that hold one (``s3_secret_key``), the password of any URL
(``influxdb://user:pass@host/db``) and the secret environment variables the store reads.
:func:`redact` replaces each known secret and every URL password with ``***``; the gateway's
log handlers format through :class:`RedactingFormatter`, so a traceback that happens to
contain one is scrubbed too.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

MASK = "***"
SECRET_SETTINGS = ("s3_secret_key",)
SECRET_ENV = ("METRICVAULT_S3_SECRET_KEY", "METRICVAULT_INFLUX_PASSWORD", "AWS_SECRET_ACCESS_KEY")
SHORTEST_SECRET = 3  # shorter strings would mask ordinary text; they are no protection anyway
# scheme://user:password@ — the password is everything up to the last '@' of the authority
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^/\s]*@")

_known: set[str] = set()


def remember(settings: Any) -> None:
    """Add the secrets of ``settings`` (and the secret environment) to what is masked."""
    for name in SECRET_SETTINGS:
        _add(str(getattr(settings, name, "") or ""))
    for name in ("data", "s3_endpoint"):
        _add(url_password(str(getattr(settings, name, "") or "")))


def _add(secret: str) -> None:
    if len(secret) >= SHORTEST_SECRET:
        _known.update({secret, urllib.parse.quote(secret, safe="")})


def url_password(url: str) -> str:
    try:
        return urllib.parse.unquote(urllib.parse.urlsplit(url).password or "")
    except ValueError:
        return ""


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo replaced by ``***`` (a userinfo without a
    colon is a token: all of it is replaced), for logs and error messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, _ = userinfo.partition(":")
    netloc = f"{user}:{MASK}@{hostport}" if sep else f"{MASK}@{hostport}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def secrets(extra: Iterable[str] = ()) -> list[str]:
    env = [os.environ.get(name, "") for name in SECRET_ENV]
    found = {s for s in (*_known, *env, *extra) if len(s) >= SHORTEST_SECRET}
    return sorted(found, key=len, reverse=True)  # longest first: no partial leftovers


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every URL password and every known secret replaced by ``***``."""
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
    for secret in secrets(extra):
        text = text.replace(secret, MASK)
    return text


def setting_for_display(name: str, value: Any) -> str:
    """How ``metricvault config`` shows a setting's value."""
    if name in SECRET_SETTINGS and value:
        return repr(MASK)
    return redact(repr(value))


class RedactingFormatter(logging.Formatter):
    """Formats with the handler's own formatter, then masks secrets (tracebacks included)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def redact_logs(logger_names: Iterable[str] = ("", "uvicorn", "uvicorn.error")) -> None:
    """Wrap the formatter of every handler of these loggers in :class:`RedactingFormatter`."""
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not isinstance(handler.formatter, RedactingFormatter):
                handler.setFormatter(RedactingFormatter(handler.formatter))
