"""Convergence: alerts that fire together about one node or job become one incident, and one
root-cause alert names its likely cause, with the others as evidence.

The topology comes from the labels (the shipped rules' ``scope`` label says what an alert is
about): a GPU or process alert is about its ``Hostname``; a node or agent alert too (there
``job`` is the scrape job, not a workload); a job or service alert is about its ``job``
(``experiment``, ``namespace``/``pod`` alike), and a workload is on the nodes the vault's
series place it on (:class:`Topology`: process series labelled with the job or pod, GPU series
labelled with the pod).

Each round (:meth:`Converger.round`), over the alerts firing now:

1. an alert already in an open incident stays in it (its ``incident`` label never changes
   while it fires); an alert sharing a node or workload with an open incident's members, and
   starting within ``window_ms`` of one of them, joins that incident (the oldest, if several);
2. the other alerts are linked when they share a node or workload and started within
   ``window_ms`` of each other; a linked set becomes a new incident when it holds two alerts or
   more, or one whose cause is known (so the first alert of an incident already carries its
   label, and the ones that follow join it without a second notification);
3. each open incident's cause is decided again from its members, first rule that holds:

   ============================  ========================================================
   ``node_down``                 ``NodeDown`` on a node, or every ``up`` target of a node
                                 that has an agent alert reads 0 (when a query is given)
   ``agent_down``                ``GpuAgentDown`` / ``GpuMetricsAbsent`` on a node whose
                                 node_exporter answers
   ``bad_gpu``                   hardware alerts (XID, fallen off the bus, ECC, row
                                 remapping, PCIe/NVLink) on exactly one GPU of a node
   ``gpu_hardware``              hardware alerts on several GPUs of a node
   ``throttling``                thermal or power throttling on a node
   ``resource_exhaustion``       GPU or process memory growing on a node
   ``job_failure``               a training job stalled or collapsed, none of the above on
                                 its nodes (healthy GPUs)
   ``service_degraded``          an inference service's latency or QPS alerts alone
   ``unknown``                   anything else that fires together
   ============================  ========================================================

   The incident is named after what the cause is about: the node for the node causes, the job
   for ``job_failure``/``service_degraded``;
4. every member gets ``incident=<name>`` (Alertmanager's inhibit rule in
   ``deploy/alertmanager/alertmanager.yml`` mutes them while the root cause fires), and the
   root-cause alert ``alertname="RootCause"``, ``root_cause="true"``, ``incident``, ``cause``,
   the highest ``severity`` of its members, ``Hostname`` or ``job`` of its subject and a
   ``cluster`` its members share is sent, re-sent every ``resend_delay_ms`` while the incident
   is open, and resolved when its last member stops firing. A cause once named is replaced
   only by a stronger one (earlier in the table) and the severity never goes down, so the
   root-cause alert keeps its identity in Alertmanager while its evidence comes and goes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from metricvault.errors import ConfigError, MetricVaultError
from metricvault.rules.group import (
    RESEND_DELAY_MS,
    RESOLVED_RETENTION_MS,
    AlertingRule,
    OutgoingAlert,
    QueryFunc,
    RuleGroup,
)

__all__ = [
    "CAUSES",
    "DEFAULT_WINDOW_MS",
    "ROOT_CAUSE_ALERT",
    "Converger",
    "FiringAlert",
    "Incident",
    "RoundCache",
    "Topology",
    "classify",
    "firing_alerts",
    "targets_down",
]

ROOT_CAUSE_ALERT = "RootCause"
DEFAULT_WINDOW_MS = 60 * 60_000
Key = tuple[tuple[str, str], ...]
Subject = tuple[str, str]  # ("node", "node07") or ("job", "llama") / ("pod", "ns/pod")

# What each shipped alert says about its subject.
SIGNALS: Mapping[str, str] = {
    "NodeDown": "node_down",
    "GpuAgentDown": "agent_down",
    "GpuMetricsAbsent": "agent_down",
    "GpuXidError": "gpu_hardware",
    "GpuFallenOffBus": "gpu_hardware",
    "GpuEccUncorrectableErrors": "gpu_hardware",
    "GpuRowRemapFailure": "gpu_hardware",
    "GpuRowRemapPending": "gpu_hardware",
    "GpuPcieReplayErrors": "gpu_hardware",
    "GpuNvlinkErrors": "gpu_hardware",
    "GpuThermalThrottling": "throttling",
    "GpuPowerThrottling": "throttling",
    "GpuMemoryLeak": "resource_exhaustion",
    "GpuProcessMemoryLeak": "resource_exhaustion",
    "TrainingStalled": "job_failure",
    "TrainingThroughputCollapse": "job_failure",
    "InferenceLatencyHigh": "service_degraded",
    "InferenceQpsDrop": "service_degraded",
}
NODE_CAUSES = (
    "node_down",
    "agent_down",
    "bad_gpu",
    "gpu_hardware",
    "throttling",
    "resource_exhaustion",
)
CAUSES = (*NODE_CAUSES, "job_failure", "service_degraded", "unknown")
EXPLANATIONS: Mapping[str, str] = {
    "node_down": "{subject} is down or unreachable (lost power, crashed or off the network): "
    "its exporters do not answer and its GPUs and jobs went silent with it.",
    "agent_down": "The GPU agent on {subject} is down while the node answers: its GPUs are "
    "unwatched, not necessarily broken.",
    "bad_gpu": "One GPU of {subject} is failing (GPU {gpu}): drain the node and reset or "
    "replace the GPU; the jobs on it are its victims.",
    "gpu_hardware": "Several GPUs of {subject} report hardware errors (GPUs {gpu}): suspect the "
    "node (power, baseboard, NVSwitch) more than one GPU.",
    "throttling": "GPUs of {subject} are throttled: check cooling and power.",
    "resource_exhaustion": "GPU memory on {subject} keeps growing: a leaking process will "
    "exhaust it; restart or fix it before it fails.",
    "job_failure": "Job {subject} stopped making progress while its nodes and GPUs are "
    "healthy: a hang in the job itself (NCCL, data loader, a dead rank).",
    "service_degraded": "Service {subject} is degraded with no node or GPU fault under it.",
    "unknown": "These alerts about {subject} fired together; no rule names their cause.",
}
_SEVERITY_ORDER = ("info", "warning", "critical")
_WORKLOAD_SCOPES = frozenset({"job", "service", "team"})
_NODE_SCOPES = frozenset({"node", "agent"})


def _key(labels: Mapping[str, str]) -> Key:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "incident"))


@dataclass(frozen=True)
class FiringAlert:
    """An alert firing now: its labels (without ``incident``), annotations, when it fired."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    fired_at_ms: int

    @property
    def key(self) -> Key:
        return _key(self.labels)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def describe(self) -> str:
        shown = ", ".join(
            f'{k}="{v}"'
            for k, v in sorted(self.labels.items())
            if k not in ("alertname", "severity", "scope", "incident", "simulated")
        )
        return f"{self.name}{{{shown}}}"


