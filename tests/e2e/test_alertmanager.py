"""Alerts through a real Alertmanager (Debian's 0.25) on loopback, to a webhook receiver of the
test's own: delivery, inhibition by the shipped configuration's rules, and alerts queued while
Alertmanager is down arriving once it is up."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from metricvault.rules.alertmanager import Alert, Notifier
from tests.e2e.conftest import free_port, stop_process, wait_http_ok

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTMANAGER = shutil.which("prometheus-alertmanager")
AMTOOL = shutil.which("amtool")
WAIT_S = 30.0

pytestmark = pytest.mark.skipif(
    ALERTMANAGER is None, reason="Debian's prometheus-alertmanager is installed by make test"
)


class Webhook:
    """The receiver Alertmanager notifies: keeps every notification's JSON body."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with hook.lock:
                    hook.notifications.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.notifications) >= count:
                    return list(self.notifications)
            time.sleep(0.05)
        pytest.fail(f"{what}: {len(self.notifications)} notifications after {WAIT_S:.0f} s")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def config_for_test(webhook_url: str, group_wait: str = "1s") -> dict[str, Any]:
    """The shipped configuration, its timings short and every route to the test's webhook (the
    example PagerDuty/WeCom receivers would reach outside)."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    config["route"].update(group_wait=group_wait, group_interval="2s", repeat_interval="1h")
    config["route"]["routes"] = []
    config["receivers"] = [
        {"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
    ]
    return config


@dataclass
class AlertmanagerProcess:
    proc: subprocess.Popen[bytes]
    url: str

    def alerts(self) -> list[dict[str, Any]]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as resp:
            result: list[dict[str, Any]] = json.loads(resp.read())
            return result


def start_alertmanager(
    tmp_path: Path, webhook_url: str, port: int, group_wait: str = "1s"
) -> AlertmanagerProcess:
    assert ALERTMANAGER is not None
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(config_for_test(webhook_url, group_wait)), encoding="utf-8")
    log_path = tmp_path / "alertmanager.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/-/ready", proc, log_path, "alertmanager")
    except BaseException:
        stop_process(proc)
        raise
    return AlertmanagerProcess(proc, url)


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook: Webhook) -> Iterator[AlertmanagerProcess]:
    am = start_alertmanager(tmp_path, webhook.url, free_port())
    yield am
    stop_process(am.proc)


def _alert(name: str, started_s_ago: float = 60.0, **labels: str) -> Alert:
    now = time.time()
    return Alert(
        {"alertname": name, "cluster": "c1", **labels},
        {"summary": f"{name} on {labels.get('Hostname', '?')}"},
        now - started_s_ago,
        now + 240,
        "http://vault:9201/graph?g0.expr=up&g0.tab=1",
    )


@pytest.mark.skipif(AMTOOL is None, reason="amtool comes with prometheus-alertmanager")
def test_amtool_accepts_the_shipped_configuration() -> None:
    assert AMTOOL is not None
    result = subprocess.run(
        [AMTOOL, "check-config", str(SHIPPED)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_alert_reaches_the_webhook_through_alertmanager(
    alertmanager: AlertmanagerProcess, webhook: Webhook
) -> None:
    with Notifier([alertmanager.url]) as notifier:
        notifier.send([_alert("GpuXidError", Hostname="node01", gpu="0", scope="gpu")])
        assert notifier.drain(WAIT_S)
    [note] = webhook.wait(1, "the XID alert")
    assert note["status"] == "firing"
    [alert] = note["alerts"]
    assert alert["labels"]["alertname"] == "GpuXidError"
    assert alert["annotations"] == {"summary": "GpuXidError on node01"}
    assert alert["generatorURL"] == "http://vault:9201/graph?g0.expr=up&g0.tab=1"
    assert note["groupLabels"] == {"cluster": "c1", "Hostname": "node01"}


def test_a_node_down_mutes_its_gpu_and_agent_alerts_in_one_notification(
    alertmanager: AlertmanagerProcess, webhook: Webhook
) -> None:
    # Alertmanager flushes a new group at once when its first alert started more than
    # group_wait ago, and its inhibitor learns of a source alert on its own goroutine: on a
    # loaded machine that flush can beat the inhibitor to the NodeDown of the same POST. The
    # alerts here start now, so the group waits its group_wait (1 s) as a fresh incident does.
    with Notifier([alertmanager.url]) as notifier:
        notifier.send(
            [
                _alert("NodeDown", 0, Hostname="node07", scope="node", severity="critical"),
                *(
                    _alert("GpuMetricsAbsent", 0, Hostname="node07", gpu=str(g), scope="agent")
                    for g in range(8)
                ),
                _alert("GpuXidError", 0, Hostname="node07", gpu="3", scope="gpu"),
            ]
        )
        assert notifier.drain(WAIT_S)
    [note] = webhook.wait(1, "the node-down notification")
    assert [a["labels"]["alertname"] for a in note["alerts"]] == ["NodeDown"]
    states = {a["labels"]["alertname"]: a["status"]["state"] for a in alertmanager.alerts()}
    assert states == {
        "NodeDown": "active",
        "GpuMetricsAbsent": "suppressed",
        "GpuXidError": "suppressed",
    }
    time.sleep(3)  # two group intervals: the muted alerts never make a second notification
    assert len(webhook.notifications) == 1


def test_alerts_sent_while_alertmanager_is_down_arrive_when_it_starts(
    tmp_path: Path, webhook: Webhook
) -> None:
    port = free_port()
    notifier = Notifier([f"http://127.0.0.1:{port}"])
    am = None
    try:
        notifier.send([_alert("TrainingStalled", job="llama", scope="job", severity="critical")])
        deadline = time.monotonic() + WAIT_S
        while notifier.stats()[f"http://127.0.0.1:{port}"].failed_attempts < 1:
            assert time.monotonic() < deadline, "the first attempt never failed"
            time.sleep(0.02)
        assert notifier.queue_length() == 1
        am = start_alertmanager(tmp_path, webhook.url, port)
        assert notifier.drain(WAIT_S)
        [note] = webhook.wait(1, "the queued alert")
        assert note["alerts"][0]["labels"]["alertname"] == "TrainingStalled"
    finally:
        notifier.close(timeout_s=1)
        if am is not None:
            stop_process(am.proc)
