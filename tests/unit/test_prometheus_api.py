"""The gateway's Prometheus query API: tenants, auth, limits, parameter parsing (issue 13).

Answers themselves are compared with a real Prometheus in tests/e2e/test_prometheus_api.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import BearerToken, Settings
from metricvault.credentials import hash_secret
from metricvault.errors import PromQLError
from metricvault.promql.parse import query_depth
from metricvault.server import prometheus_api
from metricvault.server.app import create_app
from metricvault.server.prometheus_api import parse_duration_param, parse_time_param

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Vault]]:
    settings = Settings.load(
        env={},
        gateway_maintain=False,
        auth_bearer_tokens=(
            BearerToken(hash_secret("token-a"), "team-a"),
            BearerToken(hash_secret("token-b"), "team-b"),
        ),
    )
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    with TestClient(create_app(vault, settings)) as test_client:
        for headers, value in ((A, 1.0), (B, 2.0)):
            # line protocol: measurement gpu, field util -> the series gpu_util
            lines = "".join(f"gpu,gpu=0 util={value} {T0 + i * 15_000}\n" for i in range(20))
            reply = test_client.post("/write?precision=ms", content=lines, headers=headers)
            assert reply.status_code == 204, reply.text
        yield test_client, vault
    vault.close()


def _query(client: TestClient, headers: dict[str, str], **params: str) -> Any:
    reply = client.post("/api/v1/query", data=params, headers={**headers, **FORM})
    return reply.status_code, reply.json()


def test_a_tenant_sees_only_its_own_series(client: tuple[TestClient, Vault]) -> None:
    test_client, _ = client
    at = f"{(T0 + 200_000) / 1000}"
    status, body = _query(test_client, A, query='{__name__=~".+"}', time=at)
    assert status == 200, body
    assert [r["metric"]["tenant"] for r in body["data"]["result"]] == ["team-a"]
    assert body["data"]["result"][0]["value"][1] == "1"
    # a selector naming the other tenant finds nothing: the caller's tenant matcher is ANDed
    status, body = _query(test_client, A, query='gpu_util{tenant="team-b"}', time=at)
    assert status == 200 and body["data"]["result"] == []
    status, body = _query(test_client, B, query="sum(gpu_util)", time=at)
    assert body["data"]["result"][0]["value"][1] == "2"
    series = test_client.get("/api/v1/series", params={"match[]": "gpu_util"}, headers=B).json()
    assert series["data"] == [{"__name__": "gpu_util", "gpu": "0", "tenant": "team-b"}]
    values = test_client.get("/api/v1/label/tenant/values", headers=A).json()
    assert values["data"] == ["team-a"]


def test_every_query_route_needs_credentials_and_answers_in_prometheus_shape(
    client: tuple[TestClient, Vault],
) -> None:
    test_client, _ = client
    for path in ("/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"):
        reply = test_client.post(path, data={"query": "up"}, headers=FORM)
        assert reply.status_code == 401, (path, reply.text)
        assert reply.json()["status"] == "error" and "WWW-Authenticate" in reply.headers


@pytest.mark.parametrize(
    ("interval_ms", "query", "at_s"),
    [
        (1000, "quantile_over_time(0.5, m_x[1m])", 60),  # 50 raw samples
        (60_000, "count_over_time(m_x[50m])", 3000),  # 50 one-minute buckets (tiers.py)
    ],
)
def test_too_many_samples_is_an_execution_error(
    tmp_path: Path, interval_ms: int, query: str, at_s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """...and the worker hands what the refused query built back to the OS (malloc_trim)."""
    trims: list[int] = []
    monkeypatch.setattr(prometheus_api, "release_freed_memory", lambda: trims.append(1))
    settings = Settings.load(env={}, gateway_maintain=False, query_max_samples=10)
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    with TestClient(create_app(vault, settings)) as test_client:
        lines = "".join(f"m x={i} {T0 + i * interval_ms}\n" for i in range(50))
        assert test_client.post("/write?precision=ms", content=lines).status_code == 204
        reply = test_client.get("/api/v1/query", params={"query": query, "time": T0 / 1000 + at_s})
    vault.close()
    assert reply.status_code == 422, reply.text
    assert reply.json()["errorType"] == "execution"
    assert "too many samples" in reply.json()["error"]
    assert trims == [1]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1767225600", T0),
        ("1767225600.123", T0 + 123),
        ("2026-01-01T00:00:00Z", T0),
        ("2026-01-01T01:00:00.5+01:00", T0 + 500),
    ],
)
def test_times_are_unix_seconds_or_rfc3339(text: str, ms: int) -> None:
    assert parse_time_param(text, 0, "time") == ms


@pytest.mark.parametrize(("text", "ms"), [("15", 15_000), ("0.5", 500), ("1m30s", 90_000)])
def test_durations_are_seconds_or_prometheus_durations(text: str, ms: int) -> None:
    assert parse_duration_param(text, "step") == ms


@pytest.mark.parametrize("text", ["yesterday", "2026-01-01T00:00:00", "1e400x"])
def test_bad_times_are_refused_with_prometheus_words(text: str) -> None:
    with pytest.raises(PromQLError, match=f'cannot parse "{text}" to a valid timestamp') as info:
        parse_time_param(text, 0, "time")
    assert info.value.kind == "bad_data"


def _three_series_client(tmp_path: Path, **settings: Any) -> tuple[TestClient, Vault]:
    config = Settings.load(env={}, gateway_maintain=False, **settings)
    vault = Vault.open_local(str(tmp_path / "v"), config)
    test_client = TestClient(create_app(vault, config))
    test_client.__enter__()
    lines = "".join(f"m,i={i} x={i} {T0 + t * 15_000}\n" for i in range(3) for t in range(4))
    assert test_client.post("/write?precision=ms", content=lines).status_code == 204
    return test_client, vault


def test_query_max_series_refuses_a_query_and_a_match_expansion(tmp_path: Path) -> None:
    test_client, vault = _three_series_client(tmp_path, query_max_series=2)
    at = str(T0 / 1000 + 60)
    try:
        for path, params in (
            ("/api/v1/query", {"query": "sum(m_x)", "time": at}),
            ("/api/v1/query_range",
             {"query": "m_x", "start": str(T0 / 1000), "end": at, "step": "15"}),
            ("/api/v1/series", {"match[]": "m_x"}),
            ("/api/v1/series", {"match[]": "m_x", "limit": "1"}),  # the expansion is the cost
            ("/api/v1/labels", {"match[]": '{i=~".+"}'}),
            ("/api/v1/label/i/values", {"match[]": "m_x"}),
        ):  # fmt: skip
            if "label/" in path:  # GET only, as in Prometheus (Grafana sends GET there)
                reply = test_client.get(path, params=params)
            else:
                reply = test_client.post(path, data=params, headers=FORM)
            assert reply.status_code == 422, (path, reply.text)
            body = reply.json()
            assert (body["status"], body["errorType"]) == ("error", "execution")
            assert "exceeded the maximum number of series (limit: 2 series)" in body["error"]
        # within the limit, the same routes answer (the server is still up)
        reply = test_client.post(
            "/api/v1/query", data={"query": 'm_x{i!="2"}', "time": at}, headers=FORM
        )
        assert reply.status_code == 200 and len(reply.json()["data"]["result"]) == 2
        values = test_client.get("/api/v1/label/i/values").json()  # no match[]: whole index
        assert values == {"status": "success", "data": ["0", "1", "2"]}
    finally:
        test_client.__exit__(None, None, None)
        vault.close()


def test_limit_truncates_series_labels_and_values_with_prometheus_warning(
    tmp_path: Path,
) -> None:
    test_client, vault = _three_series_client(tmp_path)
    try:
        for path, params, data in (
            ("/api/v1/series", {"match[]": "m_x", "limit": "2"},
             [{"__name__": "m_x", "i": "0"}, {"__name__": "m_x", "i": "1"}]),
            ("/api/v1/labels", {"match[]": "m_x", "limit": "1"}, ["__name__"]),
            ("/api/v1/label/i/values", {"match[]": "m_x", "limit": "2"}, ["0", "1"]),
        ):  # fmt: skip
            body = test_client.get(path, params=params).json()
            assert body == {"status": "success", "data": data,
                            "warnings": ["results truncated due to limit"]}, path  # fmt: skip
            whole = test_client.get(path, params={**params, "limit": "0"}).json()
            assert len(whole["data"]) > len(data) and "warnings" not in whole
            exact = test_client.get(path, params={**params, "limit": str(len(whole["data"]))})
            assert exact.json() == whole
        for limit, words in (("-1", "limit must be non-negative"),
                             ("ten", 'strconv.Atoi: parsing "ten": invalid syntax')):  # fmt: skip
            reply = test_client.get("/api/v1/series", params={"match[]": "m_x", "limit": limit})
            assert reply.status_code == 400
            assert reply.json() == {"status": "error", "errorType": "bad_data",
                                    "error": f'invalid parameter "limit": {words}'}  # fmt: skip
    finally:
        test_client.__exit__(None, None, None)
        vault.close()


def test_remote_read_before_the_raw_horizon_returns_each_minutes_edge_samples(
    tmp_path: Path,
) -> None:
    """Where retention dropped raw samples, remote_read still answers: the first and last
    sample of every minute from the 1m rollups (real samples at their times), then raw."""
    import cramjam
    import numpy as np

    from metricvault.wire.proto.remote_read import ReadRequest, ReadResponse

    day = 86_400_000
    settings = Settings.load(env={}, gateway_maintain=False, retention_raw="1d")
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    ts = T0 + np.arange(0, 3 * day, 15_000)
    values = np.cumsum(np.arange(ts.size) % 7).astype(float)
    vault.write(
        [("work_total", {"job": "j"}, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    )
    vault.maintain(now_ms=T0 + 3 * day)
    horizon = vault.catalog_version().raw_horizon_ms
    assert T0 + day < horizon < T0 + 3 * day
    request = ReadRequest()
    query = request.queries.add(start_timestamp_ms=T0, end_timestamp_ms=T0 + 3 * day)
    query.matchers.add(type=0, name="__name__", value="work_total")
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
    with TestClient(create_app(vault, settings)) as test_client:
        reply = test_client.post("/api/v1/read", content=body)
    vault.close()
    assert reply.status_code == 200, reply.text
    answer = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(reply.content)))
    (series,) = answer.results[0].timeseries
    got_ts = np.array([s.timestamp for s in series.samples])
    got_values = np.array([s.value for s in series.samples])
    old = got_ts < horizon
    minutes = (horizon - T0) // 60_000
    assert old.sum() == 2 * minutes  # :00 and :45 of every minute before the horizon
    assert np.array_equal(got_ts[~old], ts[ts >= horizon])  # raw after it
    assert np.all(np.diff(got_ts) > 0)
    index = np.searchsorted(ts, got_ts)
    assert np.array_equal(ts[index], got_ts) and np.array_equal(values[index], got_values)


@pytest.mark.parametrize(
    ("expr", "depth"),
    [
        ("up", 0),
        ('sum by (a) (rate(x{a=~"b|c", d!="e"}[5m])) / 1000', 3),  # matchers are not operators
        ('label_replace(x, "a+b", "(-)", "c", "d")', 1),  # nor what strings hold
        ("label_replace(x, 'a+b', '(-)', 'c', 'd')", 1),
        ("x # a + b + (c\n+ y", 1),  # nor comments
        ("up" + " + up" * 200, 200),
        ("abs(" * 130 + "up" + ")" * 130, 130),
    ],
)
def test_query_depth_is_operators_plus_deepest_parentheses(expr: str, depth: int) -> None:
    assert query_depth(expr) == depth


def test_query_range_past_the_raw_horizon_answers_from_rollups_with_a_warning(
    tmp_path: Path,
) -> None:
    day = 86_400_000
    settings = Settings.load(env={}, gateway_maintain=False, retention_raw="1d")
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    vault.write([("work_total", {"job": "j"}, T0 + i * 15_000, float(i)) for i in range(3 * 5760)])
    vault.maintain(now_ms=T0 + 3 * day)
    params = {"query": "rate(work_total[1h])", "start": str((T0 + 3_600_000) // 1000),
              "end": str((T0 + 5 * 3_600_000) // 1000), "step": "3600"}  # fmt: skip
    with TestClient(create_app(vault, settings)) as test_client:
        reply = test_client.post("/api/v1/query_range", data=params, headers=FORM).json()
        irate = test_client.post(
            "/api/v1/query_range", data={**params, "query": "irate(work_total[5m])"}, headers=FORM
        ).json()
    vault.close()
    assert reply["status"] == "success", reply
    (series,) = reply["data"]["result"]
    assert [float(v) for _, v in series["values"]] == pytest.approx([1 / 15] * 5)
    assert any("answered from the 1h rollups" in w for w in reply["warnings"]), reply
    # what rollups cannot answer has no raw samples there, and says so
    assert irate["data"]["result"] == [] and "dropped by retention" in irate["warnings"][0]


def _evaluating_threads() -> list[int]:
    """Threads now inside the engine's ``Engine.evaluate``."""
    found = []
    for ident, top in sys._current_frames().items():
        frame: FrameType | None = top
        while frame is not None:
            if frame.f_code.co_name == "evaluate" and frame.f_code.co_filename.endswith(
                "promql/eval.py"
            ):
                found.append(ident)
                break
            frame = frame.f_back
    return found


