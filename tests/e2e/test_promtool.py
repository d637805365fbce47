"""Debian's ``promtool query`` as a real client of ``metricvault serve`` (issue 13).

The oracle's samples sit in Debian's Prometheus and in a vault that a real ``metricvault serve``
answers from (the fixtures of tests/e2e/test_prometheus_api.py). ``promtool query instant``,
``range``, ``series`` and ``labels`` run against both; their outputs must be equal: the text
(``-o promql``) line for line after sorting (Prometheus and the vault may list series in
another order), and the JSON (``-o json``) as the compliance tester compares values (1e-5).

Tenants: promtool 2.42 has no ``--http.config.file`` yet; it sends a bearer token with
``query range --header "Authorization: Bearer ..."`` and basic auth from the server URL's
``user:password@`` (Go's HTTP client does that for every command). A tenant's credential must
see its own tenant's series only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from metricvault.credentials import hash_secret

from .conftest import GATEWAY_DEFAULT_SETTINGS, GatewayProcess, free_port
from .test_prometheus_api import IN_VAULT, served  # noqa: F401  (fixture)
from .test_promql_oracle import Oracle, _agree, normal_reply, oracle  # noqa: F401  (fixture)

PROMTOOL_TIMEOUT_S = 60


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is missing: apt-get install -y prometheus")
    done = subprocess.run([binary, "query", *args], capture_output=True, text=True,
                          timeout=PROMTOOL_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, f"promtool query {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _commands(t0: int) -> list[list[str]]:
    """promtool arguments after the server; {fmt} becomes promql or json."""
    at, start, end = t0 + 10 * 60_000, t0 + 5 * 60_000, t0 + 35 * 60_000
    return [
        ["instant", "{server}", "node_temp_celsius", f"--time={at / 1000}"],
        ["instant", "{server}", "sum by (zone) (node_temp_celsius)", f"--time={_rfc3339(at)}"],
        ["instant", "{server}", "rate(http_requests_total[5m])", f"--time={at / 1000 + 7.5}"],
        ["instant", "{server}", 'histogram_quantile(0.9, sum by (le) '
         '(rate(request_duration_seconds_bucket[5m])))', f"--time={at / 1000}"],
        ["instant", "{server}", "nosuch_metric", f"--time={at / 1000}"],
        ["range", "{server}", 'gpu_util_ratio{gpu="1"}', f"--start={start / 1000}",
         f"--end={end / 1000}", "--step=30s"],
        ["range", "{server}", "avg by (instance) (avg_over_time(node_temp_celsius[2m]))",
         f"--start={_rfc3339(start)}", f"--end={_rfc3339(end)}", "--step=1m"],
        ["series", "{server}", "--match=node_temp_celsius", '--match=gpu_util_ratio{gpu="1"}'],
        ["series", "{server}", "--match=http_requests_total", f"--start={start / 1000}",
         f"--end={end / 1000}"],
        ["labels", "{server}", "instance", f"--match={IN_VAULT}"],
        ["labels", "{server}", "__name__", f"--match={IN_VAULT}"],
        ["labels", "{server}", "zone", "--match=node_temp_celsius"],
    ]  # fmt: skip


def _run(args: list[str], server: str, fmt: str) -> str:
    return promtool(*[a.replace("{server}", server) for a in args], f"--format={fmt}")


def _normal(kind: str, output: str) -> Any:
    """promtool's JSON as the oracle compares it: query answers normalised, label lists sorted."""
    data = json.loads(output)
    if kind in ("instant", "range"):
        result_type = "vector" if kind == "instant" else "matrix"
        return normal_reply({"status": "success",
                             "data": {"resultType": result_type, "result": data}})  # fmt: skip
    return sorted(json.dumps(item, sort_keys=True) for item in data)


