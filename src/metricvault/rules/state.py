"""The ``for`` state of alerts restored after a restart, as Prometheus 2.42 restores it
(``Group.RestoreForState``).

Every pending or firing alert writes ``ALERTS_FOR_STATE{<alert labels>}`` with its
``activeAt`` (Unix seconds) each round, so the vault holds when each alert became active. A
restarted evaluator evaluates a group twice, then reads, for each alert active again, the
last such sample within ``for_outage_tolerance`` (1h) before now:

- none, or a stale marker: the alert starts its ``for`` anew;
- it had been pending long enough to fire: its ``activeAt`` is restored, and it fires again
  at the next round if still active;
- less than ``for_grace_period`` (10m) of ``for`` left: it fires one grace period from now;
- otherwise: its ``activeAt`` moves forward by how long the evaluator was down, so the
  outage does not count as time pending.

Rules whose ``for`` is shorter than the grace period are not restored (they wait their
``for`` anew), as in Prometheus.
"""

from __future__ import annotations

import math

from metricvault.promql.source import is_stale
from metricvault.protocols import SampleSource
from metricvault.rules.group import ALERT_FOR_STATE_METRIC, RuleGroup
from metricvault.selector import Matcher

__all__ = ["FOR_GRACE_PERIOD_MS", "OUTAGE_TOLERANCE_MS", "restore_for_state"]

OUTAGE_TOLERANCE_MS = 3_600_000  # --rules.alert.for-outage-tolerance
FOR_GRACE_PERIOD_MS = 600_000  # --rules.alert.for-grace-period


def restore_for_state(
    group: RuleGroup,
    source: SampleSource,
    now_ms: int,
    outage_tolerance_ms: int = OUTAGE_TOLERANCE_MS,
    grace_period_ms: int = FOR_GRACE_PERIOD_MS,
) -> int:
    """Restore the ``activeAt`` of ``group``'s active alerts from the vault; marks every
    alerting rule restored (ALERTS are written from then on). Returns the alerts restored."""
    mint = now_ms - outage_tolerance_ms
    restored = 0
    for rule in group.alerting_rules():
        hold = rule.hold_ms
        if hold < grace_period_ms:
            rule.restored = True
            continue
        for alert in rule.active.values():
            matchers = [Matcher("__name__", "=", ALERT_FOR_STATE_METRIC)] + [
                Matcher(k, "=", v) for k, v in sorted(alert.labels.items())
            ]
            found = [
                s
                for s in source.select(matchers, mint, now_ms)
                if set(s.labels) - {"__name__"} == set(alert.labels)
            ]
            if not found or found[0].ts.size == 0:
                continue
            series = found[0]
            t, v = int(series.ts[-1]), float(series.values[-1])
            if bool(is_stale(series.values[-1:])[0]) or math.isnan(v):
                continue  # the alert was not active when the evaluator stopped
            down_at = (t // 1000) * 1000
            active_at = int(v) * 1000
            remaining = hold - (down_at - active_at)
            if remaining <= 0:
                pass  # it was firing: firing again at the next round if still active
            elif remaining < grace_period_ms:
                active_at = now_ms + grace_period_ms - hold
            else:
                active_at += now_ms - down_at
            alert.active_at = active_at
            restored += 1
        rule.restored = True
    return restored
