"""Limits that keep one tenant from monopolising a shared gateway: new series per tenant per
minute (:class:`NewSeriesLimiter`, 429 with Retry-After). What a decoder limits while it
decodes one request lives beside the decoders (``ingest/protocols/decode_limits.py``)."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque

from metricvault.errors import CardinalityError, TooLargeError


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
