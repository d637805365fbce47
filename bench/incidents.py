"""Simulated incidents through the shipped rules, convergence and a real Alertmanager.

    .venv/bin/python bench/incidents.py                      # all five scenarios, ~2 min
    .venv/bin/python bench/incidents.py --scenarios agent_death --markdown out.md

Each scenario of ``metricvault.sim.incidents`` (simulated data, ``simulated="true"``) ending
now is written into a fresh vault; the shipped rules (``deploy/rules/*.yml``) are evaluated over
it every 30 s of the scenario's window with the rule evaluator (``RuleGroup.evaluate``, their
recorded series and ALERTS written back), convergence (``Converger``) runs after every round,
and what it hands over goes through the ``Notifier`` to Debian's Alertmanager 0.25 started on
loopback with ``deploy/alertmanager/alertmanager.yml`` (its grouping and inhibit rules; its
timings shortened to group_wait 1 s, group_interval 2 s, every route to a webhook receiver of
this script's own). The evaluation replays the scenario's history faster than it happened, so
the alerts' ``endsAt`` are moved to the wall clock (a firing alert expires as long after *now*
as it would after its evaluation).

The table: scenario, raw alerts fired (distinct label sets that reached ``firing``),
notifications Alertmanager delivered to the webhook, the cause the root-cause alert named, and
whether that is the expected one. Targets: one notification per incident, the right cause in
every scenario. Needs ``prometheus-alertmanager`` (``apt-get install -y
prometheus-alertmanager``); without it the table is printed without the notification column.
"""

# ruff: noqa: E402  (the path set-up below must precede the project imports)
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT, REPO_ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from metricvault.promql import Engine
from metricvault.rules import OutgoingAlert, engine_query, load_rule_files
from metricvault.rules.alertmanager import Alert, Notifier
from metricvault.rules.convergence import (
    ROOT_CAUSE_ALERT,
    Converger,
    Topology,
    firing_alerts,
    targets_down,
)
from metricvault.rules.group import RESEND_DELAY_MS
from metricvault.sim.incidents import SCENARIOS, incident_run
from metricvault.store.vault import Vault

RULES = str(REPO_ROOT / "deploy" / "rules" / "*.yml")
Send = Callable[[list[OutgoingAlert], int], None]


@dataclass
class ScenarioResult:
    name: str
    title: str
    expected_cause: str
    expected_incident: str
    raw_alerts: list[dict[str, str]] = field(default_factory=list)  # each that fired, once
    incidents: dict[str, str] = field(default_factory=dict)  # incident -> cause named
    notifications: list[dict[str, Any]] | None = None  # the webhook's bodies, when delivered
    rounds: int = 0
    seconds: float = 0.0

    def named_causes(self) -> list[str]:
        """The causes the delivered notifications name (or, undelivered, convergence's)."""
        if self.notifications is None:
            return sorted(self.incidents.values())
        return sorted(
            a["labels"].get("cause", "")
            for note in self.notifications
            for a in note["alerts"]
            if a["labels"].get("alertname") == ROOT_CAUSE_ALERT
        )

    @property
    def ok(self) -> bool:
        one = self.notifications is None or len(self.notifications) == 1
        return one and self.named_causes() == [self.expected_cause]


def evaluate_scenario(name: str, end_ms: int, send: Send | None = None) -> ScenarioResult:
    """Scenario ``name`` ending at ``end_ms``: into a vault, the shipped rules over it,
    convergence after each round; ``send(alerts, at_ms)`` receives what would go to
    Alertmanager after each round."""
    run = incident_run(name, end_ms)
    sc = run.scenario
    result = ScenarioResult(sc.name, sc.title, sc.cause, sc.incident)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mv-incident-") as tmp:
        vault = Vault.open_local(str(Path(tmp) / "vault"))
        try:
            vault.write(run.frame)
            groups = load_rule_files([RULES])
            query = engine_query(Engine(vault))

            def write(samples: list[tuple[str, dict[str, str], int, float]]) -> None:
                vault.write(samples)

            # as serve's: a first send waits one resend interval for its incident to form
            converger = Converger(hold_ms=RESEND_DELAY_MS)
            fired: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
            first = run.evaluate_from_ms
            for at in run.evaluation_times():
                outgoing: list[OutgoingAlert] = []
                for group in groups:
                    if (at - first) % group.interval_ms == 0:
                        outgoing += group.evaluate(at, query, write).alerts
                firing = firing_alerts(groups)
                for alert in firing:
                    fired.setdefault(alert.key, dict(alert.labels))
                topology = Topology.from_query(query, at)
                sends = converger.round(at, firing, outgoing, topology, targets_down(query, at))
                result.rounds += 1
                if send is not None and sends:
                    send(sends, at)
            result.raw_alerts = list(fired.values())
            result.incidents = {i.name: i.diagnosis.cause for i in converger.incidents.values()}
        finally:
            vault.close()
    result.seconds = time.perf_counter() - started
    return result


