"""The Alertmanager client: Prometheus's resend rules, the v2 payload, queueing while
Alertmanager is down, the drop policy of a full queue, credentials."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from metricvault.errors import ConfigError
from metricvault.rules.alertmanager import (
    API_PATH,
    Alert,
    AlertmanagerAuth,
    AlertmanagerTarget,
    AlertState,
    Notifier,
    Resender,
    TargetStats,
    _Queue,
    generator_url,
    rfc3339,
    targets_from_urls,
)


@dataclass
class _RuleAlert:
    labels: dict[str, str]
    annotations: dict[str, str]
    state: AlertState
    fired_at: float | None
    resolved_at: float | None = None


class _Receiver:
    """An HTTP endpoint standing in for Alertmanager's API: records each request, answers
    with ``status`` (503 while 'down')."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], list[dict[str, object]]]] = []
        self.status = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    status = receiver.status
                    if status == 200:
                        receiver.requests.append(
                            (self.path, dict(self.headers.items()), json.loads(body))
                        )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, object]]:
        with self.lock:
            return [a for _, _, batch in self.requests for a in batch]

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[dict[str, object]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.alerts()) < count:
            time.sleep(0.01)
        return self.alerts()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _alert(name: str, ends_at: float = 2e9, **labels: str) -> Alert:
    return Alert({"alertname": name, **labels}, {"summary": name}, 1.7e9, ends_at)


# ------------------------------------------------------------------ when Prometheus sends
def test_pending_alerts_are_never_sent() -> None:
    resender = Resender()
    assert resender.due("r", [_RuleAlert({"a": "1"}, {}, "pending", None)], 100.0, 30.0) == []


@pytest.mark.parametrize(
    ("now", "sent"),
    [(100.0, True), (130.0, False), (160.0, False), (160.5, True), (200.0, False)],
)
def test_a_firing_alert_is_resent_every_resend_delay(now: float, sent: bool) -> None:
    """First sent at 100, then only once more than resend_delay (60 s) passed since the last
    send: 160.5, then 220.5..."""
    resender = Resender(resend_delay_s=60.0)
    alert = _RuleAlert({"alertname": "X"}, {}, "firing", 90.0)
    times = [t for t in (100.0, 130.0, 160.0, 160.5, 200.0) if t <= now]
    results = [resender.due("r", [alert], t, 30.0) for t in times]
    assert bool(results[-1]) is sent


def test_a_firing_alert_is_valid_for_four_resend_delays_or_intervals() -> None:
    resender = Resender(resend_delay_s=60.0)
    [short] = resender.due("a", [_RuleAlert({"n": "1"}, {}, "firing", 90.0)], 100.0, 30.0)
    [long] = resender.due("b", [_RuleAlert({"n": "1"}, {}, "firing", 90.0)], 100.0, 120.0)
    assert (short.starts_at, short.ends_at) == (90.0, 100.0 + 240.0)
    assert long.ends_at == 100.0 + 480.0


def test_a_resolved_alert_is_sent_at_once_with_its_end_then_kept_for_the_retention() -> None:
    resender = Resender(resend_delay_s=60.0, resolved_retention_s=900.0)
    firing = _RuleAlert({"alertname": "X"}, {}, "firing", 90.0)
    assert resender.due("r", [firing], 100.0, 30.0)
    resolved = _RuleAlert({"alertname": "X"}, {}, "inactive", 90.0, resolved_at=110.0)
    [sent] = resender.due("r", [resolved], 110.0, 30.0)  # 10 s after the last send: at once
    assert sent.ends_at == 110.0
    assert resender.due("r", [resolved], 150.0, 30.0) == []
    assert resender.due("r", [resolved], 171.0, 30.0)  # resent while retained
    assert resender.due("r", [resolved], 110.0 + 901.0, 30.0) == []  # past the retention


def test_rules_keep_separate_books_and_forget_alerts_gone_from_the_rule() -> None:
    resender = Resender()
    alert = _RuleAlert({"alertname": "X"}, {}, "firing", 1.0)
    assert resender.due("r1", [alert], 100.0, 30.0)
    assert resender.due("r2", [alert], 100.0, 30.0)  # another rule, same labels
    resender.due("r1", [], 101.0, 30.0)
    assert resender.due("r1", [alert], 102.0, 30.0)  # forgotten: sent as new


def test_a_bad_resend_delay_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        Resender(resend_delay_s=0)


# ------------------------------------------------------------------ the payload
def test_the_payload_is_what_prometheus_posts() -> None:
    alert = Alert(
        {"alertname": "GpuXid", "Hostname": "node01"},
        {"summary": "XID 79"},
        1_700_000_000.5,
        1_700_000_240.0,
        generator_url("http://vault:9201/", 'DCGM_FI_DEV_XID_ERRORS{gpu="0"} > 0'),
    )
    assert alert.payload() == {
        "labels": {"alertname": "GpuXid", "Hostname": "node01"},
        "annotations": {"summary": "XID 79"},
        "startsAt": "2023-11-14T22:13:20.500Z",
        "endsAt": "2023-11-14T22:17:20.000Z",
        "generatorURL": "http://vault:9201/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS%7Bgpu%3D%220%22%7D"
        "%20%3E%200&g0.tab=1",
    }
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"


# ------------------------------------------------------------------ delivery
def test_alerts_reach_every_alertmanager_at_the_v2_path(receiver: _Receiver) -> None:
    other = _Receiver()
    try:
        with Notifier([receiver.url, other.url + "/"]) as notifier:
            notifier.send([_alert("A"), _alert("B")])
            assert notifier.drain(10.0)
        for r in (receiver, other):
            assert {a["labels"]["alertname"] for a in r.alerts()} == {"A", "B"}  # type: ignore[index]
            assert {path for path, _, _ in r.requests} == {API_PATH}
    finally:
        other.server.shutdown()
        other.server.server_close()


