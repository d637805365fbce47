"""Client-side credentials: the ``Authorization`` header a client sends (the agent's push to a
gateway, the rule evaluator's alerts to Alertmanager), given directly or read from a file and
re-read on a 401, so a rotated secret needs no restart. A leaf module: the light agent and the
rules package share it; checking credentials on the server side is metricvault.credentials.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path

from metricvault.errors import CredentialError

log = logging.getLogger("metricvault.credentials")


class ClientAuth:
    """Where a client's ``Authorization`` header comes from (the agent's push, the rule
    evaluator's Alertmanagers): nothing, a bearer token or basic auth, each given directly or
    read from a file. ``purpose`` names the client in messages, ``hint`` how to give one.

    A token file holds the token (surrounding whitespace stripped); a basic-auth file holds
    ``user:password`` on its first line (split at the first ``:``, so the password may hold
    colons). Files are read at construction (a missing or empty one raises CredentialError, so a
    typo stops the agent at start-up) and again by :meth:`reload`, which the sender calls on a
    401: a rotated token is picked up without a restart. The secret never appears in
    ``repr``, logs or metrics; :attr:`description` says where it comes from.
    """

    def __init__(
        self,
        *,
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        basic_auth: tuple[str, str] | None = None,
        basic_auth_file: str | Path | None = None,
        purpose: str = "push",
        hint: str = "--push-bearer-token-file, --push-basic-auth-file or user:password@ in the URL",
    ) -> None:
        self.purpose = purpose
        given = [
            name
            for name, value in (
                ("a bearer token", bearer_token),
                ("a bearer token file", bearer_token_file),
                ("basic auth", basic_auth),
                ("a basic auth file", basic_auth_file),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise CredentialError(
                f"{purpose} credentials: {' and '.join(given)} were given; give exactly one "
                f"({hint})"
            )
        self._token_file = Path(bearer_token_file) if bearer_token_file is not None else None
        self._basic_file = Path(basic_auth_file) if basic_auth_file is not None else None
        self._header: str | None = None
        if bearer_token is not None:
            self._header = _bearer_header(bearer_token)
        elif basic_auth is not None:
            self._header = _basic_header(*basic_auth)
        else:
            self._header = self._read_files()

    @property
    def kind(self) -> str:
        """none, bearer or basic."""
        if self._header is None:
            return "none"
        return "bearer" if self._header.startswith("Bearer ") else "basic"

    @property
    def description(self) -> str:
        """Where the credential comes from, without the secret (for log lines)."""
        if self._token_file is not None:
            return f"the bearer token in {self._token_file}"
        if self._basic_file is not None:
            return f"the basic auth in {self._basic_file}"
        return {"none": "no credentials", "bearer": "a bearer token", "basic": "basic auth"}[
            self.kind
        ]

    def headers(self) -> dict[str, str]:
        return {} if self._header is None else {"Authorization": self._header}

    def reload(self) -> bool:
        """Read the credential file again; True when what it holds changed. A file that has
        become unreadable keeps the credential in use (and is logged)."""
        if self._token_file is None and self._basic_file is None:
            return False
        try:
            header = self._read_files()
        except CredentialError as exc:
            log.warning(
                "cannot re-read the %s credentials: %s; keeping the ones in use", self.purpose, exc
            )
            return False
        changed = header != self._header
        self._header = header
        return changed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"

    def _read_files(self) -> str | None:
        if self._token_file is not None:
            token = _read_secret(self._token_file, "bearer token file")
            return _bearer_header(token)
        if self._basic_file is not None:
            first = _read_secret(self._basic_file, "basic auth file").splitlines()[0]
            user, sep, password = first.partition(":")
            if not sep or not user:
                raise CredentialError(
                    f"basic auth file {self._basic_file} must hold user:password on its first line"
                )
            return _basic_header(user, password)
        return None


def _read_secret(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"cannot read the {what} {path}: {exc}") from exc
    if not text:
        raise CredentialError(f"the {what} {path} is empty: write the secret into it")
    return text


def _bearer_header(token: str) -> str:
    return f"Bearer {token}"


def _basic_header(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"
