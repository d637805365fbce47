"""Rule groups evaluated as Prometheus 2.42 evaluates them (``rules/manager.go``,
``rules/alerting.go``, ``rules/recording.go``).

A group's rules run in order at one timestamp each round, every one reading what the ones
before it wrote. The timestamps are aligned as Prometheus aligns them: multiples of the
group's interval plus an offset from a hash of the group's name and file
(:meth:`RuleGroup.eval_timestamp`), so a restarted evaluator evaluates at the same times.

- A recording rule's samples get the rule's name and labels and are written back.
- An alerting rule's result series become alerts: pending when they appear, firing once they
  have been active ``for`` long, kept firing ``keep_firing_for`` after they vanish, then
  inactive (resolved), kept 15 minutes for the Alertmanager to hear it was resolved.
  ``ALERTS{alertstate}`` and ``ALERTS_FOR_STATE`` are written for every pending and firing
  alert once the group has restored its ``for`` state (:mod:`metricvault.rules.state`).
- A series a rule wrote last round and not this round gets a stale marker.
- ``limit``: more series (recording) or alerts than that fail the rule, as in Prometheus.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash

from metricvault.errors import MetricVaultError, PromQLError
from metricvault.promql import STALE_NAN, Engine
from metricvault.rules.files import DEFAULT_EVALUATION_INTERVAL_MS, GroupSpec, RuleSpec
from metricvault.rules.templates import Sample, expand_alert_template

__all__ = [
    "RESEND_DELAY_MS",
    "RESOLVED_RETENTION_MS",
    "Alert",
    "AlertingRule",
    "EvaluationResult",
    "OutgoingAlert",
    "QueryFunc",
    "RecordingRule",
    "RuleGroup",
    "SampleWriter",
    "engine_query",
    "group_offset_ms",
]

RESOLVED_RETENTION_MS = 15 * 60_000  # resolved alerts are kept (and re-sent) this long
RESEND_DELAY_MS = 60_000  # --rules.alert.resend-delay
ALERT_METRIC = "ALERTS"
ALERT_FOR_STATE_METRIC = "ALERTS_FOR_STATE"
Labels = tuple[tuple[str, str], ...]

# One rule's query: (expr, at_ms) -> the instant vector as (labels, value) pairs.
QueryFunc = Callable[[str, int], list[tuple[dict[str, str], float]]]


class SampleWriter(Protocol):
    """Where recorded samples and ALERTS go: ``(metric, labels, ts_ms, value)`` tuples,
    durable when it returns (the store's ``write``)."""

    def __call__(self, samples: list[tuple[str, dict[str, str], int, float]]) -> None: ...


def engine_query(engine: Engine) -> QueryFunc:
    """Prometheus's ``EngineQueryFunc``: an instant query whose vector (or scalar, as one
    unlabelled sample) is the rule's result; anything else is the rule's error."""

    def query(expr: str, at_ms: int) -> list[tuple[dict[str, str], float]]:
        result = engine.evaluate(expr, at_ms)
        if result.result_type == "vector":
            return [(dict(labels), float(vs[0])) for labels, _, vs in result.series]
        if result.result_type == "scalar":
            return [({}, float(result.series[0][2][0]))]
        raise PromQLError("rule result is not a vector or scalar")

    return query


def _labels(d: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in d.items() if v != ""))


def _go_labels_hash(pairs: Sequence[tuple[str, str]]) -> int:
    """Prometheus's ``labels.Labels.Hash()``: xxhash64 of name, value, each followed by
    0xff, over the sorted labels."""
    buf = bytearray()
    for name, value in sorted(pairs):
        buf += name.encode() + b"\xff" + value.encode() + b"\xff"
    return xxhash.xxh64_intdigest(bytes(buf))


def group_offset_ms(name: str, file: str, interval_ms: int) -> float:
    """Where in its interval a group evaluates: Prometheus's ``hash(name, file) % interval``
    (in nanoseconds), in milliseconds."""
    interval_ns = interval_ms * 1_000_000
    return (_go_labels_hash([("name", name), ("file", file)]) % interval_ns) / 1_000_000


