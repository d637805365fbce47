"""The query_range result cache: a refresh evaluates only the newest steps, and late data,
maintenance and tenants never let a cached answer be wrong (promql/result_cache.py)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import BearerToken, Settings
from metricvault.credentials import hash_secret
from metricvault.promql import Engine, QueryResult
from metricvault.promql.result_cache import ResultCache, cacheable
from metricvault.server.app import create_app

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP = 60_000
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}


def _write(vault: Vault, start_ms: int, end_ms: int, value: float = 1.0) -> None:
    rows = [
        ("gpu_util", {"gpu": str(gpu)}, t, value + gpu + (t - T0) / 60_000)
        for t in range(start_ms, end_ms, 15_000)
        for gpu in range(2)
    ]
    vault.write(rows)
    vault.flush()


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault.open_local(str(tmp_path / "v"), Settings.load(env={}, gateway_maintain=False))
    _write(v, T0, T0 + 3_600_000)
    yield v
    v.close()


class Recording:
    """The engine's range evaluation, recording which step ranges it was asked for."""

    def __init__(self, vault: Vault, expr: str) -> None:
        self.engine, self.expr, self.calls = Engine(vault), expr, list[tuple[int, int]]()

    def __call__(self, lo: int, hi: int) -> tuple[QueryResult, list[str]]:
        self.calls.append((lo, hi))
        result = self.engine.evaluate(self.expr, lo, hi, STEP)
        return result, list(result.warnings)


def _same(a: QueryResult, b: QueryResult) -> None:
    assert [labels for labels, _, _ in a.series] == [labels for labels, _, _ in b.series]
    for (_, ta, va), (_, tb, vb) in zip(a.series, b.series, strict=True):
        assert ta.tolist() == tb.tolist()
        np.testing.assert_allclose(va, vb, rtol=1e-12)


EXPR = "avg_over_time(gpu_util[2m])"


def test_a_refresh_evaluates_only_the_steps_after_the_settled_ones(vault: Vault) -> None:
    # the wall clock 30 minutes after the data starts: steps within 5 minutes of it are kept
    # out of the cache (samples may still arrive for them)
    now_ms = T0 + 30 * STEP
    cache = ResultCache(settle_ms=5 * STEP, clock=lambda: now_ms / 1000)
    run = Recording(vault, EXPR)
    first, _ = cache.query_range((), EXPR, T0, T0 + 30 * STEP, STEP, vault.catalog_version, run)
    assert run.calls == [(T0, T0 + 30 * STEP)]
    # the refresh: the same panel 3 minutes later, its range moved forward by 3 steps
    now_ms += 3 * STEP
    start, end = T0 + 3 * STEP, T0 + 33 * STEP
    again, _ = cache.query_range((), EXPR, start, end, STEP, vault.catalog_version, run)
    assert run.calls[1] == (T0 + 26 * STEP, end)  # only what was not settled, and the new
    _same(again, Engine(vault).evaluate(EXPR, start, end, STEP))
    assert cache.stats.partial == 1 and cache.stats.steps_reused == 23
    # the same request again while the clock stands still: from the cache up to the settled
    # step, the last ones evaluated
    cache.query_range((), EXPR, start, end, STEP, vault.catalog_version, run)
    assert run.calls[2] == (T0 + 29 * STEP, end)
    assert first.series


def test_an_ordinary_flush_keeps_the_answer_and_late_data_drops_it(vault: Vault) -> None:
    cache = ResultCache(settle_ms=0, clock=lambda: (T0 + 10 * 3_600_000) / 1000)
    end = T0 + 40 * STEP
    run = Recording(vault, EXPR)
    cache.query_range((), EXPR, T0, end, STEP, vault.catalog_version, run)
    _write(vault, T0 + 3_600_000, T0 + 3_700_000)  # newer than every cached step
    cache.query_range((), EXPR, T0, end, STEP, vault.catalog_version, run)
    assert cache.stats.hits == 1 and cache.stats.invalidated == 0 and len(run.calls) == 1
    # a late sample (older than the cached end) for a series of the query's metric
    vault.write([("gpu_util", {"gpu": "0"}, T0 + 20 * STEP + 7_500, 1000.0)])
    vault.flush()
    late, _ = cache.query_range((), EXPR, T0, end, STEP, vault.catalog_version, run)
    assert cache.stats.invalidated == 1 and run.calls[-1] == (T0, end)
    _same(late, Engine(vault).evaluate(EXPR, T0, end, STEP))


@pytest.mark.parametrize(
    ("expr", "cached"),
    [
        ("gpu_util", True),
        ("sum by (gpu) (rate(gpu_util[5m]))", True),
        ("gpu_util offset 5m", True),
        ("max_over_time(rate(gpu_util[5m])[1h:1m])", True),
        ("gpu_util @ 1767225600", False),  # the same time at every step
        ("gpu_util @ end()", False),  # moves with the range's end
        ("rate(gpu_util[5m:1m] @ start())", False),
        ("gpu_util offset -5m", False),  # reads after the step
        ("1 + sum(gpu_util offset -1m)", False),
        ("sum(", False),  # not PromQL: evaluated (and refused) without the cache
    ],
)
def test_only_expressions_whose_steps_read_their_own_past_are_cached(
    expr: str, cached: bool
) -> None:
    assert cacheable(expr) is cached


