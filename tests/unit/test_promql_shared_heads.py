"""The query API's head cache, shared by its queries (promql/head_cache.TenantHeads): a refresh
reads from the store only the samples since the last read, a late sample or a flush of new
samples shows in the next answer, and two tenants never see each other's kept samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from metricvault import Vault
from metricvault.config import BearerToken, Settings
from metricvault.credentials import hash_secret
from metricvault.promql.head_cache import HeadCache, TenantHeads
from metricvault.server.app import create_app

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}


def _lines(value: float, start: int, end: int) -> str:
    return "".join(f"gpu,gpu=0 util={value} {t}\n" for t in range(start, end, 15_000))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Vault, TenantHeads]]:
    settings = Settings.load(
        env={},
        gateway_maintain=False,
        retention_raw="forever",
        auth_bearer_tokens=(
            BearerToken(hash_secret("token-a"), "team-a"),
            BearerToken(hash_secret("token-b"), "team-b"),
        ),
    )
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    app = create_app(vault, settings)
    route = next(r for r in app.routes if getattr(r, "path", "") == "/api/v1/query_range")
    heads = route.endpoint.__self__.heads  # type: ignore[attr-defined]
    with TestClient(app) as test_client:
        for headers, value in ((A, 1.0), (B, 2.0)):
            reply = test_client.post(
                "/write?precision=ms", content=_lines(value, T0, T0 + 3_600_000), headers=headers
            )
            assert reply.status_code == 204, reply.text
        vault.flush()
        yield test_client, vault, heads
    vault.close()


def _range(client: TestClient, headers: dict[str, str], start: int, end: int) -> Any:
    params = {"query": "max_over_time(gpu_util[1m])", "start": str(start / 1000),
              "end": str(end / 1000), "step": "15", "nocache": "1"}  # fmt: skip
    reply = client.get("/api/v1/query_range", params=params, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]["result"]


def _values(result: Any) -> dict[float, str]:
    assert len(result) == 1, result
    return dict(result[0]["values"])


def test_tenants_never_share_kept_samples(
    client: tuple[TestClient, Vault, TenantHeads],
) -> None:
    test_client, _, heads = client
    for _ in range(2):  # the second round from the kept samples
        for headers, value in ((A, "1"), (B, "2")):
            got = _values(_range(test_client, headers, T0 + 1_800_000, T0 + 3_000_000))
            assert set(got.values()) == {value}
    assert heads.hits >= 2, (heads.hits, heads.extended, heads.reads, len(heads))
    assert len(heads) == 2  # one per tenant


def test_a_refresh_reads_only_the_new_samples_and_sees_them(
    client: tuple[TestClient, Vault, TenantHeads],
) -> None:
    test_client, vault, heads = client
    end = T0 + 3_585_000
    first = _values(_range(test_client, A, end - 3_000_000, end))
    reads = heads.reads
    # new samples, flushed: the next refresh (moved on by 2 steps) shows them
    reply = test_client.post(
        "/write?precision=ms", content=_lines(7.0, T0 + 3_600_000, T0 + 3_630_000), headers=A
    )
    assert reply.status_code == 204, reply.text
    vault.flush()
    later = _values(_range(test_client, A, end - 3_000_000 + 30_000, end + 30_000))
    assert heads.reads == reads and heads.extended >= 1  # only the samples since: no re-read
    assert later[(end + 30_000) / 1000] == "7"
    assert all(later[t] == v for t, v in first.items() if t in later)


def test_a_late_sample_changes_the_next_answer(
    client: tuple[TestClient, Vault, TenantHeads],
) -> None:
    test_client, vault, _ = client
    span = (T0 + 600_000, T0 + 3_000_000)
    before = _values(_range(test_client, A, *span))
    assert before == _values(_range(test_client, A, *span))
    reply = test_client.post(
        "/write?precision=ms", content=f"gpu,gpu=0 util=50 {T0 + 1_200_000 + 7_500}\n", headers=A
    )
    assert reply.status_code == 204, reply.text
    vault.flush()
    after = _values(_range(test_client, A, *span))
    assert after[(T0 + 1_215_000) / 1000] == "50"
    assert {t: v for t, v in after.items() if v != "50"} == {
        t: v for t, v in before.items() if t not in {k for k, x in after.items() if x == "50"}
    }


class _Racing:
    """The vault, where the read of new samples for a kept selector first lets another query
    of the same selector extend the kept samples (as a concurrent refresh would)."""

    def __init__(self, vault: Vault, heads: TenantHeads | HeadCache) -> None:
        self.inner, self.heads, self.raced = vault, heads, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def select(self, matchers: Any, start: int, end: int, hints: Any = None) -> Any:
        if self.raced == 0 and hints is None and len(self.heads):
            self.raced += 1
            self.heads.select(self.inner, matchers, start, end + 15_000, None)
        return self.inner.select(matchers, start, end, hints)


def test_an_extend_raced_by_another_query_reads_the_store(
    client: tuple[TestClient, Vault, TenantHeads],
) -> None:
    from metricvault.selector import parse_selector

    _, vault, _ = client
    heads = HeadCache()
    racing = _Racing(vault, heads)
    matchers = list(parse_selector("gpu_util").matchers)
    end = T0 + 3_000_000
    first = heads.select(racing, matchers, end - 600_000, end, None)
    later = heads.select(racing, matchers, end - 600_000, end + 30_000, None)  # reads anew
    assert racing.raced == 1 and heads.extended == 1  # the other query extended them meanwhile
    direct = vault.select(matchers, end - 600_000, end + 30_000)
    assert [s.ts.tolist() for s in later] == [s.ts.tolist() for s in direct]
    assert [s.values.tolist() for s in later] == [s.values.tolist() for s in direct]
    assert [s.ts.tolist() for s in first] == [s.ts[s.ts <= end].tolist() for s in direct]
