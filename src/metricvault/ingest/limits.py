"""Per-tenant limit on new series per minute: a guard against cardinality bombs."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

from metricvault.errors import MetricVaultError


class CardinalityError(MetricVaultError):
    """429: too many new series for a tenant right now; retrying later can succeed."""

    status = 429

    def __init__(self, message: str, retry_after_s: int = 60) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NewSeriesLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._events: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._lock = threading.Lock()

    def admit(self, tenant: str, count: int, now: float | None = None) -> None:
        """Record ``count`` new series for ``tenant`` or raise CardinalityError."""
        now = time.monotonic() if now is None else now
        with self._lock:
            events = self._events[tenant]
            while events and events[0][0] <= now - 60:
                events.popleft()
            used = sum(n for _, n in events)
            if used + count > self.per_minute:
                raise CardinalityError(
                    f"tenant {tenant or '(default)'!r} would create {count} new series, with "
                    f"{used} created in the last minute; the limit is {self.per_minute} per "
                    "minute (max_new_series_per_minute). Check for a label with unbounded "
                    "values (request ids, timestamps, pod hashes) or raise the limit"
                )
            events.append((now, count))
