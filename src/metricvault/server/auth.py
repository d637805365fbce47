"""Gateway authentication: who may reach the listener, and the web UI's login sessions (the
credential checks themselves live in :mod:`metricvault.credentials`, shared with the agent's
``/metrics``).

A browser logs in once with a configured credential (``/ui/login``) and gets a signed,
``HttpOnly``, ``SameSite=Strict`` session cookie; every route accepts it in place of an
``Authorization`` header, scoped to that credential's tenant, and a cookie-authenticated
request that may write needs the session's CSRF token (double submit: the ``mv_csrf``
cookie's value in ``X-CSRF-Token``). A request with an ``Authorization`` header is checked
as before and never looks at cookies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import time
import weakref
from pathlib import Path
from typing import Any

from metricvault.config import Settings
from metricvault.credentials import Principal, authenticate, hash_secret
from metricvault.errors import AuthError, ConfigError, ForbiddenError


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


# --------------------------------------------------------------------------- browser sessions
SESSION_COOKIE = "mv_session"  # HttpOnly: the signed session
CSRF_COOKIE = "mv_csrf"  # readable by the UI's script, which echoes it in X-CSRF-Token
LOGIN_COOKIE = "mv_login"  # the login form's own double-submit nonce
CSRF_HEADER = "x-csrf-token"
SESSION_TTL_S = 12 * 3600
SESSION_KEY_FILE = "ui-session.key"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Sessions:
    """Signed session cookies for the web UI's login form.

    A session is ``base64url(payload).base64url(HMAC-SHA256(key, payload))`` with the payload
    naming the credential it was made from (a keyed fingerprint of its digest, never the
    digest or secret), its expiry and a random nonce. Each request re-finds the credential
    among the configured ones, so removing a credential ends its sessions and its *current*
    tenant scopes them. The key is random, kept in the state directory (``ui-session.key``,
    mode 0600) so every gateway worker verifies every worker's sessions, or in memory where
    that directory cannot be written (sessions then end with the process)."""

    def __init__(self, settings: Settings, state_dir: str | Path | None, now: Any = time.time):
        self.settings = settings
        self.now = now
        self.key = _session_key(Path(state_dir) if state_dir else None)

    def _sign(self, data: bytes) -> str:
        return _b64(hmac.new(self.key, data, hashlib.sha256).digest())

    def fingerprint(self, kind: str, user: str, digest: str) -> str:
        return self._sign(f"credential\0{kind}\0{user}\0{digest}".encode())[:32]

    def credentials(self) -> dict[str, Principal]:
        """Every configured credential by its fingerprint."""
        found = {
            self.fingerprint("bearer", "", c.sha256): Principal(c.tenant)
            for c in self.settings.auth_bearer_tokens
        }
        for u in self.settings.auth_basic_users:
            found[self.fingerprint("basic", u.user, u.sha256)] = Principal(u.tenant)
        return found

    def login(self, token: str = "", user: str = "", password: str = "") -> tuple[str, str]:
        """(session cookie, CSRF token) for a bearer token or a user and password; AuthError
        (the API's own words) when they are not a configured credential."""
        if token:
            authenticate(self.settings, f"Bearer {token}")
            mark = self.fingerprint("bearer", "", hash_secret(token))
        elif user or password:
            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            authenticate(self.settings, f"Basic {pair}")
            digest = hash_secret(password)  # authenticate found this user with this digest
            mark = self.fingerprint("basic", user, digest)
        else:
            raise AuthError("give a bearer token, or a user and a password")
        payload = json.dumps(
            {"f": mark, "e": int(self.now()) + SESSION_TTL_S, "n": secrets.token_hex(16)},
            separators=(",", ":"),
        ).encode()
        cookie = f"{_b64(payload)}.{self._sign(payload)}"
        return cookie, self.csrf_token(cookie)

    def _payload(self, cookie: str) -> dict[str, Any]:
        body, _, signature = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError) as exc:
            raise AuthError("malformed session cookie: log in again at /ui/login") from exc
        if not hmac.compare_digest(self._sign(payload), signature):
            raise AuthError("invalid session cookie: log in again at /ui/login")
        data: dict[str, Any] = json.loads(payload)
        return data

    def verify(self, cookie: str) -> Principal:
        """The principal of a session cookie, or AuthError (expired, forged, or its
        credential is no longer configured)."""
        data = self._payload(cookie)
        if int(data.get("e", 0)) < self.now():
            raise AuthError("the session expired: log in again at /ui/login")
        who = self.credentials().get(str(data.get("f")))
        if who is None:
            raise AuthError("the session's credential is no longer configured: log in again")
        return who

    def csrf_token(self, cookie: str) -> str:
        """The CSRF token bound to a session (a keyed hash of its nonce)."""
        nonce = str(self._payload(cookie).get("n", ""))
        return self._sign(f"csrf\0{nonce}".encode())

    def check_csrf(self, cookie: str, token: str | None) -> None:
        if not token or not hmac.compare_digest(self.csrf_token(cookie), token):
            raise ForbiddenError(
                "this request is authenticated by a session cookie and needs its CSRF token: "
                "send the mv_csrf cookie's value in an X-CSRF-Token header (API clients: use "
                "Authorization: Bearer or basic auth instead of the cookie)"
            )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _session_key(state_dir: Path | None) -> bytes:
    """The key in ``state_dir`` (made once, atomically: the first worker's wins), else a
    random one for this process."""
    if state_dir is None:
        return secrets.token_bytes(32)
    path = state_dir / SESSION_KEY_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        pass
    except OSError:
        return secrets.token_bytes(32)
    key = secrets.token_bytes(32)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / f".{SESSION_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex())
        try:
            os.link(tmp, path)  # fails if another worker made it first: use theirs
        except FileExistsError:
            key = bytes.fromhex(path.read_text().strip())
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:
        return key
    return key


_SESSIONS: weakref.WeakKeyDictionary[Any, Sessions] = weakref.WeakKeyDictionary()


def sessions_of(gateway: Any) -> Sessions:
    """The gateway's session keeper (made on first use)."""
    found = _SESSIONS.get(gateway)
    if found is None:
        state_dir = getattr(gateway.vault, "state_dir", None)
        found = _SESSIONS[gateway] = Sessions(gateway.settings, state_dir)
    return found


def credentials_configured(settings: Settings) -> bool:
    return bool(settings.auth_bearer_tokens or settings.auth_basic_users)


def authenticate_request(gateway: Any, request: Any) -> Principal:
    """The caller of a request: its ``Authorization`` header as always (API clients are
    unchanged); without one, the UI's session cookie where credentials are configured, and
    for a request that may write (not GET/HEAD/OPTIONS) the session's CSRF token in the
    ``X-CSRF-Token`` header too (ForbiddenError without it)."""
    header = request.headers.get("authorization")
    settings = gateway.settings
    cookie = request.cookies.get(SESSION_COOKIE)
    if header or not cookie or not credentials_configured(settings):
        return authenticate(settings, header)
    sessions = sessions_of(gateway)
    who = sessions.verify(cookie)
    if request.method not in SAFE_METHODS:
        sessions.check_csrf(cookie, request.headers.get(CSRF_HEADER))
    return who
