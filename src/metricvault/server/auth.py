"""Gateway authentication: who may reach the listener (the credential checks themselves live
in :mod:`metricvault.credentials`, shared with the agent's ``/metrics``)."""

from __future__ import annotations

import ipaddress

from metricvault.config import Settings
from metricvault.errors import ConfigError


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