def test_alerts_stay_queued_while_alertmanager_is_down_and_arrive_when_it_is_back(
    receiver: _Receiver,
) -> None:
    receiver.status = 503
    seen: list[int] = []
    notifier = Notifier(
        [receiver.url], on_change=lambda url, stats: seen.append(stats.queue_length)
    )
    try:
        notifier.send([_alert("A"), _alert("B", node="n1")])
        deadline = time.monotonic() + 10
        while notifier.stats()[receiver.url].failed_attempts < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = notifier.stats()[receiver.url]
        assert stats.failed_attempts >= 2 and stats.queue_length == 2
        assert "HTTP 503" in stats.last_error
        notifier.send([_alert("A", ends_at=1.8e9)])  # a newer state replaces the queued one
        assert notifier.queue_length() == 2
        receiver.status = 200
        assert notifier.drain(30.0)
        got = {a["labels"]["alertname"]: a for a in receiver.alerts()}  # type: ignore[index]
        assert set(got) == {"A", "B"} and len(receiver.alerts()) == 2
        assert got["A"]["endsAt"] == rfc3339(1.8e9)
        assert seen[-1] == 0 and 2 in seen
    finally:
        notifier.close()


def test_an_alertmanager_that_refuses_connections_is_retried(tmp_path: Path) -> None:
    notifier = Notifier(["http://127.0.0.1:9"])  # discard port: nothing listens there
    try:
        notifier.send([_alert("A")])
        deadline = time.monotonic() + 10
        while notifier.stats()["http://127.0.0.1:9"].failed_attempts < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert notifier.queue_length() == 1
    finally:
        notifier.close(timeout_s=0.1)


def test_a_batch_alertmanager_refuses_as_bad_is_dropped_and_counted(receiver: _Receiver) -> None:
    receiver.status = 400
    with Notifier([receiver.url]) as notifier:
        notifier.send([_alert("A")])
        assert notifier.drain(10.0)
        assert notifier.stats()[receiver.url].dropped == {"rejected": 1}


def test_a_full_queue_drops_resolved_alerts_before_firing_ones() -> None:
    stats = TargetStats()
    queue = _Queue(capacity=3)
    queue.put(_alert("F1"), 1000.0, stats)
    queue.put(_alert("R1", ends_at=500.0), 1000.0, stats)
    queue.put(_alert("F2"), 1000.0, stats)
    queue.put(_alert("F3"), 1000.0, stats)  # full: the resolved R1 goes
    assert [dict(a.labels)["alertname"] for a in queue.items.values()] == ["F1", "F2", "F3"]
    queue.put(_alert("F4"), 1000.0, stats)  # only firing left: the oldest goes
    assert [dict(a.labels)["alertname"] for a in queue.items.values()] == ["F2", "F3", "F4"]
    assert stats.dropped == {"queue_full_resolved": 1, "queue_full_firing": 1}


def test_external_labels_are_added_but_the_alerts_own_win(receiver: _Receiver) -> None:
    with Notifier([receiver.url], external_labels={"cluster": "c1", "node": "x"}) as notifier:
        notifier.send([_alert("A", node="n7")])
        assert notifier.drain(10.0)
    [alert] = receiver.alerts()
    assert alert["labels"] == {"alertname": "A", "cluster": "c1", "node": "n7"}


# ------------------------------------------------------------------ credentials, URLs
def test_credentials_from_the_url_a_token_and_a_token_file(
    receiver: _Receiver, tmp_path: Path
) -> None:
    host = receiver.url.removeprefix("http://")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    targets = [
        AlertmanagerTarget.parse(f"http://am:p%40ss@{host}"),
        AlertmanagerTarget.parse(
            receiver.url, auth=AlertmanagerAuth(bearer_token_file=str(token_file))
        ),
    ]
    for target in targets:
        with Notifier([target]) as notifier:
            notifier.send([_alert("A")])
            assert notifier.drain(10.0)
    headers = [h["Authorization"] for _, h, _ in receiver.requests]
    assert headers == ["Basic " + base64.b64encode(b"am:p@ss").decode(), "Bearer s3cret"]
    assert "s3cret" not in repr(targets[1].auth) and "p@ss" not in repr(targets[0])


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://am:9093", "not an http:// or https:// URL"),
        ("http://", "not an http:// or https:// URL"),
        ("http://am:notaport", "alertmanager URL"),
    ],
)
def test_bad_alertmanager_urls_are_refused(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        targets_from_urls([url])


def test_more_than_one_credential_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give exactly one"):
        AlertmanagerAuth(bearer_token="a", basic_auth=("u", "p"))
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        AlertmanagerAuth(bearer_token_file=empty)


def test_duplicate_alertmanager_urls_count_once() -> None:
    urls = ["http://am:9093", "http://am:9093/", "http://am2:9093"]
    assert [t.url for t in targets_from_urls(urls)] == ["http://am:9093", "http://am2:9093"]


def test_the_evaluators_outgoing_alerts_convert_from_milliseconds() -> None:
    from metricvault.rules.group import OutgoingAlert

    outgoing = OutgoingAlert(
        {"alertname": "X"}, {"s": "1"}, 1_700_000_000_500, 1_700_000_240_000, "u"
    )
    assert Alert.from_outgoing(outgoing).payload() == {
        **outgoing.to_alertmanager(),
        "startsAt": "2023-11-14T22:13:20.500Z",
        "endsAt": "2023-11-14T22:17:20.000Z",
    }