@dataclass
class Alert:
    """One alert of an alerting rule (Prometheus's ``rules.Alert``); times in ms, 0 = unset."""

    labels: dict[str, str]
    annotations: dict[str, str]
    state: str  # "pending", "firing", "inactive"
    value: float
    active_at: int
    fired_at: int = 0
    resolved_at: int = 0
    last_sent_at: int | None = None  # never sent
    valid_until: int = 0
    keep_firing_since: int = 0

    def needs_sending(self, ts: int, resend_delay_ms: int) -> bool:
        if self.state == "pending":
            return False
        if self.last_sent_at is None:
            return True
        if self.resolved_at > self.last_sent_at:  # resolved since the last send
            return True
        return self.last_sent_at + resend_delay_ms < ts


@dataclass(frozen=True)
class OutgoingAlert:
    """An alert as the Alertmanager receives it (``POST /api/v2/alerts``): ``starts_at`` the
    time it fired, ``ends_at`` its resolution or, while firing, when it expires unless
    re-sent (four resend intervals on), in ms."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: int
    ends_at: int
    generator_url: str

    def to_alertmanager(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": _rfc3339(self.starts_at),
            "endsAt": _rfc3339(self.ends_at),
            "generatorURL": self.generator_url,
        }


def _rfc3339(ms: int) -> str:
    secs, frac = divmod(ms, 1000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return text + (f".{frac:03d}".rstrip("0") if frac else "") + "Z"


@dataclass
class RuleStatus:
    health: str = "unknown"  # "ok", "err" (Prometheus's HealthGood/HealthBad), "unknown"
    last_error: str = ""
    last_evaluation_ms: int = 0
    evaluation_seconds: float = 0.0


class RecordingRule:
    kind = "recording"

    def __init__(self, spec: RuleSpec) -> None:
        self.spec = spec
        self.name = spec.record
        self.status = RuleStatus()

    def eval(
        self, ts: int, query: QueryFunc, limit: int, ctx: _Context
    ) -> list[tuple[Labels, float]]:
        out: list[tuple[Labels, float]] = []
        seen: set[Labels] = set()
        for metric, value in query(self.spec.expr, ts):
            labels = dict(metric)
            labels["__name__"] = self.name
            for k, v in self.spec.labels:
                labels[k] = v
            key = _labels(labels)
            if key in seen:
                raise PromQLError(
                    "vector contains metrics with the same labelset after applying rule labels"
                )
            seen.add(key)
            out.append((key, value))
        if limit > 0 and len(out) > limit:
            raise PromQLError(f"exceeded limit of {limit} with {len(out)} series")
        return out


class AlertingRule:
    kind = "alerting"

    def __init__(self, spec: RuleSpec) -> None:
        self.spec = spec
        self.name = spec.alert
        self.status = RuleStatus()
        self.active: dict[Labels, Alert] = {}
        # False until the group restored the `for` state of its alerts: until then no ALERTS
        # or ALERTS_FOR_STATE is written (Prometheus's `restored`)
        self.restored = False

    @property
    def hold_ms(self) -> int:
        return self.spec.for_ms

    def state(self) -> str:
        """The rule's state: the most advanced of its alerts' (inactive without any)."""
        states = {a.state for a in self.active.values()}
        return "firing" if "firing" in states else "pending" if "pending" in states else "inactive"

    def eval(
        self, ts: int, query: QueryFunc, limit: int, ctx: _Context
    ) -> list[tuple[Labels, float]]:
        res = query(self.spec.expr, ts)
        fresh: dict[Labels, Alert] = {}
        for metric, value in res:
            fresh_alert = self._alert_for(metric, value, ts, ctx)
            key = _labels(fresh_alert.labels)
            if key in fresh:
                self.status.health = "err"
                raise PromQLError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            fresh[key] = fresh_alert
        for key, a in fresh.items():
            old = self.active.get(key)
            if old is not None and old.state != "inactive":
                old.value = a.value
                old.annotations = a.annotations
                continue
            self.active[key] = a
        vec: list[tuple[Labels, float]] = []
        active_pending = 0
        for key, a in list(self.active.items()):
            if key not in fresh:
                keep = False
                if a.state == "firing" and self.spec.keep_firing_for_ms > 0:
                    if not a.keep_firing_since:
                        a.keep_firing_since = ts
                    keep = ts - a.keep_firing_since < self.spec.keep_firing_for_ms
                if a.state == "pending" or (
                    a.resolved_at and ts - a.resolved_at > RESOLVED_RETENTION_MS
                ):
                    del self.active[key]
                if a.state != "inactive" and not keep:
                    a.state = "inactive"
                    a.resolved_at = ts
                if not keep:
                    continue
            else:
                a.keep_firing_since = 0
            active_pending += 1
            if a.state == "pending" and ts - a.active_at >= self.hold_ms:
                a.state = "firing"
                a.fired_at = ts
            if self.restored:
                vec.append((_series(a.labels, ALERT_METRIC, a.state), 1.0))
                vec.append((_series(a.labels, ALERT_FOR_STATE_METRIC), float(a.active_at // 1000)))
        if limit > 0 and active_pending > limit:
            self.active = {}
            raise PromQLError(f"exceeded limit of {limit} with {active_pending} alerts")
        return vec

    def _alert_for(self, metric: dict[str, str], value: float, ts: int, ctx: _Context) -> Alert:
        template_labels = {k: v for k, v in metric.items()}

        def expand(text: str) -> str:
            return expand_alert_template(
                self.name,
                text,
                template_labels,
                value,
                external_labels=ctx.external_labels,
                external_url=ctx.external_url,
                query=ctx.template_query(ts),
            )

        labels = {k: v for k, v in metric.items() if k != "__name__"}
        for k, v in self.spec.labels:
            labels[k] = expand(v)
        labels["alertname"] = self.name
        labels = {k: labels[k] for k in sorted(labels) if labels[k] != ""}
        annotations = {k: expand(v) for k, v in sorted(self.spec.annotations)}
        return Alert(labels, annotations, "pending", value, active_at=ts)

    def to_send(
        self, ts: int, resend_delay_ms: int, interval_ms: int, ctx: _Context
    ) -> list[OutgoingAlert]:
        """Prometheus's ``sendAlerts``: the firing and newly resolved alerts due (re)sending."""
        out = []
        delta = max(resend_delay_ms, interval_ms)
        for a in self.active.values():
            if not a.needs_sending(ts, resend_delay_ms):
                continue
            a.last_sent_at = ts
            a.valid_until = ts + 4 * delta  # two missed evaluations or sends are survived
            out.append(
                OutgoingAlert(
                    dict(a.labels),
                    dict(a.annotations),
                    a.fired_at,
                    a.resolved_at or a.valid_until,
                    ctx.external_url + table_link(self.spec.expr),
                )
            )
        return out