def to_wall_clock(alerts: Sequence[OutgoingAlert], at_ms: int, now_ms: int) -> list[Alert]:
    """Alerts of a round evaluated at ``at_ms`` as if sent at ``now_ms``: a firing alert's
    ``endsAt`` is as far after now as it was after the evaluation; resolved ones keep theirs."""
    out = []
    for alert in alerts:
        if alert.ends_at > at_ms:
            alert = dataclasses.replace(alert, ends_at=now_ms + (alert.ends_at - at_ms))
        out.append(Alert.from_outgoing(alert))
    return out


def notifier_send(notifier: Notifier) -> Send:
    def send(alerts: list[OutgoingAlert], at_ms: int) -> None:
        notifier.send(to_wall_clock(alerts, at_ms, int(time.time() * 1000)))

    return send


def table(results: Sequence[ScenarioResult]) -> str:
    lines = [
        "| scenario | raw alerts fired | notifications delivered | cause named | expected |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        notes = "—" if r.notifications is None else str(len(r.notifications))
        named = ", ".join(r.named_causes()) or "none"
        verdict = "yes" if r.ok else f"**no** ({r.expected_cause})"
        lines.append(
            f"| {r.title} (`{r.name}`) | {len(r.raw_alerts)} | {notes} | `{named}` | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios",
        default=",".join(s.name for s in SCENARIOS),
        help="comma-separated scenario names (default: all)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--no-alertmanager", action="store_true", help="skip the delivery through Alertmanager"
    )
    args = parser.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    results = []
    for name in names:
        if args.no_alertmanager:
            results.append(evaluate_scenario(name, int(time.time() * 1000)))
        else:
            results.append(deliver_scenario(name))
        r = results[-1]
        print(f"{name}: {r.rounds} rounds in {r.seconds:.1f} s", file=sys.stderr)
    text = table(results)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0 if all(r.ok for r in results) else 1


def deliver_scenario(name: str, settle_s: float = 4.0) -> ScenarioResult:
    """:func:`evaluate_scenario` delivered through a fresh Alertmanager to a fresh webhook."""
    from tests.e2e.conftest import free_port, stop_process
    from tests.e2e.test_alertmanager import ALERTMANAGER, Webhook, start_alertmanager

    if ALERTMANAGER is None:
        print("prometheus-alertmanager is not installed: no delivery", file=sys.stderr)
        return evaluate_scenario(name, int(time.time() * 1000))
    hook = Webhook()
    with tempfile.TemporaryDirectory(prefix="mv-am-") as tmp:
        am = start_alertmanager(Path(tmp), hook.url, free_port())
        try:
            with Notifier([am.url]) as notifier:
                result = evaluate_scenario(name, int(time.time() * 1000), notifier_send(notifier))
                notifier.drain(30.0)
            result.notifications = settled_notifications(hook, settle_s)
        finally:
            stop_process(am.proc)
            hook.close()
    return result


def settled_notifications(hook: Any, settle_s: float, timeout_s: float = 30.0) -> list[Any]:
    """The webhook's notifications once the first arrived and ``settle_s`` (two group
    intervals) passed without another."""
    deadline = time.monotonic() + timeout_s
    while not hook.notifications and time.monotonic() < deadline:
        time.sleep(0.05)
    seen, quiet_since = len(hook.notifications), time.monotonic()
    while time.monotonic() - quiet_since < settle_s and time.monotonic() < deadline:
        time.sleep(0.1)
        if len(hook.notifications) != seen:
            seen, quiet_since = len(hook.notifications), time.monotonic()
    with hook.lock:
        return list(hook.notifications)


if __name__ == "__main__":
    raise SystemExit(main())
