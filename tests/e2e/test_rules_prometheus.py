"""Rules as Debian's Prometheus 2.42 evaluates them, checked against the real thing.

- ``promtool check rules`` and ``metricvault rules check`` give the same report and status on
  the same files, valid and invalid;
- ``promtool test rules`` and ``metricvault rules test`` agree on the same unit-test files: both
  pass, and a mutated expectation fails both with the same report; every alert template of
  tests/unit/rule_template_cases.py renders as promtool renders it;
- a real Prometheus scraping a GPU exporter remote-writes to ``metricvault serve``, both load
  the same rule file: ``/api/v1/rules`` and ``/api/v1/alerts`` carry the same fields, rules,
  states, labels, annotations and values, and our recorded samples sit at the same offset in
  their interval as Prometheus's (the group's hash);
- with ``gateway_workers=2`` exactly one worker evaluates: every round once.
"""

from __future__ import annotations

import http.server
import itertools
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metricvault.rules.group import group_offset_ms
from tests.unit.rule_template_cases import LABELS, TEMPLATE_CASES
from tests.unit.test_rules_files import REFUSED, VALID
from tests.unit.test_rules_unittest import RULES as UNIT_RULES
from tests.unit.test_rules_unittest import TESTS as UNIT_TESTS

from .conftest import free_port, http_get, parse_exposition, stop_process, wait_http_ok

TOOL_TIMEOUT_S = 120
WAIT_S = 60


def _promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is missing: apt-get install -y prometheus")
    return binary


