"""Clocks the training API's tests hand to ``track(**clocks.kw)`` instead of patching globals."""

from __future__ import annotations

import itertools
from typing import Any

from metricvault.durations import now_ms


class Clocks(list[float]):
    """A controllable monotonic clock (``clocks[0]`` seconds) and a wall clock that starts
    ``start_after_ms`` after now and advances ``step_ms`` per reading, so every logged step
    gets its own timestamp."""

    def __init__(self, start_after_ms: int = 0, step_ms: int = 1) -> None:
        super().__init__([1000.0])
        self._wall = itertools.count(now_ms() + start_after_ms, step_ms)

    def monotonic(self) -> float:
        return self[0]

    def wall_ms(self) -> int:
        return next(self._wall)

    @property
    def kw(self) -> dict[str, Any]:
        return {"clock": self.monotonic, "wall_clock_ms": self.wall_ms}
