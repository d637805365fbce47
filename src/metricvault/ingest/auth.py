"""Gateway authentication: bearer tokens and HTTP basic auth, secrets stored only as SHA-256.

Secrets are hashed on arrival and compared with :func:`hmac.compare_digest` against every
configured digest, so neither a match nor a miss leaks timing; no secret is ever logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

from metricvault.config import Settings
from metricvault.errors import AuthError as AuthError  # moved: issue 12
from metricvault.errors import ConfigError


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


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_listener(settings: Settings, insecure_no_auth: bool) -> str | None:
    """Refuse (ConfigError) a non-loopback listener without credentials unless
    ``insecure_no_auth``; then the warning to print. None when nothing is wrong."""
    host = settings.listen.rpartition(":")[0]
    if is_loopback(host) or settings.auth_bearer_tokens or settings.auth_basic_users:
        return None
    exposure = (
        f"listen={settings.listen!r} is reachable from other machines and no credential is "
        "configured (auth_bearer_tokens, auth_basic_users): anyone who reaches the port could "
        "write series and read and change experiments"
    )
    if not insecure_no_auth:
        raise ConfigError(
            f"refusing to start: {exposure}. Configure a credential (docs/gateway.md, Security; "
            "'metricvault hash-secret' makes the digest), listen on 127.0.0.1, or pass "
            "--insecure-no-auth if the network itself is trusted"
        )
    return f"{exposure} (--insecure-no-auth)"
