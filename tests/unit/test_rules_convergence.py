"""Convergence: alerts that fire together about a node or a job become one incident whose
root-cause alert names the cause; its members carry the incident label, keep it while they
fire, and the root cause resolves with its last member."""

from __future__ import annotations

import pytest

from metricvault.errors import ConfigError
from metricvault.rules.convergence import (
    ROOT_CAUSE_ALERT,
    Converger,
    FiringAlert,
    Topology,
    classify,
    targets_down,
)
from metricvault.rules.group import OutgoingAlert

MIN = 60_000
T0 = 1_767_225_600_000
TOPOLOGY = Topology.from_label_sets(
    [
        {"Hostname": "node01", "job": "llama", "pid": "1"},
        {"Hostname": "node02", "job": "llama", "pid": "2"},
        {"Hostname": "node04", "namespace": "inference", "pod": "llm-0"},
    ]
)


def _a(name: str, at: int = T0, **labels: str) -> FiringAlert:
    return FiringAlert({"alertname": name, **labels}, {"summary": name}, at)


def _at(alert: FiringAlert, at: int) -> FiringAlert:
    return FiringAlert(alert.labels, alert.annotations, at)


def node(name: str, host: str, **labels: str) -> FiringAlert:
    scope = {"NodeDown": "node", "GpuAgentDown": "agent", "GpuMetricsAbsent": "agent"}
    all_labels = {"alertname": name, "Hostname": host, "scope": scope.get(name, "gpu"), **labels}
    return FiringAlert(all_labels, {"summary": name}, T0)


def job(name: str, job_name: str = "llama") -> FiringAlert:
    return _a(name, job=job_name, scope="job", severity="critical")


CASES = [
    (
        "node down with its agent, GPUs and job",
        [
            node("NodeDown", "node02", job="node", severity="critical"),
            node("GpuAgentDown", "node02", job="metricvault-agent"),
            node("GpuMetricsAbsent", "node02"),
            job("TrainingStalled"),
        ],
        ("node_down", ("node", "node02")),
    ),
    (
        "agent down, node answers",
        [
            node("GpuAgentDown", "node01", job="metricvault-agent"),
            node("GpuMetricsAbsent", "node01"),
        ],
        ("agent_down", ("node", "node01")),
    ),
    (
        "XIDs and fallen off the bus on one GPU, its job stalled",
        [
            node("GpuXidError", "node02", gpu="3", xid="13"),
            node("GpuFallenOffBus", "node02", gpu="3"),
            job("TrainingStalled"),
        ],
        ("bad_gpu", ("node", "node02")),
    ),
    (
        "hardware errors on two GPUs",
        [
            node("GpuXidError", "node02", gpu="3"),
            node("GpuEccUncorrectableErrors", "node02", gpu="5"),
        ],
        ("gpu_hardware", ("node", "node02")),
    ),
    (
        "training stalled with healthy GPUs",
        [job("TrainingStalled"), job("TrainingThroughputCollapse")],
        ("job_failure", ("job", "llama")),
    ),
    (
        "memory growing under an inference pod",
        [
            node("GpuProcessMemoryLeak", "node04", gpu="0", pod="llm-0", namespace="inference"),
            node("GpuMemoryLeak", "node04", gpu="0"),
        ],
        ("resource_exhaustion", ("node", "node04")),
    ),
    (
        "alerts no rule explains",
        [node("ClockOffsetTooLarge", "node03"), node("CounterResetStorm", "node03")],
        ("unknown", ("node", "node03")),
    ),
]


