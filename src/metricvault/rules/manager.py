"""The rule groups of a set of files over one store, evaluated on schedule (Prometheus's
rules ``Manager``): loaded, reloaded keeping the alerts of groups that stay, ``for`` state
restored after a start, each round's samples written through the store's write path and
its alerts handed to the ``on_alerts`` hooks (the Alertmanager client).

Rounds follow Prometheus: a group's first round is at its first aligned time after it was
loaded (:meth:`RuleGroup.eval_timestamp`), then every interval; rounds missed (a slow
evaluation, a paused process) are skipped, not replayed, and counted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from metricvault.errors import MetricVaultError
from metricvault.promql import Engine, EngineOptions
from metricvault.promql.parse import parse as parse_promql
from metricvault.protocols import SampleSource
from metricvault.rules.files import DEFAULT_EVALUATION_INTERVAL_MS, read_rule_files
from metricvault.rules.group import (
    RESEND_DELAY_MS,
    AlertingRule,
    OutgoingAlert,
    RuleGroup,
    SampleWriter,
    engine_query,
)
from metricvault.rules.state import FOR_GRACE_PERIOD_MS, OUTAGE_TOLERANCE_MS, restore_for_state
from metricvault.rules.templates import go_format_float

__all__ = ["ManagerOptions", "RuleManager", "rules_status"]

log = logging.getLogger("metricvault.rules")


@dataclass(frozen=True)
class ManagerOptions:
    default_interval_ms: int = DEFAULT_EVALUATION_INTERVAL_MS
    outage_tolerance_ms: int = OUTAGE_TOLERANCE_MS
    grace_period_ms: int = FOR_GRACE_PERIOD_MS
    resend_delay_ms: int = RESEND_DELAY_MS
    external_url: str = ""
    external_labels: Mapping[str, str] = field(default_factory=dict)
    engine: EngineOptions = field(default_factory=EngineOptions)


class RuleManager:
    """``load(patterns)``, then ``run_due(now_ms)`` as often as wanted (or ``run(stop)`` in a
    thread); ``on_alerts(hook)`` hears every round's alerts to send."""

    def __init__(
        self,
        source: SampleSource,
        write: SampleWriter | None,
        options: ManagerOptions | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.write = write
        self.options = options or ManagerOptions()
        self.clock = clock
        self.query = engine_query(Engine(source, self.options.engine))
        self.groups: list[RuleGroup] = []
        self.patterns: tuple[str, ...] = ()
        self._next: dict[str, int] = {}  # group key -> its next round's time
        self._rounds: dict[str, int] = {}  # rounds since the group was created
        self._needs_restore: set[str] = set()
        self._hooks: list[Callable[[RuleGroup, list[OutgoingAlert]], None]] = []
        self._restored_once = False
        self.missed_total = 0
        self.failures_total: dict[str, int] = {}  # group key -> failed rule evaluations
        self.evaluations_total: dict[str, int] = {}
        self.last_reload_ok = True
        self.last_reload_ms = 0
        self.lock = threading.RLock()

    def on_alerts(self, hook: Callable[[RuleGroup, list[OutgoingAlert]], None]) -> None:
        self._hooks.append(hook)
        for g in self.groups:
            g.on_alerts(hook)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def load(self, patterns: Iterable[str]) -> list[RuleGroup]:
        """(Re)load the rule files; a file Prometheus would refuse raises and changes
        nothing. Groups that stay (same file and name) keep their alerts and series."""
        patterns = tuple(patterns)
        specs = read_rule_files(patterns)
        with self.lock:
            old = {g.key: g for g in self.groups}
            fresh = []
            for spec in specs:
                g = RuleGroup(spec, self.options.default_interval_ms)
                prev = old.pop(g.key, None)
                if prev is not None:
                    g.copy_state_from(prev)
                    if prev.key in self._next and prev.interval_ms == g.interval_ms:
                        self._next[g.key] = self._next[prev.key]
                elif not self._restored_once:
                    self._needs_restore.add(g.key)
                else:  # a group added by a reload starts restored, as in Prometheus
                    for r in g.alerting_rules():
                        r.restored = True
                for hook in self._hooks:
                    g.on_alerts(hook)
                fresh.append(g)
            now = self.now_ms()
            for gone in old.values():  # removed groups: their series end now
                self._write(gone.stale_samples(now))
                self._next.pop(gone.key, None)
            for g in fresh:
                if g.key not in self._next:
                    self._next[g.key] = g.eval_timestamp(now) + g.interval_ms
                    self._rounds[g.key] = 0
            self.groups = fresh
            self.patterns = patterns
            self._restored_once = True
            self.last_reload_ms = now
        return fresh

    def _write(self, samples: list[tuple[str, dict[str, str], int, float]]) -> None:
        if samples and self.write is not None:
            try:
                self.write(samples)
            except MetricVaultError as exc:
                log.warning("writing stale markers of removed rule groups failed: %s", exc)

    def next_due_ms(self) -> int | None:
        with self.lock:
            return min(self._next.values(), default=None)

    def run_due(self, now_ms: int | None = None) -> list[RuleGroup]:
        """Evaluate every group whose round is due at ``now_ms``; the groups evaluated."""
        now = self.now_ms() if now_ms is None else now_ms
        done = []
        with self.lock:
            for g in self.groups:
                due = self._next.get(g.key)
                if due is None or due > now:
                    continue
                missed = (now - due) // g.interval_ms
                if missed > 0:
                    self.missed_total += missed
                at = due + missed * g.interval_ms
                self.evaluate_group(g, at)
                self._next[g.key] = at + g.interval_ms
                done.append(g)
        return done

    def evaluate_group(self, g: RuleGroup, at_ms: int) -> None:
        o = self.options
        result = g.evaluate(
            at_ms,
            self.query,
            self.write,
            external_labels=o.external_labels,
            external_url=o.external_url,
            resend_delay_ms=o.resend_delay_ms,
        )
        self.failures_total[g.key] = self.failures_total.get(g.key, 0) + result.failures
        self.evaluations_total[g.key] = self.evaluations_total.get(g.key, 0) + 1
        for name, error in result.errors.items():
            log.warning("rule %s of group %s failed at %d: %s", name, g.name, at_ms, error)
        self._rounds[g.key] = self._rounds.get(g.key, 0) + 1
        # Prometheus restores after the second round, once recording rules have written
        if g.key in self._needs_restore and self._rounds[g.key] >= 2:
            try:
                restore_for_state(
                    g, self.source, self.now_ms(), o.outage_tolerance_ms, o.grace_period_ms
                )
            except MetricVaultError as exc:
                log.warning("restoring the alerts of group %s failed: %s", g.name, exc)
                for r in g.alerting_rules():
                    r.restored = True
            self._needs_restore.discard(g.key)

    def run(self, stop: threading.Event, held: Callable[[], bool] = lambda: True) -> None:
        """Evaluate on schedule until ``stop``; rounds run only while ``held()`` (the lease)."""
        while not stop.is_set():
            due = self.next_due_ms()
            wait = 1.0 if due is None else max(0.0, min(1.0, (due - self.now_ms()) / 1000))
            if stop.wait(wait):
                break
            if due is not None and self.now_ms() >= due and held():
                try:
                    self.run_due()
                except Exception:  # a bug in one round must not end the evaluator
                    log.exception("rule evaluation round failed")

    def status(self) -> dict[str, Any]:
        """Prometheus's ``/api/v1/rules`` and ``/api/v1/alerts`` data for every group."""
        with self.lock:
            return rules_status(self.groups)


def _rfc3339(ms: int) -> str:
    secs, frac = divmod(ms, 1000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return text + (f".{frac:03d}".rstrip("0") if frac else "") + "Z"


def _time_or_zero(ms: int) -> str:
    return _rfc3339(ms) if ms else "0001-01-01T00:00:00Z"


def _format_e(value: float) -> str:
    """``strconv.FormatFloat(v, 'e', -1, 64)``: how Prometheus's API writes an alert's value."""
    return go_format_float(value, "e")


def _seconds(ms: int) -> float | int:
    """Seconds as Go's JSON writes a float64: ``60``, not ``60.0``."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _alert_json(a: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "labels": a.labels,
        "annotations": a.annotations,
        "state": a.state,
        "activeAt": _rfc3339(a.active_at),
        "value": _format_e(a.value),
    }
    if a.keep_firing_since:
        out["keepFiringSince"] = _rfc3339(a.keep_firing_since)
    return out


def query_text(expr: str) -> str:
    """The expression as Prometheus prints a parsed one (``on (x) group_left ()``), on one
    line; the text as written where the printer would break it over lines."""
    try:
        text = str(parse_promql(expr).prettify())
    except MetricVaultError:
        return expr
    return expr if "\n" in text else text


def rules_status(groups: Sequence[RuleGroup]) -> dict[str, Any]:
    """``{"groups": [...], "alerts": [...]}``: the JSON of Prometheus's rules and alerts APIs
    (the alerts list holds pending and firing alerts, as Prometheus's ``/api/v1/alerts``)."""
    out_groups = []
    alerts: list[dict[str, Any]] = []
    for g in groups:
        rules = []
        for r in g.rules:
            query = query_text(r.spec.expr)
            common: dict[str, Any] = {"name": r.name, "query": query}
            if r.spec.labels:  # omitempty in Prometheus's recording rule JSON
                common["labels"] = dict(sorted(r.spec.labels))
            common["health"] = r.status.health
            if r.status.last_error:  # omitempty
                common["lastError"] = r.status.last_error
            common["evaluationTime"] = r.status.evaluation_seconds
            common["lastEvaluation"] = _time_or_zero(r.status.last_evaluation_ms)
            if isinstance(r, AlertingRule):
                active = [_alert_json(a) for a in r.active.values() if a.state != "inactive"]
                rule: dict[str, Any] = {
                    "state": r.state(),
                    "name": r.name,
                    "query": query,
                    "duration": _seconds(r.spec.for_ms),
                    "keepFiringFor": _seconds(r.spec.keep_firing_for_ms),
                    "labels": dict(sorted(r.spec.labels)),
                    "annotations": dict(sorted(r.spec.annotations)),
                    "alerts": active,
                    "health": r.status.health,
                }
                if r.status.last_error:
                    rule["lastError"] = r.status.last_error
                rule["evaluationTime"] = common["evaluationTime"]
                rule["lastEvaluation"] = common["lastEvaluation"]
                rule["type"] = "alerting"
                rules.append(rule)
                alerts += active
            else:
                rules.append({**common, "type": "recording"})
        out_groups.append(
            {
                "name": g.name,
                "file": g.file,
                "rules": rules,
                "interval": _seconds(g.interval_ms),
                "limit": g.limit,
                "evaluationTime": g.evaluation_seconds,
                "lastEvaluation": _time_or_zero(g.last_evaluation_ms),
            }
        )
    return {"groups": out_groups, "alerts": alerts}


def status_json(manager: RuleManager, extra: Mapping[str, Any] | None = None) -> bytes:
    """The status as bytes, for the file every gateway worker answers the APIs from."""
    data = manager.status()
    data.update(extra or {})
    data["failures"] = dict(manager.failures_total)
    data["evaluations"] = dict(manager.evaluations_total)
    data["missed"] = manager.missed_total
    return json.dumps(data).encode()
