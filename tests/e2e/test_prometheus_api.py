"""The gateway's Prometheus HTTP API against Debian's real Prometheus (issue 13).

The PromQL oracle's samples (tests/e2e/test_promql_oracle.py) sit in Prometheus and in a vault;
a real ``metricvault serve`` over that vault answers the same HTTP requests. Queries go to our
gateway the way Grafana's Prometheus data source sends them (form-encoded POST, times as Unix
seconds with fractions or RFC 3339), to Prometheus as GETs; the JSON answers must agree as
the compliance tester compares them (values within 1e-5), and the metadata endpoints
(series, labels, label values) must list the same label sets.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from .conftest import GatewayProcess
from .test_promql_oracle import (
    NOT_IN_VAULT,
    Oracle,
    _agree,
    _cases,
    _prometheus,
    normal_reply,
    oracle,  # noqa: F401  (the module's fixture)
)

IN_VAULT = '{__name__=~".+", __name__!~"' + "|".join(NOT_IN_VAULT) + '"}'


def post_form(url: str, path: str, params: list[tuple[str, str]]) -> tuple[int, dict[str, Any]]:
    body = urllib.parse.urlencode(params).encode()
    request = urllib.request.Request(
        f"{url}{path}",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get_json(url: str, path: str, params: list[tuple[str, str]]) -> tuple[int, dict[str, Any]]:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}{path}?{query}", timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def served(oracle: Oracle, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    from .conftest import GATEWAY_DEFAULT_SETTINGS, free_port

    vault_dir = oracle.vault.source.uri  # type: ignore[attr-defined]
    logs = tmp_path_factory.mktemp("prom_api")
    gw = GatewayProcess(
        data_dir=Path(vault_dir),
        port=free_port(),
        log_path=logs / "gateway.log",
        settings=GATEWAY_DEFAULT_SETTINGS,
    )
    gw.start()
    yield gw
    gw.stop_gracefully()


def test_query_api_answers_as_prometheus_does(oracle: Oracle, served: Any) -> None:  # noqa: F811
    disagreements, compared = [], 0
    for expr, path, params, args in _cases(oracle.t0)[::3]:  # every third: the engine is
        if any(name in expr for name in NOT_IN_VAULT):  # compared in full by the oracle
            continue
        expected = _prometheus(oracle.url, path, params)
        status, reply = post_form(served.url, f"/api/v1/{path}", list(params.items()))
        got = normal_reply(reply)
        compared += 1
        want_status = 200 if expected[0] != "error" else {"bad_data": 400}.get(expected[1][0], 422)
        if status != want_status or not _agree(expected, got, path == "query" and
                                                 expr.startswith("sort")):  # fmt: skip
            disagreements.append(f"{path} {expr!r} {args}: {status}\n  prometheus {expected}"
                                 f"\n  gateway    {str(got)[:400]}")  # fmt: skip
    assert compared >= 150
    assert not disagreements, f"{len(disagreements)} of {compared}:\n" + "\n".join(
        disagreements[:20]
    )


def test_a_dashboard_refresh_answered_partly_from_the_result_cache_agrees(
    oracle: Oracle,  # noqa: F811
    served: Any,
) -> None:
    """A range query, then the same query over the range moved two steps forward (a Grafana
    refresh): the second answer joins cached steps and newly evaluated ones, and must be
    Prometheus's answer for the moved range."""
    disagreements, compared = [], 0
    ranges = [case for case in _cases(oracle.t0) if case[1] == "query_range"]
    for expr, path, params, (start, stop, step) in ranges[1::5]:
        if any(name in expr for name in NOT_IN_VAULT):
            continue
        post_form(served.url, "/api/v1/query_range", list(params.items()))  # fills the cache
        moved = {**params, "start": f"{(start + 2 * step) / 1000:.3f}",
                 "end": f"{(stop + 2 * step) / 1000:.3f}"}  # fmt: skip
        expected = _prometheus(oracle.url, path, moved)
        status, reply = post_form(served.url, "/api/v1/query_range", list(moved.items()))
        got = normal_reply(reply)
        compared += 1
        want_status = 200 if expected[0] != "error" else {"bad_data": 400}.get(expected[1][0], 422)
        if status != want_status or not _agree(expected, got, False):
            disagreements.append(f"{expr!r} {moved}: {status}\n  prometheus {expected}"
                                 f"\n  gateway    {str(got)[:400]}")  # fmt: skip
    assert compared >= 60
    assert not disagreements, f"{len(disagreements)} of {compared}:\n" + "\n".join(
        disagreements[:20]
    )


def test_rfc3339_times_and_get_requests(oracle: Oracle, served: Any) -> None:  # noqa: F811
    end = oracle.t0 + 30 * 60_000
    rfc = datetime.fromtimestamp(end / 1000, UTC).isoformat().replace("+00:00", "Z")
    for params in (
        [("query", "sum by (zone) (node_temp_celsius)"), ("time", rfc)],
        [("query", "rate(http_requests_total[5m])"), ("time", f"{end / 1000:.3f}")],
    ):
        status, reply = get_json(served.url, "/api/v1/query", params)
        assert status == 200, reply
        expected = _prometheus(oracle.url, "query", dict(params))
        assert _agree(expected, normal_reply(reply), False), (expected, reply)