@pytest.mark.parametrize(
    ("settings", "params"),
    [
        ({"query_timeout": "1ms"}, {}),
        ({}, {"timeout": "0.001"}),  # the request's own timeout=
    ],
)
def test_a_query_past_its_timeout_stops_its_evaluation_and_frees_the_worker(
    make_client: Any, settings: dict[str, Any], params: dict[str, str]
) -> None:
    """The engine's deadline ends the evaluation itself: when the 503 arrives no thread is
    still evaluating, and the next query is answered."""
    test_client, _ = make_client(**settings)
    lines = "".join(
        f"gpu,gpu={g} util={i} {T0 + i * 15_000}\n" for g in range(20) for i in range(2000)
    )
    assert test_client.post("/write?precision=ms", content=lines).status_code == 204
    query = {
        "query": "quantile_over_time(0.5, rate(gpu_util[5m])[6h:15s])",
        "start": str(T0 / 1000),
        "end": str(T0 / 1000 + 30_000),
        "step": "15",
        **params,
    }
    reply = test_client.get("/api/v1/query_range", params=query)
    assert reply.status_code == 503, reply.text
    assert reply.json() == {
        "status": "error",
        "errorType": "timeout",
        "error": "query timed out in expression evaluation",
    }
    assert not _evaluating_threads(), "the evaluation went on after its 503"
    reply = test_client.get("/api/v1/query", params={"query": "vector(1)", "time": str(T0 / 1000)})
    # the worker answers the next query; with query_timeout=1ms a loaded machine may time
    # that one out too, which is an answer as well (it did not wait behind the first)
    answered = {200} if params else {200, 503}
    assert reply.status_code in answered, reply.text


