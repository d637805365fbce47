"""``metricvault serve --rules FILE --alertmanager URL``: an alert the evaluator fires inside the
gateway reaches a real Alertmanager (Debian's 0.25) and its webhook, and the delivery counts are
in the gateway's ``/metrics``."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import free_port, parse_exposition, stop_process
from tests.e2e.test_alertmanager import ALERTMANAGER, WAIT_S, Webhook, start_alertmanager

pytestmark = pytest.mark.skipif(
    ALERTMANAGER is None, reason="Debian's prometheus-alertmanager is installed by make test"
)

RULES = """\
groups:
  - name: gpu
    interval: 1s
    rules:
      - alert: GPUHot
        expr: gpu_temp_celsius > 80
        labels:
          severity: critical
        annotations:
          summary: "GPU on {{ $labels.Hostname }} at {{ $value }} C"
"""


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_exposition(resp.read().decode())


def test_an_alert_fired_inside_serve_reaches_alertmanager_and_its_webhook(
    tmp_path: Path, gateway: Any
) -> None:
    webhook = Webhook()
    manager = start_alertmanager(tmp_path, webhook.url, free_port())
    try:
        rules = tmp_path / "gpu.yml"
        rules.write_text(RULES, encoding="utf-8")
        gw = gateway(settings=(f"rules_files={rules}", f"alertmanagers={manager.url}"))
        # serve holds a new alert about a node one resend interval (rules_resend_delay, 1 m)
        # for its incident to form, then Alertmanager waits its group_wait
        deadline = time.monotonic() + WAIT_S + 120
        # samples at the wall clock, written until the notification arrives (a round reads
        # the newest within the 5 m lookback)
        while time.monotonic() < deadline and not webhook.notifications:
            line = f"gpu_temp,Hostname=node07 celsius=93 {int(time.time() * 1000)}\n"
            assert _post(gw.url + "/write?precision=ms", line.encode()) == 204
            time.sleep(0.5)
        notification = webhook.wait(1, "GPUHot from serve")[0]
        alert = notification["alerts"][0]
        assert alert["labels"]["alertname"] == "GPUHot"
        assert alert["labels"]["Hostname"] == "node07"
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"] == "GPU on node07 at 93 C"
        assert alert["status"] == "firing"
        sent = 0.0
        while time.monotonic() < deadline and sent < 1:
            values = _metrics(gw.url)
            sent = sum(
                v for k, v in values.items() if k.startswith("metricvault_alertmanager_alerts_sent")
            )
            time.sleep(0.2)
        assert sent >= 1, "the gateway's /metrics counts no alert sent"
    finally:
        stop_process(manager.proc)
        webhook.close()