@pytest.mark.parametrize(
    ("path", "params", "kind"),
    [
        ("/api/v1/query", [("query", "sum(")], "bad_data"),
        ("/api/v1/query", [("query", "up"), ("time", "yesterday")], "bad_data"),
        (
            "/api/v1/query_range",
            [("query", "up"), ("start", "10"), ("end", "5"), ("step", "1")],
            "bad_data",
        ),
        (
            "/api/v1/query_range",
            [("query", "up"), ("start", "0"), ("end", "100000"), ("step", "1")],
            "bad_data",
        ),
        (
            "/api/v1/query_range",
            [("query", "up"), ("start", "0"), ("end", "10"), ("step", "0")],
            "bad_data",
        ),
        (
            "/api/v1/query_range",
            [("query", "up"), ("start", "0"), ("end", "10"), ("step", "soon")],
            "bad_data",
        ),
        ("/api/v1/series", [], "bad_data"),
        ("/api/v1/series", [("match[]", "{")], "bad_data"),
    ],
)
def test_errors_have_prometheus_shape_type_and_status(
    oracle: Oracle,  # noqa: F811
    served: Any,
    path: str,
    params: list[tuple[str, str]],
    kind: str,
) -> None:
    theirs_status, theirs = get_json(oracle.url, path, params)
    ours_status, ours = post_form(served.url, path, params)
    assert theirs["status"] == ours["status"] == "error"
    assert (theirs["errorType"], theirs_status) == (ours["errorType"], ours_status) == (kind, 400)
    if "parse error" not in theirs["error"]:  # parse errors are the parser package's words
        assert ours["error"] == theirs["error"]


def test_series_labels_and_values_list_what_prometheus_lists(
    oracle: Oracle,  # noqa: F811
    served: Any,
) -> None:
    for path, params in (
        (
            "/api/v1/series",
            [("match[]", "node_temp_celsius"), ("match[]", 'gpu_util_ratio{gpu="1"}')],
        ),
        ("/api/v1/labels", [("match[]", IN_VAULT)]),
        ("/api/v1/label/__name__/values", [("match[]", IN_VAULT)]),
        ("/api/v1/label/instance/values", [("match[]", IN_VAULT)]),
    ):
        _, theirs = get_json(oracle.url, path, params)
        status, ours = (
            post_form(served.url, path, params)
            if "label/" not in path
            else get_json(served.url, path, params)
        )
        assert status == 200 and ours["status"] == "success", ours
        key = json.dumps  # label sets: compare as sorted JSON
        assert sorted(map(key, ours["data"])) == sorted(map(key, theirs["data"])), path
    _, meta = get_json(served.url, "/api/v1/metadata", [])
    assert meta["data"]["http_requests_total"][0]["type"] == "counter", meta
    _, info = get_json(served.url, "/api/v1/status/buildinfo", [])
    assert info["data"]["version"].startswith("2.")
    _, ex = post_form(served.url, "/api/v1/query_exemplars", [("query", "up")])
    assert ex == {"status": "success", "data": []}


@pytest.fixture(scope="module")
def reader(served: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second, empty Debian Prometheus whose only data is the gateway's, via remote_read."""
    import shutil
    import subprocess

    from .conftest import free_port, stop_process, wait_http_ok

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing: apt-get install -y prometheus")
    directory = tmp_path_factory.mktemp("prom_reader")
    config = directory / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"evaluation_interval": "1m"},
                # read_recent: also for the time its own (empty) storage covers
                "remote_read": [{"url": f"{served.url}/api/v1/read", "read_recent": True}],
            }
        )
    )
    port = free_port()
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/-/ready", proc, log_path, "prometheus (remote_read)")
    yield url
    stop_process(proc, timeout=20)


def test_prometheus_reads_the_vault_through_remote_read(
    oracle: Oracle,  # noqa: F811
    reader: str,
) -> None:
    """An unmodified Prometheus with remote_read answers as the one holding the samples."""
    disagreements, compared, answered = [], 0, 0
    for expr, path, params, args in _cases(oracle.t0)[1::4]:
        if any(name in expr for name in NOT_IN_VAULT):
            continue
        expected = _prometheus(oracle.url, path, params)
        got = _prometheus(reader, path, params)
        compared += 1
        answered += expected[0] != "error" and bool(expected[1])
        if not _agree(expected, got, path == "query" and expr.startswith("sort")):
            disagreements.append(f"{path} {expr!r} {args}\n  local  {str(expected)[:300]}"
                                 f"\n  remote {str(got)[:300]}")  # fmt: skip
    assert compared >= 100 and answered >= 0.6 * compared, (compared, answered)
    assert not disagreements, f"{len(disagreements)} of {compared}:\n" + "\n".join(
        disagreements[:20]
    )


