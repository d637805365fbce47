"""What the UI's Vault and Alerts pages show beyond the plain APIs, computed from the vault's
own series (always through the caller's tenant matchers first) and the rule evaluator's files:

- :func:`agents_seen`: every ``metricvault agent`` whose self-series (``metricvault_agent_info``,
  and for pushing agents ``metricvault_agent_push_info`` and the push counters) reached the
  vault, with its last sample and how it reached the vault (pushed or scraped).
- :func:`group_alerts`: firing and pending alerts grouped under their root cause (the
  ``incident`` label the converger gives every member; the root-cause alert carries
  ``root_cause="true"``).
- :func:`anomalies`: the ``metricvault_anomaly_score`` series with the highest scores over a
  range, each beside its source series and the ``metricvault_baseline`` learned for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metricvault.protocols import SampleSource, SeriesSamples
from metricvault.selector import Matcher

AGENT_INFO = "metricvault_agent_info"
AGENT_PUSH_INFO = "metricvault_agent_push_info"
AGENT_PUSH_SENT = "metricvault_agent_push_sent_requests_total"
AGENT_SERIES = (AGENT_INFO, AGENT_PUSH_INFO, AGENT_PUSH_SENT)
# where the last sample of an agent is looked for: the newest window first, older ones only
# for the agents not found yet (a live agent costs a few minutes of samples)
AGENT_WINDOWS_MS = (15 * 60_000, 24 * 3_600_000, 7 * 24 * 3_600_000)
AGENT_WINDOW_TEXT = "7d"


def _last(series: SeriesSamples) -> tuple[int, float] | None:
    """The newest sample that is a real number (no staleness marker or NaN)."""
    finite = np.flatnonzero(np.isfinite(series.values))
    if not finite.size:
        return None
    i = int(finite[-1])
    return int(series.ts[i]), float(series.values[i])


def agents_seen(
    source: SampleSource, scope: Sequence[Matcher], now_ms: int, tenant_label: str = ""
) -> list[dict[str, Any]]:
    """Each agent (``job`` and ``instance``) seen in the last week: hostname, profile, version,
    GPU source, how it reaches the vault (``push`` when it sends ``metricvault_agent_push_info``,
    else ``scrape``), where it pushes, its pushes stored so far, its last sample and that
    sample's age. ``scope``: the tenant matchers, applied first. Newest first."""
    name = Matcher("__name__", "=~", "|".join(AGENT_SERIES))
    agents: dict[tuple[str, ...], dict[str, Any]] = {}
    done_until = now_ms
    for window in AGENT_WINDOWS_MS:
        start = now_ms - window
        found = source.select([*scope, name], start, done_until)
        for series in found:
            labels = series.labels
            key = (labels.get("job", ""), labels.get("instance", ""), labels.get(tenant_label, ""))
            last = _last(series)
            if last is None:
                continue
            agent = agents.setdefault(key, _agent(labels, tenant_label))
            metric = labels.get("__name__", "")
            if metric == AGENT_INFO:
                for label in ("profile", "version", "gpu_source"):
                    agent[label] = agent[label] or labels.get(label) or None
            elif metric == AGENT_PUSH_INFO:
                agent["mode"] = "push"
                agent["push_url"] = agent["push_url"] or labels.get("url") or None
            elif agent["sent_requests"] is None or last[0] >= agent["_sent_at"]:
                agent["sent_requests"], agent["_sent_at"] = last[1], last[0]
            agent["last_ms"] = max(agent["last_ms"] or 0, last[0])
        done_until = start - 1
        # an agent found in a newer window has its newest sample there
    out = []
    for agent in agents.values():
        agent.pop("_sent_at")
        agent["age_s"] = max(0.0, (now_ms - agent["last_ms"]) / 1000)
        if agent["sent_requests"] is not None:
            agent["sent_requests"] = int(agent["sent_requests"])
        out.append(agent)
    out.sort(key=lambda a: (-a["last_ms"], a["instance"], a["job"]))
    return out