def firing_alerts(groups: Iterable[RuleGroup]) -> list[FiringAlert]:
    """Every firing alert of the groups' alerting rules, as the evaluator holds them (each
    group read under its lock: the others may be in a round of their own)."""
    out = []
    for group in groups:
        with group.lock:
            for rule in group.rules:
                if not isinstance(rule, AlertingRule):
                    continue
                for alert in rule.active.values():
                    if alert.state == "firing":
                        labels, annotations = dict(alert.labels), dict(alert.annotations)
                        out.append(FiringAlert(labels, annotations, alert.fired_at))
    return out


TOPOLOGY_QUERIES = (
    # the agent labels a process with the job/experiment its environment names, or its pod
    "count by (Hostname, job, experiment, namespace, pod) "
    "(last_over_time(metricvault_gpu_process_memory_bytes[1h]))",
    # on Kubernetes the agent labels a GPU with the pod holding it
    'count by (Hostname, namespace, pod) (last_over_time(DCGM_FI_DEV_GPU_UTIL{pod!=""}[1h]))',
)


@dataclass
class Topology:
    """Which nodes each workload (a job, experiment or pod) runs on."""

    workload_nodes: dict[Subject, set[str]] = field(default_factory=dict)

    @classmethod
    def from_label_sets(cls, label_sets: Iterable[Mapping[str, str]]) -> Topology:
        """From series that carry a node (``Hostname``) and a workload label."""
        topology = cls()
        for labels in label_sets:
            node = labels.get("Hostname", "")
            if not node:
                continue
            for subject in _workloads(labels):
                topology.workload_nodes.setdefault(subject, set()).add(node)
        return topology

    @classmethod
    def from_query(
        cls, query: QueryFunc, at_ms: int, queries: Sequence[str] = TOPOLOGY_QUERIES
    ) -> Topology:
        """From the vault's series at ``at_ms`` (:data:`TOPOLOGY_QUERIES`); a query that fails
        leaves its part out (the incidents are then correlated by their own labels only)."""
        label_sets: list[Mapping[str, str]] = []
        for expr in queries:
            try:
                label_sets += [labels for labels, _ in query(expr, at_ms)]
            except (MetricVaultError, ValueError):
                continue
        return cls.from_label_sets(label_sets)

    def nodes_of(self, subject: Subject) -> set[str]:
        return self.workload_nodes.get(subject, set())


