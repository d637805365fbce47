"""The gateway's rules API: the evaluator runs in the app, writes recorded series and ALERTS
into the vault, and /api/v1/rules, /api/v1/alerts and /-/reload answer as Prometheus's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

RULES = """\
groups:
  - name: gpu
    interval: 1s
    rules:
      - record: gpu:temp:max
        expr: max by (Hostname) (gpu_temp)
      - alert: GpuHot
        expr: gpu_temp > 80
        labels: {severity: page}
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }}C"}
"""


def _wait(predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the state waited for never came")


@pytest.fixture
def rules_gateway(make_client: Any, tmp_path: Path) -> tuple[Any, Any, Path]:
    path = tmp_path / "gpu.yml"
    path.write_text(RULES)
    now = int(time.time() * 1000)
    client, vault = make_client(rules_files=(str(path),))
    vault.write(
        [("gpu_temp", {"Hostname": "node07", "gpu": str(g)}, now - 30_000 + i * 5000, 70.0 + 15 * g)
         for g in range(2) for i in range(12)]
    )  # fmt: skip
    return client, vault, path


def _firing(client: Any) -> list[dict[str, Any]]:
    alerts = client.get("/api/v1/alerts").json()["data"]["alerts"]
    return [a for a in alerts if a["state"] == "firing"]


def test_rules_and_alerts_answer_as_prometheus(rules_gateway: tuple[Any, Any, Path]):
    client, _, path = rules_gateway
    (alert,) = _wait(lambda: _firing(client))
    assert alert["labels"] == {"Hostname": "node07", "alertname": "GpuHot", "gpu": "1",
                               "severity": "page"}  # fmt: skip
    assert alert["annotations"] == {"summary": "GPU 1 at 85C"}
    assert alert["value"] == "8.5e+01" and alert["activeAt"].endswith("Z")
    (group,) = client.get("/api/v1/rules").json()["data"]["groups"]
    assert (group["name"], group["file"], group["interval"], group["limit"]) == (
        "gpu", str(path), 1, 0,
    )  # fmt: skip
    record, alerting = group["rules"]
    assert set(record) == {"name", "query", "health", "evaluationTime", "lastEvaluation", "type"}
    assert (record["type"], record["health"], record["query"]) == (
        "recording", "ok", "max by (Hostname) (gpu_temp)",
    )  # fmt: skip
    assert set(alerting) == {
        "state", "name", "query", "duration", "keepFiringFor", "labels", "annotations",
        "alerts", "health", "evaluationTime", "lastEvaluation", "type",
    }  # fmt: skip
    assert alerting["state"] == "firing" and alerting["type"] == "alerting"
    only = client.get("/api/v1/rules?type=record").json()["data"]["groups"][0]["rules"]
    assert [r["name"] for r in only] == ["gpu:temp:max"]


def test_recorded_series_and_alerts_are_written_into_the_vault(
    rules_gateway: tuple[Any, Any, Path],
):
    client, _, _ = rules_gateway

    def query(expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = client.get("/api/v1/query", params={"query": expr}).json()[
            "data"
        ]["result"]
        return result

    (recorded,) = _wait(lambda: query("gpu:temp:max"))
    assert recorded["metric"] == {"__name__": "gpu:temp:max", "Hostname": "node07"}
    assert recorded["value"][1] == "85"
    (alerts,) = _wait(lambda: query('ALERTS{alertstate="firing"}'))
    assert alerts["metric"]["alertname"] == "GpuHot"
    _wait(lambda: query("ALERTS_FOR_STATE"))
    metrics = client.get("/metrics").text
    assert 'metricvault_rule_evaluation_failures_total{rule_group="' in metrics
    assert "metricvault_rule_evaluator_leader 1.0" in metrics


def test_a_reload_with_an_invalid_file_is_refused_and_keeps_the_rules(
    rules_gateway: tuple[Any, Any, Path],
):
    client, _, path = rules_gateway
    _wait(lambda: client.get("/api/v1/rules").json()["data"]["groups"])
    path.write_text(RULES.replace("expr: gpu_temp > 80", "expr: gpu_temp >"))
    answer = client.post("/-/reload")
    assert answer.status_code == 500
    assert answer.text.startswith("failed to reload config: ")
    assert 'group "gpu", rule 2, "GpuHot": could not parse expression' in answer.text
    path.write_text(RULES.replace("severity: page", "severity: ticket"))
    assert client.post("/-/reload").status_code == 200

    def reloaded() -> bool:
        groups = client.get("/api/v1/rules").json()["data"]["groups"]
        return bool(groups) and groups[0]["rules"][1]["labels"] == {"severity": "ticket"}

    _wait(reloaded)


def test_a_bad_type_is_refused(rules_gateway: tuple[Any, Any, Path]):
    client, _, _ = rules_gateway
    answer = client.get("/api/v1/rules?type=nope")
    assert answer.status_code == 400 and answer.json()["errorType"] == "bad_data"


def test_rules_of_a_tenant_read_and_write_that_tenant_only(make_client: Any, tmp_path: Path):
    path = tmp_path / "gpu.yml"
    path.write_text(RULES)
    now = int(time.time() * 1000)
    client, vault = make_client(rules_files=(str(path),), rules_tenant="team-a")
    vault.write(
        [("gpu_temp", {"Hostname": host, "tenant": tenant}, now - 30_000 + i * 5000, temp)
         for host, tenant, temp in (("node07", "team-a", 85.0), ("node08", "team-b", 95.0))
         for i in range(12)]
    )  # fmt: skip
    (alert,) = _wait(lambda: _firing(client))
    assert alert["labels"]["Hostname"] == "node07" and alert["labels"]["tenant"] == "team-a"

    def recorded() -> list[dict[str, Any]]:
        answer = client.get("/api/v1/query", params={"query": "gpu:temp:max"}).json()
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    (series,) = _wait(recorded)
    assert series["metric"] == {"__name__": "gpu:temp:max", "Hostname": "node07",
                                "tenant": "team-a"}  # fmt: skip