def _agent(labels: Mapping[str, str], tenant_label: str) -> dict[str, Any]:
    instance = labels.get("instance", "")
    host = labels.get("Hostname") or labels.get("hostname") or instance.rpartition(":")[0]
    return {
        "job": labels.get("job", ""),
        "instance": instance,
        "hostname": host or instance,
        "tenant": labels.get(tenant_label) or None if tenant_label else None,
        "profile": None,
        "version": None,
        "gpu_source": None,
        "mode": "scrape",
        "push_url": None,
        "sent_requests": None,
        "_sent_at": -1,
        "last_ms": None,
    }


# --------------------------------------------------------------------------- alerts
ROOT_CAUSE_LABEL, INCIDENT_LABEL = "root_cause", "incident"


def group_alerts(alerts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``/api/v1/alerts`` alerts (firing and pending) as incidents: each ``incident`` label's
    root-cause alert (``root_cause="true"``; None when it has not been sent yet) and its
    evidence (the other members), most severe first; alerts in no incident apart."""
    incidents: dict[str, dict[str, Any]] = {}
    loose = []
    for alert in alerts:
        labels = alert.get("labels", {})
        name = labels.get(INCIDENT_LABEL)
        if not name:
            loose.append(dict(alert))
            continue
        incident = incidents.setdefault(
            name, {"incident": name, "root_cause": None, "cause": None, "evidence": []}
        )
        if labels.get(ROOT_CAUSE_LABEL) == "true":
            incident["root_cause"] = dict(alert)
            incident["cause"] = labels.get("cause")
        else:
            incident["evidence"].append(dict(alert))
    order = ["critical", "error", "warning", "info"]

    def rank(incident: dict[str, Any]) -> tuple[int, str]:
        members = [*incident["evidence"], *filter(None, [incident["root_cause"]])]
        severities = [m.get("labels", {}).get("severity", "") for m in members]
        best = min((order.index(s) for s in severities if s in order), default=len(order))
        return best, incident["incident"]

    for incident in incidents.values():
        incident["evidence"].sort(key=lambda a: (a.get("activeAt", ""), _name(a)))
    return {
        "incidents": sorted(incidents.values(), key=rank),
        "ungrouped": sorted(loose, key=lambda a: (a.get("state") != "firing", _name(a))),
    }


def _name(alert: Mapping[str, Any]) -> str:
    return str(alert.get("labels", {}).get("alertname", ""))


# --------------------------------------------------------------------------- anomalies
ANOMALY_SCORE = "metricvault_anomaly_score"
BASELINE = "metricvault_baseline"
BASELINE_STATS = ("mean", "stddev", "p50", "p95", "p99", "median", "mad")
SCORE_ONLY_LABELS = ("__name__", "source_metric", "detector")
TOP_ANOMALIES = 5


def _downsample(ts: np.ndarray, values: np.ndarray, width: int) -> tuple[list[Any], list[Any]]:
    from metricvault.server.ui_common import downsample

    if not ts.size:
        return [], []
    x, y = downsample(ts.astype(np.float64), values, width)
    return [v / 1000 for v in x.tolist()], [v if math.isfinite(v) else None for v in y.tolist()]


def anomalies(
    source: SampleSource,
    scope: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    width: int,
    top: int = TOP_ANOMALIES,
) -> dict[str, Any]:
    """The ``top`` anomaly-score series with the highest score in ``[start_ms, end_ms]``:
    each with its score and its source series over the range (x in Unix seconds,
    downsampled to ``width`` columns keeping each column's extremes), and the newest
    ``metricvault_baseline`` statistics learned for the source (a baseline whose labels are
    the source's, or a subset of them for a ``--by`` group)."""
    name = Matcher("__name__", "=", ANOMALY_SCORE)
    scores = [s for s in source.select([*scope, name], start_ms, end_ms) if _last(s) is not None]
    total = len(scores)
    scores.sort(key=lambda s: -float(np.nanmax(s.values)))
    baselines = _baselines(source, scope, end_ms)
    out = []
    for series in scores[:top]:
        labels = series.labels
        metric = labels.get("source_metric", "")
        own = {k: v for k, v in labels.items() if k not in SCORE_ONLY_LABELS}
        x, y = _downsample(series.ts, series.values, width)
        entry: dict[str, Any] = {
            "labels": dict(labels),
            "source_metric": metric,
            "detector": labels.get("detector"),
            "max_score": float(np.nanmax(series.values)),
            "points": int(np.isfinite(series.values).sum()),
            "score": {"x": x, "y": y},
            "source": None,
            "baseline": {},
        }
        if metric:
            exact = [Matcher("__name__", "=", metric)]
            exact += [Matcher(k, "=", v) for k, v in sorted(own.items())]
            found = source.select([*scope, *exact], start_ms, end_ms)
            match = [s for s in found if _same(s.labels, own)]
            if match:
                sx, sy = _downsample(match[0].ts, match[0].values, width)
                entry["source"] = {"x": sx, "y": sy}
            entry["baseline"] = _baseline_of(baselines, metric, own)
        out.append(entry)
    return {"start": start_ms / 1000, "end": end_ms / 1000, "series": total, "top": out}


def _same(labels: Mapping[str, str], own: Mapping[str, str]) -> bool:
    return {k: v for k, v in labels.items() if k != "__name__"} == dict(own)


BASELINE_LOOKBACK_MS = 35 * 24 * 3_600_000  # a baseline is recomputed at least monthly


def _baselines(
    source: SampleSource, scope: Sequence[Matcher], end_ms: int
) -> list[tuple[dict[str, str], float]]:
    name = Matcher("__name__", "=", BASELINE)
    stats = Matcher("stat", "=~", "|".join(BASELINE_STATS))
    found = source.select([*scope, name, stats], end_ms - BASELINE_LOOKBACK_MS, end_ms)
    out = []
    for series in found:
        last = _last(series)
        if last is not None:
            out.append((dict(series.labels), last[1]))
    return out


def _baseline_of(
    baselines: Sequence[tuple[dict[str, str], float]], metric: str, own: Mapping[str, str]
) -> dict[str, float]:
    """The statistics of the most specific baseline of ``metric`` whose group labels all
    equal the source's (per series: every label; ``--by``: the group's labels only)."""
    best: dict[str, float] = {}
    best_size = -1
    groups: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for labels, value in baselines:
        if labels.get("source_metric") != metric:
            continue
        group = {k: v for k, v in labels.items() if k not in ("__name__", "source_metric", "stat")}
        if any(own.get(k) != v for k, v in group.items()):
            continue
        groups.setdefault(tuple(sorted(group.items())), {})[labels.get("stat", "")] = value
    for key, stats in groups.items():
        if len(key) > best_size:
            best, best_size = stats, len(key)
    return best


def incident_labelled(
    alerts: Sequence[Mapping[str, Any]], incidents: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The evaluator's alerts with the ``incident`` label of the incident each belongs to
    (``rules-incidents.json``, written by the alert delivery after each round), and each
    incident's root-cause alert where a member is among them. Alerts of no incident are
    returned as they are."""
    member_of: dict[tuple[tuple[str, str], ...], Mapping[str, Any]] = {}
    for incident in incidents:
        for labels in incident.get("members", []):
            member_of[_key(labels)] = incident
    out: list[dict[str, Any]] = []
    shown: dict[str, Mapping[str, Any]] = {}
    for alert in alerts:
        labels = dict(alert.get("labels", {}))
        member = member_of.get(_key(labels))
        if member is not None and not labels.get(INCIDENT_LABEL):
            name = str(member.get("labels", {}).get(INCIDENT_LABEL, ""))
            labels[INCIDENT_LABEL] = name
            if alert.get("state") == "firing":
                shown[name] = member
        out.append({**alert, "labels": labels})
    for incident in shown.values():
        opened = int(incident.get("opened_at_ms", 0))
        out.append(
            {
                "labels": dict(incident.get("labels", {})),
                "annotations": dict(incident.get("annotations", {})),
                "state": "firing",
                "activeAt": _rfc3339(opened),
                "value": "",
            }
        )
    return out


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != INCIDENT_LABEL))


def _rfc3339(ms: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


ANOMALY_RANGES = {
    "1h": 3_600_000,
    "6h": 6 * 3_600_000,
    "1d": 24 * 3_600_000,
    "7d": 7 * 24 * 3_600_000,
    "30d": 30 * 24 * 3_600_000,
}
