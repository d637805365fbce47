"""The engine's reads on the server: the store behind the gateway, narrowed to the caller's
tenant before any matcher of the caller's runs (a user's regex never meets another tenant's
series, so its running time tells nothing about them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from metricvault.credentials import Principal
from metricvault.errors import PromQLError
from metricvault.promql import SeriesSamples
from metricvault.promql.tiers import BucketSelection
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


def too_many_series(limit: int) -> PromQLError:
    """Mimir's words and status (422 ``execution``) for its -querier.max-fetched-series-per-query
    limit (Prometheus has no such limit; Thanos and Mimir answer 422 for theirs)."""
    return PromQLError(
        f"the query exceeded the maximum number of series (limit: {limit} series): add label "
        "matchers to select fewer series, or raise the setting query_max_series",
        kind="execution",
    )


@dataclass
class ScopedSource:
    """The engine's reads: narrowed to the caller's tenant, counted against the sample limit,
    and noting when the vault's raw horizon cuts a selection short (a warning)."""

    inner: Any
    tenant_matchers: tuple[Matcher, ...]
    max_samples: int
    raw_horizon_ms: int
    max_series: int = 0  # 0: no limit (remote_read)
    loaded: int = 0
    selected: int = 0
    truncated: bool = False

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int
    ) -> list[SeriesSamples]:
        series: list[SeriesSamples] = self.inner.select(
            [*self.tenant_matchers, *matchers], start_ms, end_ms
        )
        self._count(sum(int(s.ts.size) for s in series), len(series))
        if self.raw_horizon_ms and start_ms < self.raw_horizon_ms:
            self.truncated = True
        return series

    def select_buckets(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, width_ms: int
    ) -> BucketSelection | None:
        """The rollup path's reads (promql/tiers.py), scoped and counted the same way (a
        bucket row counts as one sample)."""
        select = getattr(self.inner, "select_buckets", None)
        found: BucketSelection | None = (
            select([*self.tenant_matchers, *matchers], start_ms, end_ms, width_ms)
            if select
            else None
        )
        if found is not None:
            self._count(sum(s.columns["ts"].size for s in found.series), len(found.series))
        return found

    @property
    def counter_lookback_ms(self) -> int:
        return int(getattr(self.inner, "counter_lookback_ms", 0))

    def raw_horizon(self) -> int:
        return int(self.inner.raw_horizon()) if hasattr(self.inner, "raw_horizon") else 0

    def samples_per_row(self, tier: str, start_ms: int, end_ms: int) -> float | None:
        measure = getattr(self.inner, "samples_per_row", None)
        return None if measure is None else float(measure(tier, start_ms, end_ms) or 0.0)

    def rolled_up_until(self) -> int | None:
        until: int | None = self.inner.rolled_up_until()
        return until

    def _count(self, samples: int, series: int) -> None:
        self.loaded += samples
        self.selected += series
        if self.max_series and self.selected > self.max_series:
            raise too_many_series(self.max_series)
        if self.loaded > self.max_samples:
            raise PromQLError(
                "query processing would load too many samples into memory in query execution",
                kind="execution",
            )