def test_remote_read_refuses_a_body_that_is_not_a_read_request(served: Any) -> None:
    request = urllib.request.Request(f"{served.url}/api/v1/read", data=b"not snappy", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400 and b"snappy" in info.value.read()


# ------------------------------------------------------------------ start/end of the metadata
DAY_MS = 86_400_000
HOST_DAYS = {  # host -> (first day, last day) before today, its extra label
    "old": (-12, -10, {"rack": "r1"}),
    "new": (-5, -3, {"zone": "z1"}),
    "always": (-12, -3, {}),
}


def _host_samples() -> list[tuple[str, dict[str, str], int, float]]:
    """Every 30 minutes on each whole UTC day of a host's span: day-aligned data, so block
    bounds (Prometheus) and days (the series index) draw the same line."""
    today = int(time.time() * 1000) // DAY_MS * DAY_MS
    out = []
    for host, (first, last, extra) in HOST_DAYS.items():
        start, stop = today + first * DAY_MS, today + (last + 1) * DAY_MS
        for ts in range(start, stop, 30 * 60_000):
            out.append(("node_up", {"host": host, **extra}, ts, 1.0))
    return out


def _openmetrics(samples: list[tuple[str, dict[str, str], int, float]]) -> str:
    lines = ["# TYPE node_up gauge"]
    for metric, labels, ts, value in samples:
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines.append(f"{metric}{{{body}}} {value} {ts / 1000:.3f}")
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def hosts_in_both(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same day-aligned samples in a backfilled Debian Prometheus (2 h blocks, never
    compacted) and in a vault flushed a day at a time, served by ``metricvault serve``."""
    import shutil
    import subprocess

    from metricvault.store.vault import Vault

    from .conftest import GATEWAY_DEFAULT_SETTINGS, free_port, stop_process, wait_http_ok

    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.skip("prometheus/promtool are missing: apt-get install -y prometheus")
    directory = tmp_path_factory.mktemp("hosts")
    samples = _host_samples()
    (directory / "hosts.om").write_text(_openmetrics(samples))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "hosts.om", "data"],
        cwd=directory, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (directory / "prometheus.yml").write_text("{}")
    port = free_port()
    log_path = directory / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "--config.file=prometheus.yml", "--storage.tsdb.path=data",
             "--storage.tsdb.retention.time=3650d", "--storage.tsdb.max-block-duration=2h",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    gw = None
    try:
        wait_http_ok(f"{url}/-/ready", proc, log_path, "prometheus (backfilled)")
        with Vault.open_local(str(directory / "vault")) as vault:
            for day in sorted({ts // DAY_MS for _, _, ts, _ in samples}):
                vault.write([s for s in samples if s[2] // DAY_MS == day])
                vault.flush()
        gw = GatewayProcess(
            data_dir=directory / "vault",
            port=free_port(),
            log_path=directory / "gateway.log",
            settings=GATEWAY_DEFAULT_SETTINGS,
        )
        gw.start()
        yield url, gw.url
    finally:
        if gw is not None:
            gw.stop_gracefully()
        stop_process(proc, timeout=20)


def _day_range(first: int, last: int) -> list[tuple[str, str]]:
    """From 03:00 on day ``first`` to 21:00 on day ``last`` (days before today)."""
    today = int(time.time()) // 86_400 * 86_400
    start, end = today + first * 86_400 + 3 * 3600, today + last * 86_400 + 21 * 3600
    return [("start", str(start)), ("end", f"{end}.5")]


@pytest.mark.parametrize(
    "span",
    [(-12, -12), (-11, -6), (-9, -6), (-7, -5), (-3, -1), (-2, 0), (-30, -20), (-12, -3)],
)
def test_metadata_endpoints_list_what_prometheus_lists_between_start_and_end(
    hosts_in_both: tuple[str, str], span: tuple[int, int]
) -> None:
    theirs_url, ours_url = hosts_in_both
    when = _day_range(*span)
    for path, params in (
        ("/api/v1/series", [("match[]", "node_up"), *when]),
        ("/api/v1/labels", when),
        ("/api/v1/labels", [("match[]", "node_up"), *when]),
        ("/api/v1/label/host/values", when),
        ("/api/v1/label/rack/values", [("match[]", '{host=~".+"}'), *when]),
    ):
        status, theirs = get_json(theirs_url, path, params)
        assert status == 200, theirs
        status, ours = get_json(ours_url, path, params)
        assert status == 200 and "warnings" not in ours, ours
        key = json.dumps
        assert sorted(map(key, ours["data"])) == sorted(map(key, theirs["data"])), (path, span)


def test_unknown_api_paths_answer_json_404s_as_json_clients_expect(
    hosts_in_both: tuple[str, str],
) -> None:
    _, ours_url = hosts_in_both
    for method, path in (("GET", "/api/v1/targets/metadata/x"), ("POST", "/api/v1/nothing")):
        data = b"" if method == "POST" else None
        request = urllib.request.Request(f"{ours_url}{path}", data=data, method=method)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 404
        assert info.value.headers["Content-Type"].startswith("application/json")
        body = json.loads(info.value.read())
        assert body["status"] == "error" and body["errorType"] == "not_found", body