def _run(cmd: list[str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def _both(tool: str, files: list[str], cwd: Path) -> tuple[tuple[int, str, str], ...]:
    ours = [sys.executable, "-m", "metricvault.cli", "rules", tool, *files]
    return _run([_promtool(), tool, "rules", *files], cwd), _run(ours, cwd)


# --------------------------------------------------------------------------- promtool


def test_check_rules_reports_as_promtool(tmp_path: Path):
    names = ["valid.yml"]
    (tmp_path / "valid.yml").write_text(VALID)
    for i, (text, _) in enumerate(REFUSED):
        (tmp_path / f"bad{i}.yml").write_text(text)
        names.append(f"bad{i}.yml")
    for name in names:
        theirs, ours = _both("check", [name], tmp_path)
        assert ours == theirs, name
    theirs, ours = _both("check", names, tmp_path)
    assert ours == theirs


def _template_files(directory: Path, mutate: int | None = None) -> str:
    rules: dict[str, Any] = {"groups": [{"name": "templates", "rules": []}]}
    tests, series = [], []
    for i, (template, value, expected) in enumerate(TEMPLATE_CASES):
        rules["groups"][0]["rules"].append(
            {"alert": f"T{i}", "expr": f'max by (instance, job) (case_value{{case="{i}"}})',
             "annotations": {"out": template}}
        )  # fmt: skip
        want = expected + ("!" if i == mutate else "")
        expected_alert = {"exp_labels": LABELS, "exp_annotations": {"out": want}}
        tests.append({"eval_time": "1m", "alertname": f"T{i}", "exp_alerts": [expected_alert]})
        labels = ", ".join(f'{k}="{v}"' for k, v in {**LABELS, "case": str(i)}.items())
        series.append({"series": f"case_value{{{labels}}}", "values": f"{value!r} {value!r}"})
    (directory / "templates.yml").write_text(yaml.safe_dump(rules))
    name = "templates_test.yml" if mutate is None else "templates_mutated_test.yml"
    unit = {"rule_files": ["templates.yml"], "tests": [
        {"interval": "1m", "input_series": series, "alert_rule_test": tests}]}  # fmt: skip
    (directory / name).write_text(yaml.safe_dump(unit))
    return name


def test_rule_unit_tests_pass_and_fail_alike(tmp_path: Path):
    (tmp_path / "rules.yml").write_text(UNIT_RULES)
    (tmp_path / "ok_test.yml").write_text(UNIT_TESTS)
    mutated = UNIT_TESTS.replace("i1 down (0)", "i1 down (1)").replace("value: 1", "value: 3")
    (tmp_path / "mutated_test.yml").write_text(mutated)
    templates = _template_files(tmp_path)
    templates_mutated = _template_files(tmp_path, mutate=5)
    for name, status in [("ok_test.yml", 0), ("mutated_test.yml", 1), (templates, 0),
                         (templates_mutated, 1)]:  # fmt: skip
        theirs, ours = _both("test", [name], tmp_path)
        assert theirs[0] == status, (name, theirs)
        assert ours == theirs, name


# --------------------------------------------------------------------------- the APIs

GPU_RULES = """\
groups:
  - name: gpu
    interval: 5s
    rules:
      - record: node:gpu_temp:max
        expr: max by (Hostname) (gpu_temp)
      - alert: GpuHot
        expr: gpu_temp > 80
        labels:
          severity: page
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }}C"
          share: "{{ $value | humanizePercentage }}"
      - alert: GpuWarm
        expr: gpu_temp > 60
        for: 1h
        labels:
          severity: ticket
      - alert: Never
        expr: gpu_temp > 1000
"""


class _Exporter(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[str]:
    """A scrape target with two GPUs of node07: one hot (85), one warm (70)."""
    _Exporter.body = (
        b"# TYPE gpu_temp gauge\n"
        b'gpu_temp{Hostname="node07",gpu="0"} 70\n'
        b'gpu_temp{Hostname="node07",gpu="1"} 85\n'
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _start_prometheus(directory: Path, rule_file: Path, target: str, write_url: str) -> Any:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install -y prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [{"job_name": "gpu", "static_configs": [{"targets": [target]}]}],
        "remote_write": [{"url": write_url, "queue_config": {"batch_send_deadline": "1s"}}],
    }
    config_path = directory / "prometheus.yml"
    config_path.write_text(json.dumps(config))
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={directory / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    wait_http_ok(f"http://127.0.0.1:{port}/-/ready", proc, log_path, "prometheus")
    return proc, f"http://127.0.0.1:{port}"


def _api(url: str, path: str, **params: str) -> Any:
    status, body = http_get(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=30)
    assert status == 200, body[:500]
    return json.loads(body)["data"]


def _wait(what: str, predicate: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}")


def _firing_names(url: str) -> set[str]:
    return {a["labels"]["alertname"] for a in _api(url, "alerts")["alerts"]
            if a["state"] == "firing"}  # fmt: skip


def _comparable(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answer without what differs by nature (times, durations)."""
    out = []
    for g in groups:
        rules = []
        for r in g["rules"]:
            rule = {k: v for k, v in r.items() if k not in ("evaluationTime", "lastEvaluation")}
            if "alerts" in rule:
                rule["alerts"] = sorted(
                    ({k: v for k, v in a.items() if k != "activeAt"} for a in rule["alerts"]),
                    key=lambda a: sorted(a["labels"].items()),
                )
            rules.append(rule)
        out.append({**{k: v for k, v in g.items() if k not in ("evaluationTime",
                                                             "lastEvaluation")},
                    "rules": rules})  # fmt: skip
    return out


def test_rules_and_alerts_apis_answer_as_prometheus(tmp_path: Path, gateway: Any, exporter: str):
    rule_file = tmp_path / "gpu.yml"
    rule_file.write_text(GPU_RULES)
    gw = gateway(settings=(f"rules_files={rule_file}", "gateway_workers=1"))
    proc, prom = _start_prometheus(tmp_path, rule_file, exporter, f"{gw.url}/api/v1/write")
    try:
        _wait("GpuHot firing in Prometheus", lambda: "GpuHot" in _firing_names(prom))
        _wait("GpuHot firing in metricvault", lambda: "GpuHot" in _firing_names(gw.url))
        theirs = _api(prom, "rules")["groups"]
        ours = _api(gw.url, "rules")["groups"]
        assert _comparable(ours) == _comparable(theirs)
        for key in ("evaluationTime", "lastEvaluation"):
            assert key in ours[0] and key in ours[0]["rules"][0]
        their_alerts = sorted(
            _api(prom, "alerts")["alerts"], key=lambda a: sorted(a["labels"].items())
        )
        our_alerts = sorted(
            _api(gw.url, "alerts")["alerts"], key=lambda a: sorted(a["labels"].items())
        )
        assert [set(a) for a in our_alerts] == [set(a) for a in their_alerts]
        strip = [{k: v for k, v in a.items() if k != "activeAt"} for a in their_alerts]
        assert [{k: v for k, v in a.items() if k != "activeAt"} for a in our_alerts] == strip
        # the recorded samples' times: Prometheus's group offset, which ours reproduces
        interval = 5000
        offset = group_offset_ms("gpu", str(rule_file), interval)
        for url in (prom, gw.url):
            data = _api(url, "query", query="node:gpu_temp:max[30s]")
            stamps = [round(float(t) * 1000) for t, _ in data["result"][0]["values"]]
            assert stamps, url
            assert {t % interval for t in stamps} == {int(offset)}, (url, stamps, offset)
    finally:
        stop_process(proc, timeout=20)


def test_one_evaluator_with_two_gateway_workers(tmp_path: Path, gateway: Any):
    rule_file = tmp_path / "once.yml"
    rule_file.write_text(
        "groups:\n  - name: once\n    interval: 1s\n    rules:\n"
        "      - record: rounds\n        expr: vector(1)\n"
    )
    gw = gateway(settings=(f"rules_files={rule_file}", "gateway_workers=2"))

    def rounds() -> list[int]:
        data = _api(gw.url, "query", query="rounds[20s]")
        if not data["result"]:
            return []
        return [round(float(t) * 1000) for t, _ in data["result"][0]["values"]]

    stamps = _wait("ten rounds", lambda: (r := rounds()) and len(r) >= 10 and r)
    assert len(stamps) == len(set(stamps))  # no round evaluated twice
    # on the group's grid; a round still running when the next is due misses it, as
    # Prometheus's do (a loaded machine), so a gap may be two intervals
    assert all(b - a > 0 and (b - a) % 1000 == 0 for a, b in itertools.pairwise(stamps))
    leaders = 0.0
    for _ in range(20):  # the workers answer /metrics in turn: the sum is the same whoever does
        _, body = http_get(f"{gw.url}/metrics")
        values = parse_exposition(body.decode())
        leaders = values.get("metricvault_rule_evaluator_leader", 0.0)
        if leaders:
            break
        time.sleep(0.25)
    assert leaders == 1.0


def test_for_state_survives_kill_9(tmp_path: Path, gateway: Any):
    """A pending alert's activeAt is restored from ALERTS_FOR_STATE after the gateway is
    killed: it keeps the time it had pended instead of starting its `for` anew."""
    rule_file = tmp_path / "pending.yml"
    rule_file.write_text(
        "groups:\n  - name: slow\n    interval: 1s\n    rules:\n"
        "      - alert: SlowBurn\n        expr: vector(1) > 0\n        for: 20m\n"
    )
    gw = gateway(settings=(f"rules_files={rule_file}", "gateway_workers=1"))

    def active_at() -> float | None:
        alerts = _api(gw.url, "alerts")["alerts"]
        if not alerts:
            return None
        stamp = alerts[0]["activeAt"].rstrip("Z")
        return time.mktime(time.strptime(stamp.split(".")[0], "%Y-%m-%dT%H:%M:%S")) - time.timezone

    first = _wait("the alert pending", active_at)
    _wait(
        "ALERTS_FOR_STATE in the vault",
        lambda: _api(gw.url, "query", query="ALERTS_FOR_STATE")["result"],
    )
    time.sleep(15)  # pending a while: a fresh start would be visibly later
    gw.kill()
    gw.start()
    ready = time.time()  # a fresh alert would be active from about now on
    restored = _wait(
        "the restored activeAt",
        lambda: (t := active_at()) is not None and t < ready - 5 and t,
    )
    # activeAt moved on by the outage (the downtime does not count as pending), no further
    assert first <= restored < ready - 5


def test_sighup_reloads_the_rules_with_two_workers(tmp_path: Path, gateway: Any):
    rule_file = tmp_path / "hup.yml"
    text = "groups:\n  - name: hup\n    interval: 1s\n    rules:\n      - alert: A\n" \
           "        expr: vector(1)\n        for: 1m\n"  # fmt: skip
    rule_file.write_text(text)
    gw = gateway(settings=(f"rules_files={rule_file}", "gateway_workers=2"))

    def duration() -> Any:
        groups = _api(gw.url, "rules")["groups"]
        return groups and groups[0]["rules"][0]["duration"]

    assert _wait("the rules loaded", duration) == 60
    rule_file.write_text(text.replace("for: 1m", "for: 5m"))
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGHUP)
    _wait("the reloaded rules", lambda: duration() == 300)
