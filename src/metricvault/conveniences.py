"""What every readable backend offers its users beyond the store: ``history`` (the experiment
analysis of ``archive.compare``) and ``promql`` (the engine), added to the store's classes one
layer above the store (``metricvault.public``, ``metricvault.public_influx``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from metricvault.durations import TimeLike

if TYPE_CHECKING:
    from metricvault.config import Settings

__all__ = ["Conveniences"]


class Conveniences:
    """What every readable backend offers its users beyond the read seam."""

    settings: Settings  # every store keeps the settings it was opened with

    def history(self, experiment: Any, metrics: Sequence[str], **options: Any) -> Any:
        """A frame indexed by training step, one column per metric: each metric's samples
        joined exactly to the ``train_step`` series (see ``metricvault.archive.compare.
        history``), e.g. ``vault.history("r3", metrics=["train_loss", "mfu"])``."""
        from metricvault.archive.compare import history

        return history(self, experiment, metrics, **options)

    def promql(
        self,
        expr: str,
        start: TimeLike = "now",
        end: TimeLike | None = None,
        step: str | int | None = None,
        output: str = "pandas",
    ) -> Any:
        """A PromQL query in the long shape (``timestamp``, ``metric``, labels, ``value``):
        instant at ``start`` without ``end``; with ``end`` and ``step`` a range query
        (``metricvault.promql``; Prometheus's answer for the same samples, tested)."""
        from metricvault.promql.frame import promql_frame

        # the vault's query limits (query_max_samples, query_max_series, query_timeout)
        return promql_frame(cast(Any, self), expr, start, end, step, output, settings=self.settings)