@pytest.mark.parametrize(("alerts", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_cause_of_alerts_firing_together(
    alerts: list[FiringAlert], want: tuple[str, tuple[str, str]]
) -> None:
    d = classify(alerts)
    assert (d.cause, d.subject) == want


def test_an_agent_alert_on_a_node_whose_targets_all_read_zero_is_a_node_down() -> None:
    alerts = [node("GpuAgentDown", "node01"), node("GpuMetricsAbsent", "node01")]
    assert classify(alerts, lambda host: host == "node01").cause == "node_down"
    assert classify(alerts, lambda host: False).cause == "agent_down"


def test_targets_down_reads_every_up_series_of_the_node() -> None:
    answers = {'up{Hostname="node01"}': [0.0, 0.0], 'up{Hostname="node02"}': [0.0, 1.0]}

    def query(expr: str, at: int) -> list[tuple[dict[str, str], float]]:
        return [({}, v) for v in answers.get(expr, [])]

    down = targets_down(query, T0)
    assert (down("node01"), down("node02"), down("node09")) == (True, False, False)


def _out(alert: FiringAlert) -> OutgoingAlert:
    return OutgoingAlert(dict(alert.labels), {}, alert.fired_at_ms, alert.fired_at_ms + 4 * MIN, "")


def test_members_carry_the_incident_and_one_root_cause_names_it() -> None:
    conv = Converger()
    alerts = [node("NodeDown", "node02", severity="critical"), node("GpuAgentDown", "node02")]
    sent = conv.round(T0, alerts, [_out(a) for a in alerts], TOPOLOGY)
    roots = [a for a in sent if a.labels["alertname"] == ROOT_CAUSE_ALERT]
    [root] = roots
    assert root.labels["cause"] == "node_down"
    assert root.labels["incident"] == "node02" == root.labels["Hostname"]
    assert root.labels["severity"] == "critical"
    assert root.labels["root_cause"] == "true"
    assert "NodeDown" in root.annotations["evidence"]
    assert {a.labels["incident"] for a in sent} == {"node02"}


def test_a_later_alert_joins_the_open_incident_through_the_topology() -> None:
    conv = Converger()
    first = [node("NodeDown", "node02"), node("GpuAgentDown", "node02")]
    conv.round(T0, first, [], TOPOLOGY)
    stalled = _a("TrainingStalled", T0 + 20 * MIN, job="llama", scope="job")
    sent = conv.round(T0 + 20 * MIN, [*first, stalled], [_out(stalled)], TOPOLOGY)
    assert [a.labels["incident"] for a in sent if a.labels["alertname"] == "TrainingStalled"] == [
        "node02"
    ]
    assert [i.name for i in conv.open_incidents()] == ["node02"]
    # re-sent within the resend delay only when it changed (the evidence grew here)
    assert [a.labels["alertname"] for a in sent] == ["TrainingStalled", ROOT_CAUSE_ALERT]
    assert conv.round(T0 + 20 * MIN + 30_000, [*first, stalled], [], TOPOLOGY) == []


def test_an_alert_alone_with_a_known_cause_opens_an_incident_and_an_unexplained_one_does_not() -> (
    None
):
    conv = Converger()
    sent = conv.round(
        T0, [node("GpuProcessMemoryLeak", "node04", pod="llm-0", namespace="inference")]
    )
    assert [a.labels.get("cause") for a in sent] == ["resource_exhaustion"]
    conv = Converger()
    assert conv.round(T0, [node("ClockOffsetTooLarge", "node03")]) == []
    assert conv.open_incidents() == []


def test_the_cause_is_only_replaced_by_a_stronger_one_and_resolves_with_its_last_member() -> None:
    conv = Converger()
    agent = node("GpuAgentDown", "node02")
    conv.round(T0, [agent])
    assert conv.open_incidents()[0].diagnosis.cause == "agent_down"
    down = node("NodeDown", "node02")
    conv.round(T0 + MIN, [agent, down])
    assert conv.open_incidents()[0].diagnosis.cause == "node_down"
    conv.round(T0 + 2 * MIN, [agent])  # the node exporter answers again first
    assert conv.open_incidents()[0].diagnosis.cause == "node_down"
    sent = conv.round(T0 + 3 * MIN, [])
    [root] = sent
    assert root.ends_at == T0 + 3 * MIN and root.labels["cause"] == "node_down"
    assert conv.open_incidents() == []
    # a resolved member keeps its incident label while its resolution is re-sent
    assert conv.incident_of(agent.labels) == "node02"


def test_alerts_far_apart_in_time_are_separate_incidents() -> None:
    conv = Converger(window_ms=10 * MIN)
    early = node("GpuXidError", "node02", gpu="1")
    conv.round(T0, [early])
    late = node("GpuFallenOffBus", "node02", gpu="1")
    late = FiringAlert(late.labels, late.annotations, T0 + 3 * 60 * MIN)
    conv.round(T0 + 3 * 60 * MIN, [early, late])
    assert sorted(i.name for i in conv.open_incidents()) == ["node02", "node02#2"]


@pytest.mark.parametrize(
    "options",
    [{"window_ms": 0}, {"resend_delay_ms": -1}, {"resolved_retention_ms": -5}],
    ids=["no window", "negative resend delay", "negative retention"],
)
def test_bad_settings_are_refused_with_the_defaults(options: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="defaults 3600000, 60000, 900000"):
        Converger(
            options.get("window_ms", 3_600_000),
            resend_delay_ms=options.get("resend_delay_ms", 60_000),
            resolved_retention_ms=options.get("resolved_retention_ms", 900_000),
        )


def test_a_held_first_send_goes_out_with_the_incident_that_formed_meanwhile() -> None:
    conv = Converger(hold_ms=MIN)
    clock = node("ClockOffsetTooLarge", "node03")  # alone: no incident yet
    assert conv.round(T0, [clock], [_out(clock)], TOPOLOGY) == []
    down = _at(node("NodeDown", "node03", severity="critical"), T0 + 30_000)
    sent = conv.round(T0 + 30_000, [clock, down], [_out(down)], TOPOLOGY)
    names = sorted(a.labels["alertname"] for a in sent)
    assert names == ["ClockOffsetTooLarge", "NodeDown", ROOT_CAUSE_ALERT]
    assert {a.labels["incident"] for a in sent} == {"node03"}


@pytest.mark.parametrize(
    ("later", "expect"),
    [
        ("still firing", ["ClockOffsetTooLarge"]),  # the hold is over: sent as it is
        ("resolved", []),  # resolved while held: Alertmanager never heard of it
    ],
)
def test_a_held_alert_that_joins_nothing(later: str, expect: list[str]) -> None:
    conv = Converger(hold_ms=MIN)
    clock = node("ClockOffsetTooLarge", "node03")
    assert conv.round(T0, [clock], [_out(clock)], TOPOLOGY) == []
    assert conv.round(T0 + 30_000, [clock], [], TOPOLOGY) == []
    firing = [clock] if later == "still firing" else []
    sent = conv.round(T0 + MIN, firing, [], TOPOLOGY)
    assert [a.labels["alertname"] for a in sent] == expect
    assert all("incident" not in a.labels for a in sent)
    assert conv.round(T0 + 2 * MIN, firing, [], TOPOLOGY) == []  # sent once


def test_without_a_hold_a_lone_alert_is_sent_at_once() -> None:
    clock = node("ClockOffsetTooLarge", "node03")
    sent = Converger().round(T0, [clock], [_out(clock)], TOPOLOGY)
    assert [a.labels["alertname"] for a in sent] == ["ClockOffsetTooLarge"]