# --------------------------------------------------------------------------- over HTTP
@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Vault]]:
    settings = Settings.load(
        env={},
        gateway_maintain=False,
        retention_raw="2d",
        auth_bearer_tokens=(
            BearerToken(hash_secret("token-a"), "team-a"),
            BearerToken(hash_secret("token-b"), "team-b"),
        ),
    )
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    with TestClient(create_app(vault, settings)) as test_client:
        for headers, value in ((A, 1.0), (B, 2.0)):
            lines = "".join(f"gpu,gpu=0 util={value} {T0 + i * 15_000}\n" for i in range(240))
            reply = test_client.post("/write?precision=ms", content=lines, headers=headers)
            assert reply.status_code == 204, reply.text
        vault.flush()
        yield test_client, vault
    vault.close()


def _range(client: TestClient, headers: dict[str, str], expr: str, **extra: str) -> Any:
    params = {"query": expr, "start": str(T0 / 1000), "end": str((T0 + 3_000_000) / 1000),
              "step": "60", **extra}  # fmt: skip
    reply = client.get("/api/v1/query_range", params=params, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_two_tenants_never_see_each_others_cached_answer(
    client: tuple[TestClient, Vault],
) -> None:
    test_client, _ = client
    for _ in range(2):  # the second round answered from the cache
        for headers, value in ((A, "1"), (B, "2")):
            body = _range(test_client, headers, "sum(gpu_util)")
            values = {v for r in body["data"]["result"] for _, v in r["values"]}
            assert values == {value}


def test_a_late_sample_changes_the_next_answer(client: tuple[TestClient, Vault]) -> None:
    test_client, vault = client
    before = _range(test_client, A, "max_over_time(gpu_util[1m])")
    assert before == _range(test_client, A, "max_over_time(gpu_util[1m])")
    reply = test_client.post(
        "/write?precision=ms", content=f"gpu,gpu=0 util=50 {T0 + 600_000 + 7_500}\n", headers=A
    )
    assert reply.status_code == 204, reply.text
    vault.flush()  # queries read what a flush committed
    after = _range(test_client, A, "max_over_time(gpu_util[1m])")
    assert after != before
    assert after == _range(test_client, A, "max_over_time(gpu_util[1m])", nocache="1")
    params = {"query": "max_over_time(gpu_util[1m])", "start": str(T0 / 1000),
              "end": str((T0 + 3_000_000) / 1000), "step": "60"}  # fmt: skip
    cached = test_client.get("/api/v1/query_range", params=params, headers=A).content
    fresh = test_client.get("/api/v1/query_range", params={**params, "nocache": "1"}, headers=A)
    assert cached == fresh.content
    points = dict(after["data"]["result"][0]["values"])
    assert points[(T0 + 660_000) / 1000] == "50"


def test_a_retention_run_changes_the_next_answer(client: tuple[TestClient, Vault]) -> None:
    test_client, vault = client
    vault.maintain(now_ms=T0 + 3_600_000)  # rollups; nothing is old enough to drop yet
    before = _range(test_client, A, "gpu_util")
    assert before == _range(test_client, A, "gpu_util")
    vault.maintain(now_ms=T0 + 5 * 86_400_000)  # retention drops the raw samples
    after = _range(test_client, A, "gpu_util")
    assert after != before
    assert after == _range(test_client, A, "gpu_util", nocache="1")


def test_a_cached_answer_is_written_byte_for_byte_as_an_evaluated_one(vault: Vault) -> None:
    from metricvault.server.prometheus_json import answer_body

    ts = T0 + np.arange(8, dtype=np.int64) * STEP
    odd = np.array([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-300, 1e21, 0.1])
    plain = QueryResult("matrix", [({"__name__": "x", "a": "é"}, ts, odd),
                                   ({"b": "1"}, ts[2:], odd[2:] * 3)])  # fmt: skip
    for settle_ms in (0, 3 * STEP):  # all points cached, or the last ones evaluated anew
        now_s = (T0 + 7 * STEP + settle_ms) / 1000
        cache = ResultCache(settle_ms=settle_ms, clock=partial(float, now_s))

        def evaluate(lo: int, hi: int) -> tuple[QueryResult, list[str]]:
            part = [(labels, t[(t >= lo) & (t <= hi)], v[(t >= lo) & (t <= hi)])
                    for labels, t, v in plain.series]  # fmt: skip
            return QueryResult("matrix", [p for p in part if len(p[1])]), ["a warning"]

        for _ in range(2):  # evaluated, then from the cache
            got, notes = cache.query_range(
                (), "x", T0, ts[-1], STEP, vault.catalog_version, evaluate
            )
            body = got.body(notes)  # type: ignore[attr-defined]
            assert body == answer_body(plain, ["a warning"])
