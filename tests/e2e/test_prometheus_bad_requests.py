"""Bad requests to the Prometheus API: each answered in Prometheus's shape, and the server stays up.

Every request goes to Debian's real Prometheus (GET) and to a real ``metricvault serve`` over
the same samples (form-encoded POST, as Grafana sends it, or GET where Prometheus only has GET):
both must refuse it with ``status: error``, the same ``errorType`` and HTTP status, and the same
words, except parse errors, which are the parser package's (``promql-parser``) and must only
say ``parse error`` after Prometheus's ``invalid parameter "query": `` prefix. After all of
them, the gateway still answers a good query. Issue 13 asks for at least 30 kinds.
"""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

import pytest

from metricvault.promql.parse import MAX_QUERY_DEPTH

from .test_prometheus_api import get_json, post_form, served  # noqa: F401  (fixture)
from .test_promql_oracle import Oracle, oracle  # noqa: F401  (the module's fixture)

R = "/api/v1/query_range"
Q = "/api/v1/query"
RANGE = [("start", "{t0}"), ("end", "{t1}"), ("step", "15")]
AT = ("time", "{tm}")  # errors on the data need data: 10 minutes into the oracle's samples

# (id, path, params, errorType); "{t0}"/"{t1}" become the oracle's data span in seconds.
CASES: list[tuple[str, str, list[tuple[str, str]], str]] = [
    ("unclosed-call", Q, [("query", "sum(")], "bad_data"),
    ("unclosed-range", Q, [("query", "rate(http_requests_total[5m]")], "bad_data"),
    ("unclosed-braces", Q, [("query", 'http_requests_total{job="api"')], "bad_data"),
    ("dangling-operator", Q, [("query", "1 +")], "bad_data"),
    ("empty-query", Q, [("query", "")], "bad_data"),
    ("no-query-parameter", Q, [], "bad_data"),
    ("bad-regex-in-selector", Q, [("query", 'http_requests_total{job=~"("}')], "bad_data"),
    ("unknown-function", Q, [("query", "nosuchfunc(http_requests_total)")], "bad_data"),
    ("range-function-on-instant-vector", Q, [("query", "rate(http_requests_total)")], "bad_data"),
    ("instant-function-on-range-vector", Q, [("query", "abs(node_temp_celsius[5m])")], "bad_data"),
    ("too-few-arguments", Q, [("query", "clamp(node_temp_celsius, 1)")], "bad_data"),
    ("string-as-topk-parameter", Q, [("query", 'topk("5", node_temp_celsius)')], "bad_data"),
    ("empty-selector", Q, [("query", "{}")], "bad_data"),
    ("only-empty-matchers", Q, [("query", '{job=""}')], "bad_data"),
    ("scalar-comparison-without-bool", Q, [("query", "1 == 1")], "bad_data"),
    ("set-operator-on-scalars", Q, [("query", "1 and 1")], "bad_data"),
    ("bad-duration", Q, [("query", "rate(http_requests_total[5x])")], "bad_data"),
    ("range-vector-in-range-query", R, [("query", "node_temp_celsius[5m]"), *RANGE], "bad_data"),
    ("string-in-range-query", R, [("query", '"hello"'), *RANGE], "bad_data"),
    ("bad-regex-in-label-replace", Q,
     [("query", 'label_replace(node_temp_celsius, "dst", "$1", "zone", "(")'), AT], "execution"),
    ("bad-label-name-in-label-replace", Q,
     [("query", 'label_replace(node_temp_celsius, "1dst", "$1", "zone", "(.*)")'), AT],
     "execution"),
    ("bad-label-name-in-count-values", Q,
     [("query", 'count_values("1v", node_temp_celsius)'), AT], "execution"),
    ("many-to-many-matching", Q,
     [("query", "node_temp_celsius + on(instance) node_temp_celsius"), AT], "execution"),
    ("duplicate-label-sets", Q,
     [("query", 'label_replace(node_temp_celsius, "zone", "", "", "")'), AT], "execution"),
    ("holt-winters-bad-factor", Q,
     [("query", "holt_winters(node_temp_celsius[5m], 2, 0.5)"), AT], "execution"),
    ("bad-time", Q, [("query", "node_temp_celsius"), ("time", "yesterday")], "bad_data"),
    ("rfc3339-without-zone", Q,
     [("query", "node_temp_celsius"), ("time", "2026-01-01T00:00:00")], "bad_data"),
    ("bad-timeout", Q, [("query", "node_temp_celsius"), ("timeout", "soon")], "bad_data"),
    ("missing-start", R, [("query", "node_temp_celsius"), ("end", "{t1}"), ("step", "15")],
     "bad_data"),
    ("bad-end", R, [("query", "node_temp_celsius"), ("start", "{t0}"), ("end", "later"),
                    ("step", "15")], "bad_data"),
    ("start-after-end", R, [("query", "node_temp_celsius"), ("start", "{t1}"), ("end", "{t0}"),
                            ("step", "15")], "bad_data"),
    ("zero-step", R, [("query", "node_temp_celsius"), ("start", "{t0}"), ("end", "{t1}"),
                      ("step", "0")], "bad_data"),
    ("negative-step", R, [("query", "node_temp_celsius"), ("start", "{t0}"), ("end", "{t1}"),
                          ("step", "-15")], "bad_data"),
    ("bad-step", R, [("query", "node_temp_celsius"), ("start", "{t0}"), ("end", "{t1}"),
                     ("step", "fast")], "bad_data"),
    ("overflowing-step", R, [("query", "node_temp_celsius"), ("start", "{t0}"), ("end", "{t1}"),
                             ("step", "1e400")], "bad_data"),
    ("overflowing-time", Q, [("query", "node_temp_celsius"), ("time", "1e400")], "bad_data"),
    ("overflowing-range", Q, [("query", "rate(node_temp_celsius[300000000y])")], "bad_data"),
    ("over-11000-points", R, [("query", "node_temp_celsius"), ("start", "{t0}"),
                              ("end", "{t1}"), ("step", "0.01")], "bad_data"),
    ("huge-range-tiny-step", R, [("query", "node_temp_celsius"), ("start", "0"),
                                 ("end", "1e10"), ("step", "1")], "bad_data"),
    ("series-without-match", "/api/v1/series", [], "bad_data"),
    ("series-bad-match", "/api/v1/series", [("match[]", "{")], "bad_data"),
    ("series-empty-match", "/api/v1/series", [("match[]", "{}")], "bad_data"),
    ("series-bad-regex-match", "/api/v1/series", [("match[]", '{job=~"("}')], "bad_data"),
    ("series-bad-start", "/api/v1/series", [("match[]", "node_temp_celsius"),
                                            ("start", "dawn")], "bad_data"),
    ("labels-bad-match", "/api/v1/labels", [("match[]", "up{")], "bad_data"),
    ("labels-bad-end", "/api/v1/labels", [("end", "dusk")], "bad_data"),
    ("values-bad-label-name", "/api/v1/label/1bad/values", [], "bad_data"),
    ("values-bad-match", "/api/v1/label/job/values", [("match[]", '{job=~"["}')], "bad_data"),
]  # fmt: skip
GET_ONLY = ("/api/v1/label/",)  # Prometheus registers label values for GET only


