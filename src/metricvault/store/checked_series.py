"""Which series rows a vault has already checked against its series table, by the keys a
decoder's series cache gives them (:class:`metricvault.model.SeriesRows`).

A gateway receives the same series in every request. Finding the new ones among them and
checking the known ones for id collisions is a pass in Python over every series of every
request; once a row has passed (its id names exactly those labels in the series table, or was
registered with them), the same key always means the same row, and the series table never
forgets an id, so it need not be checked again. A batch whose keys are all checked skips both
steps; any other batch takes them, and its keys are remembered once it is stored.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

SPAN = 1 << 22  # keys remembered at most, from the lowest one (a bitmap: 4 MiB)


class CheckedKeys:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: tuple[int, Any] = (0, np.zeros(0, dtype=np.bool_))  # (first key, bitmap)

    def all_checked(self, keys: Any) -> bool:
        """Whether every one of ``keys`` (int64 numpy array) was remembered."""
        first, bits = self._state
        if not len(keys):
            return True
        low, high = int(keys.min()), int(keys.max())
        if low < first or high >= first + len(bits):
            return False
        return bool(bits[keys - first].all())

    def remember(self, keys: Any) -> None:
        """Mark ``keys`` checked (their rows are in the series table, as they say)."""
        if not len(keys):
            return
        low, high = int(keys.min()), int(keys.max())
        if high - low >= SPAN:
            return  # not from one cache generation: checked each time
        with self._lock:
            first, bits = self._state
            if not len(bits):
                first = low
            if low < first:
                if first + len(bits) - low > SPAN:
                    first, bits = low, bits[:0]  # start over: the ones forgotten are checked again
                else:
                    bits = np.concatenate((np.zeros(first - low, dtype=np.bool_), bits))
                    first = low
            if high - first >= SPAN:
                first, bits = low, bits[:0]
            if high - first >= len(bits):
                size = min(SPAN, max(2 * len(bits), high - first + 1, 1024))
                bits = np.concatenate((bits, np.zeros(size - len(bits), dtype=np.bool_)))
            bits[keys - first] = True  # in place: a reader sees each bit unset or set
            self._state = (first, bits)