def _workloads(labels: Mapping[str, str]) -> list[Subject]:
    out: list[Subject] = []
    if labels.get("job") and labels.get("scope") not in _NODE_SCOPES:
        out.append(("job", labels["job"]))
    if labels.get("experiment"):
        out.append(("experiment", labels["experiment"]))
    if labels.get("pod"):
        out.append(("pod", f"{labels.get('namespace', '')}/{labels['pod']}"))
    return out


def subjects(alert: FiringAlert, topology: Topology) -> set[Subject]:
    """What an alert is about: its node, its workloads, and the nodes those run on."""
    labels = alert.labels
    out: set[Subject] = set()
    if labels.get("Hostname"):
        out.add(("node", labels["Hostname"]))
    for workload in _workloads(labels):
        out.add(workload)
        out |= {("node", node) for node in topology.nodes_of(workload)}
    return out


def targets_down(query: QueryFunc, at_ms: int) -> Callable[[str], bool]:
    """``all_targets_down`` for :func:`classify` from the vault: every ``up`` series of the
    node (its node_exporter, its agent, any other exporter labelled with its ``Hostname``)
    reads 0 at ``at_ms``."""

    def down(node: str) -> bool:
        escaped = node.replace("\\", "\\\\").replace('"', '\\"')
        try:
            values = [v for _, v in query(f'up{{Hostname="{escaped}"}}', at_ms)]
        except (MetricVaultError, ValueError):
            return False
        return bool(values) and all(v == 0 for v in values)

    return down


class RoundCache:
    """The topology and the nodes' ``up`` answers, queried once per evaluation round: every
    group's round hands its alerts over, and the vault's answer does not change within one
    interval. Reused while a round's time is within ``max_age_ms`` after the one that queried
    them (the group's interval), queried again after that or for an earlier time."""

    def __init__(self, query: QueryFunc) -> None:
        self.query = query
        self.at_ms: int | None = None
        self.topology = Topology()
        self._down: dict[str, bool] = {}
        self.queries = 0  # topology queries made (what the cache saves)

    def _fresh(self, at_ms: int, max_age_ms: int) -> None:
        if self.at_ms is None or not 0 <= at_ms - self.at_ms < max_age_ms:
            self.at_ms, self._down = at_ms, {}
            self.topology = Topology.from_query(self.query, at_ms)
            self.queries += len(TOPOLOGY_QUERIES)

    def round(self, at_ms: int, max_age_ms: int) -> tuple[Topology, Callable[[str], bool]]:
        """The topology and ``all_targets_down`` for a round at ``at_ms``."""
        self._fresh(at_ms, max_age_ms)
        asked = targets_down(self.query, self.at_ms or at_ms)

        def down(node: str) -> bool:
            if node not in self._down:
                self._down[node] = asked(node)
            return self._down[node]

        return self.topology, down


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    subject: Subject
    gpus: tuple[str, ...] = ()