def test_promtool_query_answers_as_from_prometheus(
    oracle: Oracle,  # noqa: F811
    served: Any,  # noqa: F811
) -> None:
    non_empty = 0
    for args in _commands(oracle.t0):
        ours = _run(args, served.url, "promql")
        theirs = _run(args, oracle.url, "promql")
        assert sorted(ours.splitlines()) == sorted(theirs.splitlines()) or (
            _agree(_normal(args[0], _run(args, oracle.url, "json")),
                   _normal(args[0], _run(args, served.url, "json")), False)
            if args[0] in ("instant", "range")
            else False
        ), f"promtool query {args}\nprometheus:\n{theirs}\nmetricvault:\n{ours}"  # fmt: skip
        if args[0] in ("series", "labels"):
            assert _normal(args[0], _run(args, served.url, "json")) == _normal(
                args[0], _run(args, oracle.url, "json")
            ), args
        non_empty += bool(theirs.strip())
    assert non_empty == len(_commands(oracle.t0)) - 1  # all but nosuch_metric hold data


# ----------------------------------------------------------------------------- tenants
@pytest.fixture(scope="module")
def tenant_gateway(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway with auth: token-a writes as tenant team-a, basic user b as team-b."""
    directory = tmp_path_factory.mktemp("promtool_tenants")
    config = directory / "metricvault.toml"
    config.write_text(
        f'[[auth_bearer_tokens]]\nsha256 = "{hash_secret("token-a")}"\ntenant = "team-a"\n'
        f'[[auth_basic_users]]\nuser = "b"\nsha256 = "{hash_secret("pass-b")}"\n'
        'tenant = "team-b"\n'
    )

    class Gateway(GatewayProcess):
        def command(self) -> list[str]:
            return [*super().command(), "--config", str(config)]

    gw = Gateway(data_dir=Path(directory / "vault"), port=free_port(),
                 log_path=directory / "gateway.log", settings=GATEWAY_DEFAULT_SETTINGS)  # fmt: skip
    gw.start()
    yield gw
    gw.stop_gracefully()


def test_promtool_with_a_tenant_credential_sees_only_its_tenant(
    tenant_gateway: GatewayProcess,
) -> None:
    import time
    import urllib.request

    now_s = int(time.time())
    for auth, value in (("Bearer token-a", 1.0), ("Basic YjpwYXNzLWI=", 2.0)):  # b:pass-b
        lines = "".join(f"gpu,gpu=0 util={value} {(now_s - 300 + 15 * i) * 1000}\n"
                        for i in range(20))  # fmt: skip
        request = urllib.request.Request(
            f"{tenant_gateway.url}/write?precision=ms", data=lines.encode(),
            headers={"Authorization": auth}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 204
    url_b = tenant_gateway.url.replace("http://", "http://b:pass-b@")
    window = [f"--start={now_s - 300}", f"--end={now_s}", "--step=60s"]
    # Acknowledged samples are queryable once flushed (flush_interval 1 s), each tenant's by
    # whichever gateway worker took its write: wait (bounded) until both answer.
    deadline = time.monotonic() + 15
    while True:
        as_a = promtool("range", tenant_gateway.url, "gpu_util", *window, "--format=json",
                        "--header=Authorization: Bearer token-a")  # fmt: skip
        as_b = promtool("instant", url_b, '{__name__=~".+"}', f"--time={now_s}", "--format=json")
        if (json.loads(as_a) and json.loads(as_b)) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert [s["metric"]["tenant"] for s in json.loads(as_a)] == ["team-a"], as_a
    assert {v for _, v in json.loads(as_a)[0]["values"]} == {"1"}
    assert [(s["metric"]["tenant"], s["value"][1]) for s in json.loads(as_b)] == [("team-b", "2")]
    series = json.loads(promtool("series", url_b, "--match=gpu_util", "--format=json"))
    assert series == [{"__name__": "gpu_util", "gpu": "0", "tenant": "team-b"}]
    assert promtool("labels", url_b, "tenant").split() == ["team-b"]
    # without a credential: refused (promtool exits non-zero), nothing leaks
    done = subprocess.run([shutil.which("promtool") or "promtool", "query", "labels",
                           tenant_gateway.url, "tenant"], capture_output=True, text=True,
                          timeout=PROMTOOL_TIMEOUT_S)  # fmt: skip
    assert done.returncode != 0 and "team" not in done.stdout, done
