"""The web UI's login form and logout (sessions themselves: :mod:`metricvault.server.auth`).

- ``GET /ui/login``: the form (a bearer token, or a user and a password), public. A page of
  the UI opened without a credential answers 401 with the same form, so the address stays
  the page's.
- ``POST /ui/session``: checks the credential posted as it checks an ``Authorization``
  header; on success sets the session cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure``
  over TLS) and the CSRF cookie and redirects (303) to the page asked for. The form carries a
  random nonce that must equal its ``mv_login`` cookie (a login form posted from another
  site has no such cookie).
- ``POST /ui/logout``: (session's CSRF token required) clears the cookies.

No secret is ever written into a page: the form's only hidden values are the page to return
to and the login nonce.
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from metricvault.credentials import Principal
from metricvault.errors import AuthError, MetricVaultError
from metricvault.server.auth import (
    CSRF_COOKIE,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_TTL_S,
    credentials_configured,
    sessions_of,
)

if TYPE_CHECKING:
    from metricvault.server.app import Gateway

HOME = "/ui/experiments"


def safe_next(raw: str | None) -> str:
    """Where to go after logging in: a path of this server only (no scheme, no host, no
    ``//`` or backslash tricks), else the experiments page."""
    if not raw or not raw.startswith("/") or raw.startswith("//") or "\\" in raw:
        return HOME
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc:
        return HOME
    return raw


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def login_page(
    request: Request, status: int = 200, message: str = "", next_path: str = ""
) -> Response:
    """The login form (``status`` 401 where it stands in for a page), with a fresh login
    nonce in its form and its cookie."""
    from metricvault.server.ui_common import STATIC_DIR, esc

    nonce = secrets.token_urlsafe(24)
    target = safe_next(next_path or request.query_params.get("next"))
    style = (STATIC_DIR / "ui.css").read_text()
    error = f'<p id="error" class="error" role="alert">{esc(message)}</p>' if message else ""
    text = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>Log in · metricvault</title><link rel="icon" href="data:,">'
        f"<style>{style}</style></head>"
        '<body data-page="login"><header><span class="brand">metricvault</span></header>'
        f'<main id="main" class="login"><h1>Log in</h1>{error}'
        '<form id="login-form" method="post" action="/ui/session">'
        f'<input type="hidden" name="next" value="{esc(target)}">'
        f'<input type="hidden" name="login_nonce" value="{esc(nonce)}">'
        "<fieldset><legend>With a bearer token</legend>"
        '<label>Token <input id="token" name="token" type="password" '
        'autocomplete="current-password"></label></fieldset>'
        "<fieldset><legend>Or with a user and a password</legend>"
        '<label>User <input id="user" name="user" autocomplete="username"></label>'
        '<label>Password <input id="password" name="password" type="password" '
        'autocomplete="current-password"></label></fieldset>'
        '<button type="submit" id="login">Log in</button></form>'
        '<p class="empty">The credentials are the gateway\'s own (auth_bearer_tokens, '
        "auth_basic_users); the session lasts "
        f"{SESSION_TTL_S // 3600} hours. API clients keep sending an Authorization header."
        "</p></main></body></html>"
    )
    headers = {"Cache-Control": "no-store"}
    if status == 401:  # no Basic challenge: the browser shows this form, not its own dialog
        headers["WWW-Authenticate"] = 'Bearer realm="metricvault"'
    answer = HTMLResponse(text, status, headers=headers)
    answer.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=3600,
        path="/ui/",
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return answer


class Login:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def form(self, request: Request) -> Response:
        if not credentials_configured(self.gateway.settings):
            return RedirectResponse(HOME, status_code=302)
        return login_page(request)

    async def session(self, request: Request) -> Response:
        """POST /ui/session: the credential posted becomes a session."""
        gateway = self.gateway
        try:
            body = await gateway.body(request)
            form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
            target = safe_next(form.get("next"))
            if not credentials_configured(gateway.settings):
                return RedirectResponse(target, status_code=303)
            sessions = sessions_of(gateway)
            try:
                cookie, csrf = sessions.login(
                    token=form.get("token", "").strip(),
                    user=form.get("user", ""),
                    password=form.get("password", ""),
                )
            except AuthError as exc:
                gateway.metrics.rejected.labels("AuthError").inc()
                return login_page(request, 401, exc.message, target)
            nonce = request.cookies.get(LOGIN_COOKIE, "")
            posted = form.get("login_nonce", "")
            if not nonce or not hmac.compare_digest(nonce, posted):
                gateway.metrics.rejected.labels("ForbiddenError").inc()
                return login_page(
                    request, 403, "the login form expired or came from elsewhere: log in again"
                )
        except MetricVaultError as exc:
            return gateway.refuse(exc)
        except ClientDisconnect:
            return PlainTextResponse("the client disconnected before its body was read\n", 400)
        answer = RedirectResponse(target, status_code=303)
        secure = _secure(request)
        answer.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=SESSION_TTL_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        answer.set_cookie(
            CSRF_COOKIE,
            csrf,
            max_age=SESSION_TTL_S,
            path="/",
            httponly=False,  # the UI's script echoes it in X-CSRF-Token
            samesite="strict",
            secure=secure,
        )
        answer.delete_cookie(LOGIN_COOKIE, path="/ui/")
        return answer

    async def logout(self, request: Request) -> Response:
        async def work(req: Request, who: Principal) -> Response:
            await self.gateway.body(req)  # unused, but bounded as every body is (413)
            answer = RedirectResponse("/ui/login", status_code=303)
            for name in (SESSION_COOKIE, CSRF_COOKIE):
                answer.delete_cookie(name, path="/", httponly=name == SESSION_COOKIE)
            return answer

        return await self.gateway.handle(request, "/ui", work)


def page_guard(gateway: Gateway, request: Request) -> Response | None:
    """For a page of the UI: the login form (401) when credentials are configured and the
    request brings neither an Authorization header nor a valid session; None to go on (a
    wrong header is answered by the gateway, in its words)."""
    if not credentials_configured(gateway.settings) or request.headers.get("authorization"):
        return None
    cookie = request.cookies.get(SESSION_COOKIE)
    message = ""
    if cookie:
        try:
            sessions_of(gateway).verify(cookie)
            return None
        except AuthError as exc:
            message = exc.message
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return login_page(request, 401, message, path)
