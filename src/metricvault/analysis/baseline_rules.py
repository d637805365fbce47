"""Prometheus rule files carrying the vault's learned thresholds (``metricvault baseline
export-rules``): a hot Prometheus keeps 15 days at most, so it cannot compute a 28-day P99
itself, but it can alert against one that is handed to it.

One group per source metric: a recording rule per stored baseline series sets
``metricvault_baseline{<group labels>, source_metric, stat}`` to its number (``vector(N)``
with the labels: the same series the vault stores, so the same expressions work in both), then
an alerting rule compares the metric (counters: their ``rate``) with it ``on`` the group's
labels. Rules of a group are evaluated in order, so the alert sees this round's thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import yaml

from metricvault.analysis.baselines import BASELINE_METRIC, SCALAR_STATS
from metricvault.durations import parse_duration_ms
from metricvault.errors import InputError, NotFoundError

THRESHOLD_STATS = ("mean", "p50", "p95", "p99", "median")


def stored_baselines(
    vault: Any, at_ms: int, stat: str, lookback: str = "28d"
) -> list[tuple[dict[str, str], float]]:
    """The last stored value of every ``metricvault_baseline{stat=...}`` series within
    ``lookback`` before ``at_ms``: ``(labels without __name__, value)``."""
    found = vault.select_series(
        f'{BASELINE_METRIC}{{stat="{stat}"}}',
        at_ms - parse_duration_ms(lookback),
        at_ms + 1,
        stale_markers=False,
    )
    out = []
    for labels, ts, values in found:
        if ts.size and math.isfinite(float(values[-1])):
            out.append(({k: v for k, v in labels.items() if k != "__name__"}, float(values[-1])))
    return sorted(out, key=lambda item: sorted(item[0].items()))


def baseline_rule_groups(
    vault: Any,
    at_ms: int,
    stats: Sequence[str] = ("p99",),
    for_: str = "5m",
    rate_window: str = "5m",
) -> dict[str, Any]:
    """The rule file (as a mapping for YAML) for the baselines stored as of ``at_ms``."""
    bad = [s for s in stats if s not in THRESHOLD_STATS]
    if bad or not stats:
        raise InputError(
            f"--stat {','.join(bad) or '(none)'}: a threshold is one of "
            f"{', '.join(THRESHOLD_STATS)} (of the stored {', '.join(SCALAR_STATS)})"
        )
    parse_duration_ms(for_)
    parse_duration_ms(rate_window)
    counters = _counter_metrics(vault)
    by_metric: dict[str, list[dict[str, Any]]] = {}
    alerts: dict[str, list[dict[str, Any]]] = {}
    stored = {stat: stored_baselines(vault, at_ms, stat) for stat in stats}
    # every label name a metric's baselines carry: a baseline of one key set (per series, or
    # --by Hostname,gpu) is selected with the others' names empty, so two key sets of the
    # same metric never meet in one match (many-to-many)
    names: dict[str, set[str]] = {}
    for labels, _ in (item for found in stored.values() for item in found):
        names.setdefault(labels.get("source_metric", ""), set()).update(labels)
    for stat in stats:
        for labels, value in stored[stat]:
            metric = labels.get("source_metric", "")
            if not metric:
                continue
            by_metric.setdefault(metric, []).append(
                {"record": BASELINE_METRIC, "expr": f"vector({_number(value)})", "labels": labels}
            )
            keys = sorted(k for k in labels if k not in ("stat", "source_metric"))
            if any(a["_on"] == keys and a["_stat"] == stat for a in alerts.get(metric, [])):
                continue
            lhs = f"rate({metric}[{rate_window}])" if metric in counters else metric
            matchers = [f'source_metric="{metric}"', f'stat="{stat}"']
            matchers += [f'{k}=~".+"' for k in keys]
            matchers += [f'{k}=""' for k in sorted(names[metric] - set(labels))]
            rhs = f"{BASELINE_METRIC}{{{','.join(matchers)}}}"
            alerts.setdefault(metric, []).append(
                {
                    "_on": keys,
                    "_stat": stat,
                    "alert": f"{metric}_above_baseline_{stat}",
                    "expr": f"{lhs} > on({', '.join(keys)}) group_left() {rhs}",
                    "for": for_,
                    "labels": {
                        "severity": "warning",
                        "baseline_stat": stat,
                        "baseline_on": ",".join(keys),
                    },
                    "annotations": {
                        "summary": (
                            f"{metric}{' rate' if metric in counters else ''} above its "
                            f"learned {stat} ({{{{ $value }}}})"
                        ),
                    },
                }
            )
    if not by_metric:
        raise NotFoundError(
            f'no stored baselines ({BASELINE_METRIC}{{stat=~"{"|".join(stats)}"}}) in the '
            "vault: run `metricvault baseline --selector ...` (or maintain with the "
            "`baselines` setting) first"
        )
    groups = []
    for metric in sorted(by_metric):
        rules = by_metric[metric] + [
            {k: v for k, v in a.items() if not k.startswith("_")} for a in alerts.get(metric, [])
        ]
        groups.append({"name": f"metricvault_baseline_{metric}", "rules": rules})
    return {"groups": groups}


def rules_yaml(groups: dict[str, Any]) -> str:
    header = (
        "# Learned by metricvault (metricvault baseline export-rules): thresholds from the\n"
        "# vault's rollup history. Regenerate after the baselines are refreshed.\n"
    )
    return header + yaml.safe_dump(groups, sort_keys=False, default_flow_style=False, width=1000)


def _number(value: float) -> str:
    return repr(float(value))  # shortest text that reads back as the same float64


def _counter_metrics(vault: Any) -> set[str]:
    reader = vault.sample_reader()
    index = reader.index
    return {index.get(sid).metric for sid in index.counters()}


__all__ = ["baseline_rule_groups", "rules_yaml", "stored_baselines"]
