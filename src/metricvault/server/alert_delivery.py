"""Alert delivery inside ``serve``: the rule evaluator's alerts, converged on a root cause, sent
to every ``--alertmanager`` (the ``alertmanagers`` setting) through Alertmanager's v2 API.

Each round of a group hands its alerts due (Prometheus's resend rules, rules/group.py) to the
hook built here; the converger (rules/convergence.py) labels them with their ``incident`` and
adds the root-cause alerts due, and the notifier (rules/alertmanager.py) queues them per
Alertmanager, retrying while one is down. The queue depth and what was sent or dropped are
in the gateway's ``/metrics``. Grouping, silences and inhibition stay Alertmanager's job.
The open incidents are also written to ``rules-incidents.json`` in the state directory after
each round (the web UI's Alerts page groups the alerts under them).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from metricvault.fsutil import write_atomically
from metricvault.promql import Engine
from metricvault.rules.alertmanager import Alert, Notifier, TargetStats
from metricvault.rules.convergence import Converger, RoundCache, Topology, firing_alerts
from metricvault.rules.group import OutgoingAlert, RuleGroup, engine_query
from metricvault.server.api import ServerAPI
from metricvault.server.rules_api import ALERT_SINKS, AlertHook, manager_options, rules_source

if TYPE_CHECKING:
    from metricvault.server.app import Gateway


class AlertDeliveryAPI(ServerAPI):
    name = "alert delivery"
    summary = "sends the rules' alerts, converged on a root cause, to every --alertmanager"


API = AlertDeliveryAPI()


INCIDENTS_FILE = "rules-incidents.json"


class Delivery:
    """One evaluator's delivery: the groups it has heard from, the converger, the notifier."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.groups: dict[str, RuleGroup] = {}  # by file and name: a reload replaces them
        options = manager_options(gateway)
        # a first send waits one resend interval for its incident to form (group_wait-like)
        self.converger = Converger(
            resend_delay_ms=options.resend_delay_ms, hold_ms=options.resend_delay_ms
        )
        self.query = engine_query(Engine(rules_source(gateway), options.engine))
        self.cache = RoundCache(self.query)  # the topology, once per evaluation round
        self.lock = threading.Lock()  # groups end their rounds in threads of their own
        self._seen: dict[str, tuple[int, int]] = {}  # url -> (sent, dropped) counted so far
        self.notifier = Notifier(gateway.settings.alertmanagers, on_change=self._count)
        self._published = b""  # the incidents file as last written

    def __call__(self, group: RuleGroup, alerts: list[OutgoingAlert]) -> None:
        with self.lock:
            self.groups[group.key] = group
            at = group.last_evaluation_ms
            firing = firing_alerts(self.groups.values())
            # nothing firing: no incident to place, no topology to ask for
            topology, down = (
                self.cache.round(at, group.interval_ms)
                if firing
                else (Topology(), lambda node: False)
            )
            out = self.converger.round(at, firing, alerts, topology, down)
            self.notifier.send([Alert.from_outgoing(a) for a in out])
            self._publish_incidents()

    def _publish_incidents(self) -> None:
        """The open incidents, for the UI: each one's root-cause alert and its members."""
        incidents = []
        for incident in self.converger.open_incidents():
            labels, annotations = incident.root_cause()
            members = [dict(a.labels) for a in incident.members.values()]
            incidents.append(
                {
                    "labels": labels,
                    "annotations": annotations,
                    "opened_at_ms": incident.opened_at_ms,
                    "members": members,
                }
            )
        data = json.dumps({"incidents": incidents}).encode()
        if data == self._published:  # most rounds change nothing: no write
            return
        path = Path(self.gateway.vault.state_dir) / INCIDENTS_FILE
        write_atomically(str(path), data)
        self._published = data

    def _count(self, url: str, stats: TargetStats) -> None:
        metrics = self.gateway.metrics
        metrics.alert_queue.labels(url).set(stats.queue_length)
        dropped = sum(stats.dropped.values())
        sent_before, dropped_before = self._seen.get(url, (0, 0))
        if stats.sent > sent_before:
            metrics.alerts_sent.labels(url).inc(stats.sent - sent_before)
        if dropped > dropped_before:
            metrics.alerts_dropped.labels(url).inc(dropped - dropped_before)
        self._seen[url] = (stats.sent, dropped)


def delivery(gateway: Gateway) -> AlertHook | None:
    """The hook for the evaluator, or None without an Alertmanager configured."""
    if not gateway.settings.alertmanagers:
        return None
    return Delivery(gateway)


ALERT_SINKS.append(delivery)
