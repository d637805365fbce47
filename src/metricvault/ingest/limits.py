"""Limits that keep one request or one tenant from monopolising a shared gateway (issue 10).

- :class:`NewSeriesLimiter`: new series per tenant per minute (429 with Retry-After).
- :class:`DecodeBudget`: CPU time a decoder may spend on one request (413).
- :func:`check_label_names`: distinct label names per request (413).
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

from metricvault.errors import CardinalityError as CardinalityError  # moved: issue 12
from metricvault.errors import TooLargeError


class NewSeriesLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._events: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._lock = threading.Lock()

    def admit(self, tenant: str, count: int, now: float | None = None) -> None:
        """Record ``count`` new series for ``tenant`` or raise CardinalityError."""
        if count > self.per_minute:  # retrying could never succeed: too large, not too soon
            raise TooLargeError(
                f"the request would create {count:,} new series, more than tenant "
                f"{tenant or '(default)'!r} may create in a minute ({self.per_minute:,}, "
                "max_new_series_per_minute); nothing was stored: send fewer new series per "
                "request or raise max_new_series_per_minute"
            )
        now = time.monotonic() if now is None else now
        with self._lock:
            events = self._events[tenant]
            while events and events[0][0] <= now - 60:
                events.popleft()
            used = sum(n for _, n in events)
            if used + count > self.per_minute:
                wait_s = self._retry_after(events, used + count - self.per_minute, now)
                raise CardinalityError(
                    f"tenant {tenant or '(default)'!r} would create {count} new series, with "
                    f"{used} created in the last minute; the limit is {self.per_minute} per "
                    "minute (max_new_series_per_minute). Check for a label with unbounded "
                    "values (request ids, timestamps, pod hashes) or raise the limit",
                    retry_after_s=wait_s,
                )
            events.append((now, count))

    @staticmethod
    def _retry_after(events: deque[tuple[float, int]], needed: int, now: float) -> int:
        """Seconds until enough of the last minute's series age out for ``needed`` more."""
        freed = 0
        for at, n in events:
            freed += n
            if freed >= needed:
                return max(1, math.ceil(at + 60 - now))
        return 60


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
        self.started = clock()

    def check(self, progress: str) -> None:
        if self.budget_s is None:
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
