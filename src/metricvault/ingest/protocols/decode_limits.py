"""Limits a decoder applies to one request while it decodes: CPU time and distinct label
names. Here, beside the decoders, so they import nothing above their layer; the gateway's
own limits are in ``metricvault.server.limits``."""

from __future__ import annotations

import time
from collections.abc import Callable

from metricvault.errors import TooLargeError

__all__ = ["DecodeBudget", "check_label_names"]


class DecodeBudget:
    """CPU time one request may spend in a decoder; ``check`` raises once it is spent.

    Thread CPU time, not wall time: a decoder waiting for the GIL behind other requests is
    not charged for them, so only the request's own cost counts. Over budget is 413, not 429:
    the same body costs the same again, and a sender retrying it would block its queue forever;
    split into smaller requests, it goes through.
    """

    def __init__(
        self, budget_s: float | None, clock: Callable[[], float] = time.thread_time
    ) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.started = clock() if budget_s is not None else 0.0
        # thread CPU time never runs ahead of the wall clock: while the wall clock is within
        # the budget, so is the CPU time, and the (syscall) clock need not be read
        self.started_wall = time.perf_counter() if clock is time.thread_time else None

    def check(self, progress: str) -> None:
        if self.budget_s is None:
            return
        wall = self.started_wall
        if wall is not None and time.perf_counter() - wall <= self.budget_s:
            return
        spent = self.clock() - self.started
        if spent > self.budget_s:
            raise TooLargeError(
                f"decoding the request used {spent:.2f} s of CPU time, over the budget of "
                f"{self.budget_s:g} s per request (decode_time_budget), after {progress}; "
                "nothing was stored: send smaller batches (Prometheus: lower "
                "queue_config.max_samples_per_send) or raise decode_time_budget"
            )


def check_label_names(count: int, limit: int | None, example: str = "") -> None:
    """413 if one request uses more than ``limit`` distinct label names."""
    if limit is not None and count > limit:
        shown = f" (e.g. {example})" if example else ""
        raise TooLargeError(
            f"the request uses {count:,} distinct label names{shown}, over the limit of "
            f"{limit:,} per request (max_label_names_per_request); nothing was stored: a label "
            "name should not carry data (move ids into label values), send fewer series per "
            "request, or raise max_label_names_per_request"
        )