@pytest.mark.parametrize(
    ("path", "params", "error"),
    [
        ("/api/v1/query", {"time": "1e300"},
         "invalid parameter \"time\": Invalid time value for 'time': cannot parse \"1e300\" to a "
         "valid timestamp"),
        ("/api/v1/query", {"time": "-1e17"},
         "invalid parameter \"time\": Invalid time value for 'time': cannot parse \"-1e17\" to a "
         "valid timestamp"),
        ("/api/v1/query_range", {"start": "1e300", "end": "1e300", "step": "15"},
         'invalid parameter "start": cannot parse "1e300" to a valid timestamp'),
        ("/api/v1/query_range", {"start": "0", "end": "1e300", "step": "15"},
         'invalid parameter "end": cannot parse "1e300" to a valid timestamp'),
        ("/api/v1/query_range", {"start": "0", "end": "60", "step": "1e300"},
         'invalid parameter "step": cannot parse "1e300" to a valid duration. It overflows int64'),
        ("/api/v1/query", {"time": "60", "timeout": "1e300"},
         'invalid parameter "timeout": cannot parse "1e300" to a valid duration. It overflows '
         "int64"),
        ("/api/v1/series", {"match[]": "gpu_util", "start": "1e300"},
         "invalid parameter \"start\": Invalid time value for 'start': cannot parse \"1e300\" to "
         "a valid timestamp"),
    ],
)  # fmt: skip
def test_times_and_durations_no_timestamp_can_hold_are_bad_data(
    make_client: Any, path: str, params: dict[str, str], error: str
) -> None:
    test_client, _ = make_client()
    reply = test_client.get(path, params={"query": "gpu_util", **params})
    assert reply.status_code == 400, reply.text
    assert reply.json() == {"status": "error", "errorType": "bad_data", "error": error}


def test_a_query_reads_one_catalog_version_with_one_probe(
    client: tuple[TestClient, Vault],
) -> None:
    """Each query is evaluated with the catalog pinned (Vault.pinned): its reads share the
    version current when it started, so the catalog is probed once a query, not once per read."""
    test_client, vault = client
    params = {"query": "sum(rate(gpu_util[1m])) + count(gpu_util)", "nocache": "1",
              "start": f"{T0 / 1000}", "end": f"{(T0 + 285_000) / 1000}", "step": "15"}  # fmt: skip
    first = test_client.get("/api/v1/query_range", params=params, headers=A)
    assert first.status_code == 200, first.text
    before = vault.catalog.probes
    reply = test_client.get("/api/v1/query_range", params=params, headers=A)
    assert reply.status_code == 200 and reply.json() == first.json()
    assert vault.catalog.probes - before == 1