def classify(
    alerts: Sequence[FiringAlert], all_targets_down: Callable[[str], bool] | None = None
) -> Diagnosis:
    """The likely cause of alerts that fire together (the rules of the module's table), and
    the node or job it is about. ``all_targets_down(node)`` says whether every ``up`` target
    of the node reads 0."""
    by_node: dict[str, list[FiringAlert]] = {}
    for alert in alerts:
        node = alert.labels.get("Hostname", "")
        if node and SIGNALS.get(alert.name) not in ("job_failure", "service_degraded"):
            by_node.setdefault(node, []).append(alert)
    found: list[tuple[int, str, Diagnosis]] = []
    for node, mine in by_node.items():
        signals = {SIGNALS.get(a.name, "") for a in mine}
        cause = ""
        gpus: tuple[str, ...] = ()
        if "node_down" in signals:
            cause = "node_down"
        elif "agent_down" in signals:
            down = all_targets_down is not None and all_targets_down(node)
            cause = "node_down" if down else "agent_down"
        elif "gpu_hardware" in signals:
            gpus = tuple(
                sorted(
                    {
                        a.labels.get("gpu", "")
                        for a in mine
                        if SIGNALS.get(a.name) == "gpu_hardware"
                    },
                    key=lambda g: (len(g), g),
                )
            )
            cause = "bad_gpu" if len(gpus) == 1 else "gpu_hardware"
        elif "throttling" in signals:
            cause = "throttling"
        elif "resource_exhaustion" in signals:
            cause = "resource_exhaustion"
        if cause:
            found.append((NODE_CAUSES.index(cause), node, Diagnosis(cause, ("node", node), gpus)))
    if found:
        return min(found, key=lambda f: (f[0], f[1]))[2]
    for cause in ("job_failure", "service_degraded"):
        jobs = sorted(a.labels.get("job", "") for a in alerts if SIGNALS.get(a.name) == cause)
        if jobs and jobs[0]:
            return Diagnosis(cause, ("job", jobs[0]))
    subjects_seen = sorted(
        (
            ("node", a.labels["Hostname"])
            if a.labels.get("Hostname")
            else next(iter(_workloads(a.labels)), ("alert", a.name))
        )
        for a in alerts
    )
    return Diagnosis("unknown", subjects_seen[0] if subjects_seen else ("alert", "?"))


@dataclass
class Incident:
    """An open (or recently resolved) incident: its name, members and diagnosis."""

    name: str
    opened_at_ms: int
    members: dict[Key, FiringAlert]
    diagnosis: Diagnosis
    resolved_at_ms: int = 0
    severity: str = ""  # the highest its members had: it never goes down while open
    last_sent_ms: int = -1
    last_labels: dict[str, str] = field(default_factory=dict)
    last_annotations: dict[str, str] = field(default_factory=dict)

    def root_cause(self) -> tuple[dict[str, str], dict[str, str]]:
        """The root-cause alert's labels and annotations now."""
        members = sorted(self.members.values(), key=lambda a: (a.fired_at_ms, a.key))
        d = self.diagnosis
        severities = [a.labels.get("severity", "") for a in members] + [self.severity]
        severity = max(
            (s for s in severities if s in _SEVERITY_ORDER),
            key=_SEVERITY_ORDER.index,
            default="warning",
        )
        self.severity = severity
        labels = {
            "alertname": ROOT_CAUSE_ALERT,
            "root_cause": "true",
            "incident": self.name,
            "cause": d.cause,
            "severity": severity,
            "scope": "incident",
        }
        if d.subject[0] == "node":
            labels["Hostname"] = d.subject[1]
        elif d.subject[0] in ("job", "experiment"):
            labels[d.subject[0]] = d.subject[1]
        clusters = {a.labels.get("cluster", "") for a in members}
        if len(clusters) == 1 and "" not in clusters:
            labels["cluster"] = clusters.pop()
        evidence = "\n".join(f"{a.describe()} firing since {_utc(a.fired_at_ms)}" for a in members)
        what = EXPLANATIONS[d.cause].format(subject=d.subject[1], gpu=", ".join(d.gpus))
        annotations = {
            "summary": f"{self.name}: {d.cause.replace('_', ' ')} ({len(members)} alert"
            f"{'s' if len(members) != 1 else ''})",
            "description": what,
            "evidence": evidence,
            "alerts": str(len(members)),
        }
        return labels, annotations


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


