"""The rule groups of a set of files over one store, evaluated on schedule (Prometheus's
rules ``Manager``): loaded, reloaded keeping the alerts of groups that stay, ``for`` state
restored after a start, each round's samples written through the store's write path and
its alerts handed to the ``on_alerts`` hooks (the Alertmanager client).

Rounds follow Prometheus: a group's first round is at its first aligned time after it was
loaded (:meth:`RuleGroup.eval_timestamp`), then every interval; rounds missed (a slow
evaluation, a paused process) are skipped, not replayed, and counted. Groups are independent,
as Prometheus's goroutine per group: each is evaluated on its own schedule in a pool of
``max_concurrent_groups`` threads (the engine's numpy and Arrow work runs outside the GIL), a
slow group delaying only its own next round.

Locks, always taken in this order: the manager's (its groups and schedule), a group's (its
rules' state while a round runs or is read), the counters'. A group's alert hooks run after
its round, outside its lock: a hook reads every group (the converger).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from metricvault.errors import ConfigError, MetricVaultError
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
    max_concurrent_groups: int = 4  # setting rules_max_concurrent_groups


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
        self._round_hooks: list[Callable[[RuleGroup, int], None]] = []
        self._restored_once = False
        self.missed_total = 0
        self.failures_total: dict[str, int] = {}  # group key -> failed rule evaluations
        self.evaluations_total: dict[str, int] = {}
        self.last_reload_ok = True
        self.last_reload_ms = 0
        self.lock = threading.RLock()
        self._counts_lock = threading.Lock()
        self._running: dict[str, Future[None]] = {}  # group key -> its round in flight
        self._pool: ThreadPoolExecutor | None = None
        if self.options.max_concurrent_groups < 1:
            raise ConfigError(
                f"max_concurrent_groups={self.options.max_concurrent_groups}: at least 1 group "
                "must be evaluated at a time (setting rules_max_concurrent_groups)"
            )

    def on_alerts(self, hook: Callable[[RuleGroup, list[OutgoingAlert]], None]) -> None:
        self._hooks.append(hook)
        for g in self.groups:
            g.on_alerts(hook)

    def on_round(self, hook: Callable[[RuleGroup, int], None]) -> None:
        """``hook(group, failures)`` after each round the schedule runs (its own thread)."""
        self._round_hooks.append(hook)

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
                    with prev.lock:  # waits for its round in flight, if any
                        prev.retired = True
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
                with gone.lock:
                    gone.retired = True
                    stale = gone.stale_samples(now)
                self._write(stale)
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

    def run_due(self, now_ms: int | None = None, wait_done: bool = True) -> list[RuleGroup]:
        """Start the round of every group due at ``now_ms`` (a group whose previous round
        still runs misses this one, counted), concurrently; with ``wait_done``, return once
        they are all done. The groups started."""
        now = self.now_ms() if now_ms is None else now_ms
        done = []
        futures = []
        with self.lock:
            for g in self.groups:
                due = self._next.get(g.key)
                if due is None or due > now:
                    continue
                missed = (now - due) // g.interval_ms
                at = due + missed * g.interval_ms
                self._next[g.key] = at + g.interval_ms
                running = self._running.get(g.key)
                busy = running is not None and not running.done()
                if busy:  # its previous round still runs: this one is missed too
                    missed += 1
                if missed > 0:
                    with self._counts_lock:
                        self.missed_total += missed
                if busy:
                    continue
                futures.append(self._start(g, at))
                done.append(g)
        if wait_done:
            wait(futures)
        return done

    def _start(self, g: RuleGroup, at_ms: int) -> Future[None]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.options.max_concurrent_groups, thread_name_prefix="rule-group"
            )
        future = self._pool.submit(self._round, g, at_ms)
        self._running[g.key] = future
        future.add_done_callback(_log_failure)
        return future

    def _round(self, g: RuleGroup, at_ms: int) -> None:
        with g.lock:
            if g.retired:  # a reload replaced it while the round waited for a thread
                return
            alerts, failures = self._evaluate(g, at_ms)
        g.notify(alerts)
        for hook in self._round_hooks:
            hook(g, failures)

    def evaluate_group(self, g: RuleGroup, at_ms: int, notify: bool = True) -> list[OutgoingAlert]:
        """One round of ``g`` at ``at_ms`` in this thread; the alerts it sends."""
        with g.lock:
            alerts, _ = self._evaluate(g, at_ms)
        if notify:
            g.notify(alerts)
        return alerts

    def _evaluate(self, g: RuleGroup, at_ms: int) -> tuple[list[OutgoingAlert], int]:
        o = self.options
        result = g.evaluate(
            at_ms,
            self.query,
            self.write,
            external_labels=o.external_labels,
            external_url=o.external_url,
            resend_delay_ms=o.resend_delay_ms,
            notify=False,
        )
        self._after_round(g, at_ms, result.failures, result.errors)
        return result.alerts, result.failures

    def _after_round(self, g: RuleGroup, at_ms: int, failures: int, errors: dict[str, str]) -> None:
        o = self.options
        with self._counts_lock:
            self.failures_total[g.key] = self.failures_total.get(g.key, 0) + failures
            self.evaluations_total[g.key] = self.evaluations_total.get(g.key, 0) + 1
            self._rounds[g.key] = self._rounds.get(g.key, 0) + 1
            restore = g.key in self._needs_restore and self._rounds[g.key] >= 2
            if restore:
                self._needs_restore.discard(g.key)
        for name, error in errors.items():
            log.warning("rule %s of group %s failed at %d: %s", name, g.name, at_ms, error)
        # Prometheus restores after the second round, once recording rules have written
        if restore:
            try:
                restore_for_state(
                    g, self.source, self.now_ms(), o.outage_tolerance_ms, o.grace_period_ms
                )
            except MetricVaultError as exc:
                log.warning("restoring the alerts of group %s failed: %s", g.name, exc)
                for r in g.alerting_rules():
                    r.restored = True

    def run(self, stop: threading.Event, held: Callable[[], bool] = lambda: True) -> None:
        """Evaluate on schedule until ``stop``; rounds run only while ``held()`` (the lease)."""
        while not stop.is_set():
            due = self.next_due_ms()
            wait = 1.0 if due is None else max(0.0, min(1.0, (due - self.now_ms()) / 1000))
            if stop.wait(wait):
                break
            if due is not None and self.now_ms() >= due and held():
                try:
                    self.run_due(wait_done=False)
                except Exception:  # a bug in one round must not end the evaluator
                    log.exception("rule evaluation round failed")
        self.close()

    def close(self, wait_running: bool = True) -> None:
        """Stop the pool: rounds not started yet are dropped; ``wait_running``: return once
        the round in flight are done."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait_running, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """Prometheus's ``/api/v1/rules`` and ``/api/v1/alerts`` data for every group."""
        with self.lock:
            groups = list(self.groups)
        return rules_status(groups)


def _log_failure(future: Future[None]) -> None:
    exc = None if future.cancelled() else future.exception()
    if exc is not None:  # a bug in one round must not end the evaluator
        log.error("rule evaluation round failed", exc_info=exc)


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
        with g.lock:  # not while a round changes it
            group, active = _group_status(g)
        out_groups.append(group)
        alerts += active
    return {"groups": out_groups, "alerts": alerts}


def _group_status(g: RuleGroup) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    alerts: list[dict[str, Any]] = []
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
    group = {
        "name": g.name,
        "file": g.file,
        "rules": rules,
        "interval": _seconds(g.interval_ms),
        "limit": g.limit,
        "evaluationTime": g.evaluation_seconds,
        "lastEvaluation": _time_or_zero(g.last_evaluation_ms),
    }
    return group, alerts


def status_json(manager: RuleManager, extra: Mapping[str, Any] | None = None) -> bytes:
    """The status as bytes, for the file every gateway worker answers the APIs from."""
    data = manager.status()
    data.update(extra or {})
    data["failures"] = dict(manager.failures_total)
    data["evaluations"] = dict(manager.evaluations_total)
    data["missed"] = manager.missed_total
    return json.dumps(data).encode()
