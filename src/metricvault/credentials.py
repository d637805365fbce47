"""Checking credentials: bearer tokens and HTTP basic auth, secrets stored only as SHA-256.

A leaf module, so that both the gateway (``ingest``) and the agent's ``/metrics`` endpoint
(``collect``, which must stay light) check a credential the same way without one importing
the other. Secrets are hashed on arrival and compared with :func:`hmac.compare_digest`
against every configured digest, so neither a match nor a miss leaks timing; no secret is
ever logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from metricvault.config import Settings
from metricvault.errors import AuthError


@dataclass(frozen=True)
class Principal:
    tenant: str  # "" when the credential maps to no tenant


ANONYMOUS = Principal("")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def authenticate(settings: Settings, authorization: str | None) -> Principal:
    """The principal behind an ``Authorization`` header, or AuthError. No credentials
    configured means the gateway is open (it listens on 127.0.0.1 by default)."""
    if not settings.auth_bearer_tokens and not settings.auth_basic_users:
        return ANONYMOUS
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and value:
        return _bearer(settings, value.strip())
    if scheme.lower() == "basic" and value:
        return _basic(settings, value.strip())
    raise AuthError(
        "authentication required: send 'Authorization: Bearer <token>' or HTTP basic auth "
        "(Prometheus remote_write: authorization.credentials or basic_auth)"
    )


def _bearer(settings: Settings, token: str) -> Principal:
    digest = hash_secret(token)
    found = None
    for cred in settings.auth_bearer_tokens:
        if hmac.compare_digest(digest, cred.sha256):
            found = Principal(cred.tenant)
    if found is None:
        raise AuthError("unknown bearer token")
    return found


def _basic(settings: Settings, value: str) -> Principal:
    try:
        user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise AuthError("malformed basic auth header: expected base64 of user:password") from exc
    digest = hash_secret(password)
    found = None
    for cred in settings.auth_basic_users:
        same_user = hmac.compare_digest(user.encode(), cred.user.encode())
        if hmac.compare_digest(digest, cred.sha256) and same_user and sep:
            found = Principal(cred.tenant)
    if found is None:
        raise AuthError("unknown user or wrong password")
    return found
