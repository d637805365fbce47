"""The maintenance step that keeps ``metricvault_anomaly_score`` series up to date: the
``anomaly_score_selectors`` setting's series scored with ``anomaly_detector`` by
:func:`metricvault.analysis.online.score_new_samples`, at most every
``anomaly_score_interval``.

The step keeps no state of its own: what is scored already is the newest point of each score
series in the vault, so a maintainer killed or restarted between rounds resumes where the
vault says, without scoring a sample twice or skipping one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metricvault.analysis.detectors import make_detector
from metricvault.analysis.online import score_new_samples
from metricvault.durations import now_ms as clock
from metricvault.durations import parse_duration_ms
from metricvault.errors import ConfigError, MetricVaultError
from metricvault.selector import parse_selector


@dataclass
class OnlineScoring:
    """One maintainer's scoring step; ``run(vault, now_ms)`` after each maintenance round.

    Built from the settings with :meth:`from_settings`, which refuses a bad selector or an
    unknown detector before any round runs (nothing is read or written then)."""

    selectors: tuple[str, ...]
    detector: str
    interval_ms: int
    _last_run_ms: int | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Any) -> OnlineScoring:
        selectors = tuple(settings.anomaly_score_selectors)
        for text in selectors:
            try:
                parse_selector(text)
            except MetricVaultError as exc:
                raise ConfigError(
                    f"setting anomaly_score_selectors: {text!r} is not a PromQL selector: {exc}"
                ) from exc
        try:
            make_detector(settings.anomaly_detector)
        except MetricVaultError as exc:
            raise ConfigError(f"setting anomaly_detector: {exc}") from exc
        return cls(
            selectors, settings.anomaly_detector, parse_duration_ms(settings.anomaly_score_interval)
        )

    @property
    def enabled(self) -> bool:
        return bool(self.selectors)

    def run(self, vault: Any, now_ms: int | None = None) -> int | None:
        """Score what is new at ``now_ms`` (default: the clock); the number of scores
        written, or None when nothing is configured or the last run is under
        ``interval_ms`` ago in this process (a new process always runs at once)."""
        if not self.selectors:
            return None
        at = clock() if now_ms is None else int(now_ms)
        if self._last_run_ms is not None and at - self._last_run_ms < self.interval_ms:
            return None
        written = score_new_samples(vault, self.selectors, at, self.detector)
        self._last_run_ms = at
        return written

    def as_step(self, vault: Any, now_ms: int | None = None) -> Callable[[dict[str, Any]], None]:
        """A :class:`~metricvault.store.upkeep.MaintenanceLoop` step: scores after each round
        and puts how many into the round's report as ``anomaly_scores``."""

        def step(report: dict[str, Any]) -> None:
            report["anomaly_scores"] = self.run(vault, now_ms)

        return step


def run_configured(vault: Any, settings: Any, now_ms: int | None = None) -> int | None:
    """One-off: the configured step once (``metricvault maintain`` without ``--loop``)."""
    return OnlineScoring.from_settings(settings).run(vault, now_ms)
