"""Online scoring: a detector scores a vault's new samples and writes the scores back as
``metricvault_anomaly_score`` series, which plot beside the data and alert through rules.

Each call is stateless and causal: for every series the selectors match it finds the last
sample already scored (the newest point of that series' score series), replays up to
``warmup_ms`` of history before it into a fresh detector, and scores only the samples after
it. Nothing is scored twice, and no score depends on a later sample; the replayed history
starts at a moving point, so a score can differ slightly from a whole-file CSV score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from metricvault.analysis.detectors import DEFAULT_DETECTOR, make_detector
from metricvault.protocols import SeriesSamples
from metricvault.selector import Matcher, parse_selector

SCORE_METRIC = "metricvault_anomaly_score"
# 1 where the score reaches the detector's fixed threshold (the CSV's is_anomaly), else 0
FLAG_METRIC = "metricvault_anomaly"
KINDS = {SCORE_METRIC: "gauge", FLAG_METRIC: "gauge"}
WEEK_MS = 7 * 86_400_000


class _Vault(Protocol):
    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: Any = None
    ) -> list[SeriesSamples]: ...

    def write(self, data: Any, kinds: Any = None) -> int: ...


def score_labels(labels: dict[str, str], detector: str) -> dict[str, str]:
    """The score series' labels: the source's labels, its metric name as ``source_metric`` and
    the detector's name."""
    out = {k: v for k, v in labels.items() if k != "__name__"}
    out["source_metric"] = labels["__name__"]
    out["detector"] = detector
    return out


def score_new_samples(
    vault: _Vault,
    selectors: Sequence[str],
    now_ms: int,
    detector: str = DEFAULT_DETECTOR,
    warmup_ms: int = WEEK_MS,
) -> int:
    """Score every not yet scored sample in ``(now_ms - warmup_ms, now_ms]`` of the series the
    ``selectors`` match; returns the number of scores written. Beside each score goes a
    ``metricvault_anomaly`` sample, 1 where the score reaches the detector's threshold."""
    threshold = make_detector(detector).threshold()  # an unknown name fails before any read
    parsed = [parse_selector(text) for text in selectors]
    start = now_ms - warmup_ms
    rows: list[tuple[str, dict[str, str], int, float]] = []
    flags: list[tuple[str, dict[str, str], int, float]] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for selector in parsed:
        for series in vault.select(list(selector.matchers), start, now_ms):
            if series.labels.get("__name__") in KINDS:
                continue
            key = tuple(sorted(series.labels.items()))
            if key in seen:
                continue
            seen.add(key)
            labels = score_labels(series.labels, detector)
            last = _last_scored(vault, labels, start, now_ms)
            det = make_detector(detector)
            for ts, value in zip(series.ts.tolist(), series.values.tolist(), strict=True):
                if not math.isfinite(value):  # staleness markers and gaps are not samples
                    continue
                score = float(det.update(np.array([value]))[0])
                if ts > last:
                    rows.append((SCORE_METRIC, labels, int(ts), score))
                    flags.append((FLAG_METRIC, labels, int(ts), float(score >= threshold)))
    if rows:
        # one write: the flags and the scores (which mark what is done) are durable together
        vault.write(rows + flags, KINDS)
    return len(rows)


def _last_scored(vault: _Vault, labels: dict[str, str], start: int, end: int) -> int:
    matchers = [Matcher("__name__", "=", SCORE_METRIC)]
    matchers += [Matcher(k, "=", v) for k, v in sorted(labels.items())]
    last = -(2**63)
    for found in vault.select(matchers, start, end):
        mine = {k: v for k, v in found.labels.items() if k != "__name__"}
        if mine == labels and len(found.ts):
            last = max(last, int(found.ts[-1]))
    return last