def table_link(expr: str) -> str:
    """Prometheus's ``strutil.TableLinkForExpression``."""
    return "/graph?g0.expr=" + urllib.parse.quote_plus(expr) + "&g0.tab=1"


def _series(labels: Mapping[str, str], metric: str, state: str | None = None) -> Labels:
    out = dict(labels)
    out["__name__"] = metric
    if state is not None:
        out["alertstate"] = state
    return _labels(out)


Rule = RecordingRule | AlertingRule


@dataclass
class _Context:
    query: QueryFunc
    external_labels: dict[str, str] = field(default_factory=dict)
    external_url: str = ""

    def template_query(self, ts: int) -> Callable[[str], list[Sample]]:
        def run(expr: str) -> list[Sample]:
            return [Sample(labels, value) for labels, value in self.query(expr, ts)]

        return run


@dataclass
class EvaluationResult:
    """One round of a group at ``at_ms``: the samples written (stale markers included), the
    alerts to send, and each failed rule's error."""

    at_ms: int
    samples: list[tuple[str, dict[str, str], int, float]] = field(default_factory=list)
    alerts: list[OutgoingAlert] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # rule name -> error
    failures: int = 0
    seconds: float = 0.0


class RuleGroup:
    """One group of a rule file, its rules and their state; :meth:`evaluate` runs a round.

    ``query`` answers the rules' expressions (:func:`engine_query` over the engine);
    ``write`` stores what the round produced (none: nothing is written, as in a dry run).
    Callbacks registered with :meth:`on_alerts` receive each round's alerts to send."""

    def __init__(
        self,
        spec: GroupSpec,
        default_interval_ms: int = DEFAULT_EVALUATION_INTERVAL_MS,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.file = spec.file
        self.interval_ms = spec.interval_ms or default_interval_ms
        self.limit = spec.limit
        self.rules: list[Rule] = [
            AlertingRule(r) if r.alert else RecordingRule(r) for r in spec.rules
        ]
        self.previous: list[dict[Labels, None]] = [{} for _ in self.rules]
        self.write_at_once = _read_later(self.rules)
        # Held while a round runs and while its state is read (the API, the converger): the
        # manager evaluates groups in threads of their own.
        self.lock = threading.RLock()
        self.retired = False  # replaced by a reload: a round already queued must not run
        self.last_evaluation_ms = 0
        self.evaluation_seconds = 0.0
        self.failures_total = 0
        self._alert_hooks: list[Callable[[RuleGroup, list[OutgoingAlert]], None]] = []

    @property
    def key(self) -> str:
        """Prometheus's ``GroupKey``: file and name."""
        return f"{self.file};{self.name}"

    def on_alerts(self, hook: Callable[[RuleGroup, list[OutgoingAlert]], None]) -> None:
        self._alert_hooks.append(hook)

    def alerting_rules(self) -> list[AlertingRule]:
        return [r for r in self.rules if isinstance(r, AlertingRule)]

    def eval_timestamp(self, now_ms: int) -> int:
        """The latest evaluation time of this group at or before ``now_ms`` (manager.go's
        ``EvalTimestamp``: interval multiples shifted by the group's hash offset)."""
        interval_ns = self.interval_ms * 1_000_000
        offset = _go_labels_hash([("name", self.name), ("file", self.file)]) % interval_ns
        now_ns = now_ms * 1_000_000
        adj = now_ns - offset
        base = adj - (adj % interval_ns)
        return (base + offset) // 1_000_000

    def copy_state_from(self, old: RuleGroup) -> None:
        """Keep what a reload must not lose (Prometheus's ``CopyState``): alerts, health and
        last series of rules with the same name (and, for alerts, the same expression)."""
        self.last_evaluation_ms = old.last_evaluation_ms
        self.evaluation_seconds = old.evaluation_seconds
        old_by_name: dict[str, list[int]] = {}
        for i, r in enumerate(old.rules):
            old_by_name.setdefault(r.name, []).append(i)
        for i, rule in enumerate(self.rules):
            indices = old_by_name.get(rule.name)
            if not indices:
                continue
            j = indices.pop(0)
            prev = old.rules[j]
            self.previous[i] = old.previous[j]
            rule.status = prev.status
            if isinstance(rule, AlertingRule) and isinstance(prev, AlertingRule):
                rule.active = prev.active
                rule.restored = prev.restored

    def evaluate(
        self,
        at_ms: int,
        query: QueryFunc,
        write: SampleWriter | None = None,
        *,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        resend_delay_ms: int = RESEND_DELAY_MS,
        notify: bool = True,
    ) -> EvaluationResult:
        """One round at ``at_ms`` (Prometheus's ``Group.Eval``): each rule in order, its
        samples written before a later rule of the group that may read them queries (the
        others together at the end of the round: a write makes the next read flush the
        store's buffer). ``notify``: hand the alerts to the hooks (else :meth:`notify`)."""
        ctx = _Context(query, dict(external_labels or {}), external_url)
        result = EvaluationResult(at_ms)
        started = time.perf_counter()
        later: list[tuple[int, list[tuple[str, dict[str, str], int, float]], dict[Labels, None]]]
        later = []
        for i, rule in enumerate(self.rules):
            rule_started = time.perf_counter()
            rule.status.last_evaluation_ms = at_ms
            try:
                vector = rule.eval(at_ms, query, self.limit, ctx)
            except (MetricVaultError, ValueError) as exc:
                text = exc.message if isinstance(exc, MetricVaultError) else str(exc)
                rule.status.health, rule.status.last_error = "err", text
                rule.status.evaluation_seconds = time.perf_counter() - rule_started
                result.errors[rule.name] = text
                result.failures += 1
                self.failures_total += 1
                continue
            rule.status.health, rule.status.last_error = "ok", ""
            if isinstance(rule, AlertingRule):
                result.alerts += rule.to_send(at_ms, resend_delay_ms, self.interval_ms, ctx)
            samples = [(_name(lab), _rest(lab), at_ms, v) for lab, v in vector]
            returned = {lab: None for lab, _ in vector}
            for lab in self.previous[i]:
                if lab not in returned:  # no longer produced: marked stale, as Prometheus does
                    samples.append((_name(lab), _rest(lab), at_ms, STALE_NAN))
            if samples and write is not None and not self.write_at_once[i]:
                later.append((i, samples, returned))
                rule.status.evaluation_seconds = time.perf_counter() - rule_started
                continue
            if samples and write is not None:
                try:
                    write(samples)
                except MetricVaultError as exc:
                    rule.status.health, rule.status.last_error = "err", exc.message
                    result.errors[rule.name] = exc.message
                    result.failures += 1
                    self.failures_total += 1
                    rule.status.evaluation_seconds = time.perf_counter() - rule_started
                    continue
            self.previous[i] = returned
            result.samples += samples
            rule.status.evaluation_seconds = time.perf_counter() - rule_started
        if later and write is not None:
            self._write_later(later, write, result)
        self.last_evaluation_ms = at_ms
        self.evaluation_seconds = result.seconds = time.perf_counter() - started
        if notify:
            self.notify(result.alerts)
        return result

    def _write_later(
        self,
        later: list[tuple[int, list[tuple[str, dict[str, str], int, float]], dict[Labels, None]]],
        write: SampleWriter,
        result: EvaluationResult,
    ) -> None:
        """The round's samples no later rule reads, in one write; failed, each of their rules
        fails as its own write would have."""
        try:
            write([sample for _, samples, _ in later for sample in samples])
        except MetricVaultError as exc:
            for i, _, _ in later:
                rule = self.rules[i]
                rule.status.health, rule.status.last_error = "err", exc.message
                result.errors[rule.name] = exc.message
                result.failures += 1
                self.failures_total += 1
            return
        for i, samples, returned in later:
            self.previous[i] = returned
            result.samples += samples

    def notify(self, alerts: list[OutgoingAlert]) -> None:
        """Hand a round's alerts to the hooks (none: nothing to send)."""
        if alerts:
            for hook in self._alert_hooks:
                hook(self, alerts)

    def stale_samples(self, at_ms: int) -> list[tuple[str, dict[str, str], int, float]]:
        """Stale markers for every series this group wrote last round (a group removed by a
        reload stops its series, as Prometheus does)."""
        return [
            (_name(lab), _rest(lab), at_ms, STALE_NAN) for prev in self.previous for lab in prev
        ]


def _read_later(rules: Sequence[Rule]) -> list[bool]:
    """Per rule, whether a later rule of the group may read what it writes (its metric name
    in a later expression, label or annotation, where a template may query it): those are
    written before the next rule runs, as Prometheus commits each rule's samples."""
    out = []
    for i, rule in enumerate(rules):
        names = (rule.name,) if isinstance(rule, RecordingRule) else (
            ALERT_METRIC, ALERT_FOR_STATE_METRIC
        )  # fmt: skip
        texts = [
            text
            for r in rules[i + 1 :]
            for text in (r.spec.expr, *(v for _, v in r.spec.labels),
                         *(v for _, v in r.spec.annotations))
        ]  # fmt: skip
        out.append(any(name in text for name in names for text in texts))
    return out


def _name(labels: Labels) -> str:
    return next((v for k, v in labels if k == "__name__"), "")


def _rest(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels if k != "__name__"}