class Converger:
    """Keeps the open incidents between rounds; one per evaluator (not thread-safe)."""

    def __init__(
        self,
        window_ms: int = DEFAULT_WINDOW_MS,
        *,
        resend_delay_ms: int = RESEND_DELAY_MS,
        resolved_retention_ms: int = RESOLVED_RETENTION_MS,
        external_url: str = "",
        hold_ms: int = 0,
    ) -> None:
        if window_ms <= 0 or resend_delay_ms <= 0 or resolved_retention_ms < 0 or hold_ms < 0:
            raise ConfigError(
                f"convergence window {window_ms} ms, resend delay {resend_delay_ms} ms, "
                f"resolved retention {resolved_retention_ms} ms and hold {hold_ms} ms: the "
                "window and the delay must be positive, the retention and the hold not "
                "negative (defaults 3600000, 60000, 900000, 0)"
            )
        self.window_ms = window_ms
        self.resend_delay_ms = resend_delay_ms
        self.resolved_retention_ms = resolved_retention_ms
        self.external_url = external_url
        # A new alert about something (a node, a job) that is in no incident yet waits this
        # long before its first send, as Alertmanager's group_wait: an incident forming in
        # the meantime labels it, so Alertmanager inhibits it under the root cause instead
        # of notifying it alone. 0: sent at once.
        self.hold_ms = hold_ms
        self._held: dict[Key, tuple[OutgoingAlert, int]] = {}  # first sends waiting, since
        self._released: set[Key] = set()  # firing alerts sent at least once
        self.incidents: dict[str, Incident] = {}  # open and recently resolved, by name
        self._member_of: dict[Key, str] = {}
        self._former: dict[Key, tuple[str, int]] = {}  # resolved members: incident, until

    def open_incidents(self) -> list[Incident]:
        return [i for i in self.incidents.values() if not i.resolved_at_ms]

    def incident_of(self, labels: Mapping[str, str]) -> str:
        """The incident an alert (firing, or resolved lately) belongs to; "" for none."""
        key = _key(labels)
        name = self._member_of.get(key)
        if name is not None:
            return name
        former = self._former.get(key)
        return former[0] if former is not None else ""

    def round(
        self,
        at_ms: int,
        firing: Sequence[FiringAlert],
        outgoing: Sequence[OutgoingAlert] = (),
        topology: Topology | None = None,
        all_targets_down: Callable[[str], bool] | None = None,
    ) -> list[OutgoingAlert]:
        """Update the incidents with the alerts firing at ``at_ms``; return what to send to
        Alertmanager: ``outgoing`` (the evaluator's alerts due) with their ``incident`` label
        and the root-cause alerts due."""
        topology = topology or Topology()
        now = {a.key: a for a in firing}
        self._drop_gone(at_ms, now)
        about = {key: subjects(a, topology) for key, a in now.items()}
        loose = [a for a in firing if a.key not in self._member_of]
        for alert in list(loose):
            incident = self._joinable(alert, about)
            if incident is not None:
                incident.members[alert.key] = alert
                self._member_of[alert.key] = incident.name
                loose.remove(alert)
        for component in self._components(loose, about):
            diagnosis = classify(component, all_targets_down)
            if len(component) < 2 and diagnosis.cause == "unknown":
                continue
            name = self._fresh_name(diagnosis.subject[1])
            opened = min(a.fired_at_ms for a in component)
            incident = Incident(name, opened, {a.key: a for a in component}, diagnosis)
            self.incidents[name] = incident
            for a in component:
                self._member_of[a.key] = name
        for incident in self.open_incidents():
            for key in incident.members:
                incident.members[key] = now[key]  # the newest annotations
            fresh = classify(list(incident.members.values()), all_targets_down)
            if CAUSES.index(fresh.cause) < CAUSES.index(incident.diagnosis.cause):
                incident.diagnosis = fresh  # only a stronger cause replaces the one named
        out = self._hold(at_ms, outgoing, now, about)
        out += self._root_causes_due(at_ms)
        return out

    def _hold(
        self,
        at_ms: int,
        outgoing: Sequence[OutgoingAlert],
        now: Mapping[Key, FiringAlert],
        about: Mapping[Key, set[Subject]],
    ) -> list[OutgoingAlert]:
        """``outgoing`` labelled with their incident, less the first sends held back
        (``hold_ms``), plus the held ones whose incident formed or whose hold is over."""
        self._released &= now.keys()
        out = []
        for alert in outgoing:
            key = _key(alert.labels)
            fresh = key in now and key not in self._released and about.get(key)
            if self.hold_ms and fresh and not self.incident_of(alert.labels):
                since = self._held.get(key, (alert, at_ms))[1]
                self._held[key] = (alert, since)
                continue
            if key in self._held and key not in now:
                del self._held[key]  # resolved before it was ever sent: nothing to tell
                continue
            self._held.pop(key, None)
            if key in now:
                self._released.add(key)
            out.append(self._labelled(alert))
        for key, (alert, since) in list(self._held.items()):
            if key not in now:
                del self._held[key]
            elif self.incident_of(alert.labels) or at_ms - since >= self.hold_ms:
                del self._held[key]
                self._released.add(key)
                out.append(self._labelled(alert))
        return out

    def _drop_gone(self, at_ms: int, now: Mapping[Key, FiringAlert]) -> None:
        for key, (_, until) in list(self._former.items()):
            if until < at_ms:
                del self._former[key]
        for incident in self.open_incidents():
            for key in [k for k in incident.members if k not in now]:
                del incident.members[key]
                del self._member_of[key]
                self._former[key] = (incident.name, at_ms + self.resolved_retention_ms)
            if not incident.members:
                incident.resolved_at_ms = at_ms
        for name, incident in list(self.incidents.items()):
            if (
                incident.resolved_at_ms
                and at_ms - incident.resolved_at_ms > self.resolved_retention_ms
            ):
                del self.incidents[name]

    def _joinable(self, alert: FiringAlert, about: Mapping[Key, set[Subject]]) -> Incident | None:
        mine = about[alert.key]
        for incident in sorted(self.open_incidents(), key=lambda i: (i.opened_at_ms, i.name)):
            for member in incident.members.values():
                if abs(member.fired_at_ms - alert.fired_at_ms) > self.window_ms:
                    continue
                if mine & about.get(member.key, set()):
                    return incident
        return None

    def _components(
        self, alerts: Sequence[FiringAlert], about: Mapping[Key, set[Subject]]
    ) -> list[list[FiringAlert]]:
        parent = list(range(len(alerts)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, a in enumerate(alerts):
            for j in range(i):
                b = alerts[j]
                near = abs(a.fired_at_ms - b.fired_at_ms) <= self.window_ms
                if near and about[a.key] & about[b.key]:
                    parent[find(i)] = find(j)
        groups: dict[int, list[FiringAlert]] = {}
        for i, a in enumerate(alerts):
            if about[a.key]:
                groups.setdefault(find(i), []).append(a)
        return [sorted(g, key=lambda a: (a.fired_at_ms, a.key)) for g in groups.values()]

    def _fresh_name(self, base: str) -> str:
        name, n = base, 2
        while name in self.incidents:
            name, n = f"{base}#{n}", n + 1
        return name

    def _labelled(self, alert: OutgoingAlert) -> OutgoingAlert:
        name = self.incident_of(alert.labels)
        if not name or alert.labels.get("incident") == name:
            return alert
        return dataclasses.replace(alert, labels={**alert.labels, "incident": name})

    def _root_causes_due(self, at_ms: int) -> list[OutgoingAlert]:
        out = []
        for incident in self.incidents.values():
            resolved = incident.resolved_at_ms
            if resolved:  # resolved as it was last sent: the same alert, now ended
                labels, annotations = incident.last_labels, incident.last_annotations
            else:
                labels, annotations = incident.root_cause()
            due = (
                incident.last_sent_ms < 0
                or (labels, annotations) != (incident.last_labels, incident.last_annotations)
                or at_ms - incident.last_sent_ms >= self.resend_delay_ms
                or (resolved and incident.last_sent_ms < resolved)
            )
            if not due:
                continue
            incident.last_sent_ms = at_ms
            incident.last_labels, incident.last_annotations = labels, annotations
            ends = resolved or at_ms + 4 * self.resend_delay_ms
            url = (
                f"{self.external_url}/alerts?incident={incident.name}" if self.external_url else ""
            )
            out.append(OutgoingAlert(labels, annotations, incident.opened_at_ms, ends, url))
        return out