def _params(params: list[tuple[str, str]], oracle: Oracle) -> list[tuple[str, str]]:  # noqa: F811
    t0, t1 = oracle.t0 / 1000, oracle.t0 / 1000 + 40 * 60
    spans = {"{t0}": str(t0), "{t1}": str(t1), "{tm}": str(t0 + 600)}
    return [(k, spans.get(v, v)) for k, v in params]


def _ask(url: str, path: str, params: list[tuple[str, str]], post: bool) -> tuple[int, Any]:
    return post_form(url, path, params) if post else get_json(url, path, params)


def test_at_least_thirty_kinds_of_bad_request() -> None:
    assert len({case[0] for case in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize(("path", "params", "kind"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_request_is_refused_as_prometheus_refuses_it(
    oracle: Oracle,  # noqa: F811
    served: Any,  # noqa: F811
    path: str,
    params: list[tuple[str, str]],
    kind: str,
) -> None:
    params = _params(params, oracle)
    theirs_status, theirs = get_json(oracle.url, path, params)
    ours_status, ours = _ask(served.url, path, params, not path.startswith(GET_ONLY))
    assert theirs["status"] == "error" and theirs["errorType"] == kind, theirs
    assert set(ours) == {"status", "errorType", "error"}, ours
    assert (ours["status"], ours["errorType"], ours_status) == ("error", kind, theirs_status), (
        f"prometheus {theirs_status} {theirs}\ngateway    {ours_status} {ours}"
    )
    if "parse error" in theirs["error"]:  # the parser package words the rest itself
        prefix = re.sub(r"(\d+:\d+: )?parse error.*", "", theirs["error"], flags=re.S)
        assert ours["error"].startswith(prefix + "parse error"), (theirs, ours)
    else:
        assert ours["error"] == theirs["error"]


def test_limits_and_oversized_requests_are_refused_in_prometheus_shape(
    served: Any,  # noqa: F811
) -> None:
    """Refusals that need our limits to trigger: a timeout (Prometheus's words, from the
    request's ``timeout=``), a body over max_body_bytes (Prometheus refuses forms over 10 MB)."""
    status, body = post_form(served.url, Q, [("query", "node_temp_celsius"),
                                             ("timeout", "0.000001")])  # fmt: skip
    assert (status, body["errorType"], body["error"]) == (
        503, "timeout", "query timed out in expression evaluation"), body  # fmt: skip
    # a 40 MB form (over max_body_bytes): refused on its Content-Length, before the body
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    connection.putrequest("POST", Q)
    connection.putheader("Content-Type", "application/x-www-form-urlencoded")
    connection.putheader("Content-Length", str(40 * 1024**2))
    connection.endheaders()
    reply = connection.getresponse()
    body = json.loads(reply.read())
    connection.close()
    assert reply.status == 413 and body["status"] == "error", body
    assert body["errorType"] == "bad_data" and "body" in body["error"], body


def test_a_query_nested_past_the_engine_is_refused_not_crashing_a_worker(
    oracle: Oracle,  # noqa: F811
    served: Any,  # noqa: F811
) -> None:
    """promql-parser (Rust) overflows its stack near 10,000 chained operators (a segfault that
    killed the gateway worker) and the engine recursion near 300: past MAX_QUERY_DEPTH a query
    is refused before parsing. Prometheus answers these (it has no such limit)."""
    at = ("time", str(oracle.t0 / 1000 + 600))
    for expr, depth in (("node_temp_celsius" + " + node_temp_celsius" * 20_000, 20_000),
                        ("abs(" * 400 + "node_temp_celsius" + ")" * 400, 400)):  # fmt: skip
        status, body = post_form(served.url, Q, [("query", expr), at])
        assert (status, body["errorType"]) == (400, "bad_data"), body
        assert body["error"] == (
            f'invalid parameter "query": the expression nests {depth} operators and '
            f"parentheses; metricvault evaluates at most {MAX_QUERY_DEPTH} (split it, or use "
            "an aggregation)"
        )
    # depth 128, the limit: 127 operators inside one pair of parentheses
    expr = "sum(node_temp_celsius" + " + node_temp_celsius" * (MAX_QUERY_DEPTH - 1) + ")"
    status, body = post_form(served.url, Q, [("query", expr), at])
    ours = float(body["data"]["result"][0]["value"][1])
    _, theirs = get_json(oracle.url, Q, [("query", expr), at])
    assert status == 200 and abs(ours / float(theirs["data"]["result"][0]["value"][1]) - 1) < 1e-9
    assert served.running


def test_the_gateway_still_answers_after_every_bad_request(
    oracle: Oracle,  # noqa: F811
    served: Any,  # noqa: F811
) -> None:
    for _, path, params, _ in CASES:  # once more, all in a row, then a good query
        _ask(served.url, path, _params(params, oracle), not path.startswith(GET_ONLY))
    assert served.running
    status, body = post_form(served.url, Q, [("query", "count(node_temp_celsius)"),
                                             ("time", str(oracle.t0 / 1000 + 600))])  # fmt: skip
    assert status == 200 and body["data"]["result"][0]["value"][1] == "6", body
