"""The engine's reads on the server: the store behind the gateway as one tenant sees it,
narrowed to the caller's tenant before any matcher of the caller's runs (a user's regex never
meets another tenant's series, so its running time tells nothing about them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from metricvault.credentials import Principal
from metricvault.errors import PromQLError
from metricvault.promql.source import TenantSource
from metricvault.protocols import Reading, has
from metricvault.selector import Matcher

if TYPE_CHECKING:
    from metricvault.server.app import Gateway


def readable(gateway: Gateway) -> Reading:
    """The gateway's store as a reader, or a 500 saying it cannot be read."""
    store = gateway.vault
    if not has(store, "read"):
        raise PromQLError(f"the store behind this gateway ({store.uri}) cannot be read", "internal")
    return cast(Reading, store)


def tenant_matchers(gateway: Gateway, who: Principal) -> tuple[Matcher, ...]:
    """The matcher that confines ``who`` to its tenant's series (none without a tenant)."""
    if not who.tenant:
        return ()
    return (Matcher(gateway.settings.tenant_label, "=", who.tenant),)


def tenant_source(
    gateway: Gateway, who: Principal, raw_horizon_ms: int | None = None
) -> TenantSource:
    """What ``who`` may read, as the engine reads it (tenant matchers first in every select)."""
    return TenantSource(readable(gateway), tenant_matchers(gateway, who), raw_horizon_ms)
