"""The web UI's JSON endpoints and pages: tenant scoping, filtering/sorting/paging, history
and compare against the Python API, downsampling that keeps spikes, escaping of data."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from metricvault.archive.compare import history
from metricvault.config import BearerToken, Settings
from metricvault.credentials import hash_secret
from metricvault.server.app import create_ui_app
from metricvault.server.ui_api import downsample, esc
from metricvault.store.vault import Vault

T0 = 1_700_000_000_000
TOKEN_A, TOKEN_B = "token-of-team-a", "token-of-team-b"
AUTH_A = {"Authorization": f"Bearer {TOKEN_A}"}
AUTH_B = {"Authorization": f"Bearer {TOKEN_B}"}
HOSTILE = '<script>alert("x")</script>'


@pytest.fixture
def tenants(make_client):
    client, vault = make_client(
        auth_bearer_tokens=(
            BearerToken(hash_secret(TOKEN_A), "team-a"),
            BearerToken(hash_secret(TOKEN_B), "team-b"),
        )
    )
    # run r1 of team a: loss falls by step; team b's run has a different job
    lines = [f"train,job=r1 step={s},loss={10 - s} {T0 + s * 1000}" for s in range(10)]
    assert (
        client.post("/write?precision=ms", content="\n".join(lines), headers=AUTH_A).status_code
        == 204
    )
    lines = [f"train,job=r2 step={s},loss={s} {T0 + s * 1000}" for s in range(5)]
    assert (
        client.post("/write?precision=ms", content="\n".join(lines), headers=AUTH_B).status_code
        == 204
    )
    for exp_id, auth, job, owner in (("r1", AUTH_A, "r1", "ann"), ("r2", AUTH_B, "r2", "bob")):
        body = {
            "id": exp_id,
            "selector": f'{{job="{job}"}}',
            "start": T0,
            "end": T0 + 10_000,
            "owner": owner,
            "tags": ["demo", HOSTILE] if exp_id == "r1" else ["demo"],
            "params": {"lr": 0.1, "note": HOSTILE},
        }
        assert client.post("/api/v1/experiments", json=body, headers=auth).status_code == 201
    vault.flush()
    return client, vault


def test_every_ui_route_needs_a_credential(tenants):
    client, _ = tenants
    for path in (
        "/",
        "/ui/experiments",
        "/ui/explore",
        "/ui/static/ui.js",
        "/api/v1/ui/experiments",
        "/api/v1/experiments/r1/history",
        "/api/v1/experiments/r1/gpus",
        "/api/v1/compare?ids=r1",
        "/api/v1/vault/stats",
    ):
        assert client.get(path, follow_redirects=False).status_code == 401, path


def test_the_experiments_table_shows_only_the_callers_tenant(tenants):
    client, _ = tenants
    rows_a = client.get("/api/v1/ui/experiments", headers=AUTH_A).json()["rows"]
    rows_b = client.get("/api/v1/ui/experiments", headers=AUTH_B).json()["rows"]
    assert [r["id"] for r in rows_a] == ["r1"] and [r["id"] for r in rows_b] == ["r2"]
    # another tenant's experiment is unknown, page and JSON alike
    assert client.get("/api/v1/experiments/r2/history", headers=AUTH_A).status_code == 404
    assert client.get("/api/v1/experiments/r2/gpus", headers=AUTH_A).status_code == 404
    assert client.get("/ui/experiments/r2", headers=AUTH_A).status_code == 404
    assert client.get("/api/v1/compare?ids=r1,r2", headers=AUTH_A).status_code == 404


def test_history_by_step_matches_the_python_api(tenants):
    client, vault = tenants
    got = client.get("/api/v1/experiments/r1/history?metrics=train_loss,mfu", headers=AUTH_A).json()
    expected = history(vault, "r1", ["train_loss"])  # what vault.history answers
    assert got["metrics"]["train_loss"]["x"] == expected.index.tolist()
    assert got["metrics"]["train_loss"]["y"] == expected["train_loss"].tolist()
    assert got["missing"] == ["mfu"]


def test_compare_puts_params_side_by_side_and_flags_differences(make_client):
    client, vault = make_client()
    for i, lr in enumerate((0.1, 0.2)):
        vault.experiments.create(
            f"e{i}", f'{{job="e{i}"}}', start=T0, end=T0 + 1000, params={"lr": lr, "seed": 1}
        )
    got = client.get("/api/v1/compare?ids=e0,e1").json()
    assert got["ids"] == ["e0", "e1"]
    params = {p["param"]: p for p in got["params"]}
    assert params["lr"]["differs"] and not params["seed"]["differs"]
    assert params["lr"]["values"] == {"e0": "0.1", "e1": "0.2"}
    assert got["curves"] == {"e0": None, "e1": None}  # no train_loss logged: no curve


@pytest.mark.parametrize(
    "query, ids",
    [
        ("", ["e2", "e1", "e0"]),  # newest first by default
        ("sort=id&order=asc", ["e0", "e1", "e2"]),
        ("q=E1", ["e1"]),  # case-insensitive search
        ("tag=odd", ["e1"]),
        ("owner=ann", ["e2", "e0"]),
        ("param=lr=0.2", ["e2"]),
        ("sort=id&order=asc&offset=1&limit=1", ["e1"]),
    ],
)
def test_the_table_filters_sorts_and_pages_on_the_server(make_client, query, ids):
    client, vault = make_client()
    for i in range(3):
        vault.experiments.create(
            f"e{i}", f'{{job="e{i}"}}', start=T0 + i, end=T0 + 1000,
            owner="ann" if i != 1 else "bob", tags=("odd",) if i % 2 else (),
            params={"lr": 0.1 * (i or 1)},
        )  # fmt: skip
    got = client.get(f"/api/v1/ui/experiments?{query}&summary=0").json()
    assert [r["id"] for r in got["rows"]] == ids


@pytest.mark.parametrize(
    "query, words",
    [
        ("sort=gpu_hours", "not a column the server sorts by"),
        ("order=up", "order='up' must be asc or desc"),
        ("limit=100000", "limit='100000' must be a whole number"),
        ("param=lr", "must be key=value"),
    ],
)
def test_bad_table_queries_are_400_in_words(make_client, query, words):
    client, _ = make_client()
    answer = client.get(f"/api/v1/ui/experiments?{query}")
    assert answer.status_code == 400 and words in answer.text


def test_bad_width_and_empty_compare_are_400(make_client):
    client, vault = make_client()
    vault.experiments.create("e0", '{job="e0"}', start=T0, end=T0 + 1000)
    assert client.get("/api/v1/experiments/e0/history?width=0").status_code == 400
    assert client.get("/api/v1/experiments/e0/history?width=x").status_code == 400
    assert "needs ids=" in client.get("/api/v1/compare").text


def test_data_is_escaped_in_the_pages(tenants):
    client, _ = tenants
    page = client.get("/ui/experiments/r1", headers=AUTH_A).text
    assert HOSTILE not in page and esc(HOSTILE) in page
    assert esc('"') == "&quot;" and esc("<a href='x'>") == "&lt;a href=&#x27;x&#x27;&gt;"


def test_vault_stats_show_storage_to_admins_and_only_own_series_to_tenants(tenants, make_client):
    client, _ = tenants
    a = client.get("/api/v1/vault/stats", headers=AUTH_A).json()
    assert a["tenant"] == "team-a" and "tiers" not in a
    assert {c["metric"]: c["series"] for c in a["cardinality"]} == {
        "train_step": 1,
        "train_loss": 1,
    }
    admin, vault = make_client()
    vault.experiments.create("e0", '{job="e0"}', start=T0, end=T0 + 1000)
    got = admin.get("/api/v1/vault/stats").json()
    assert set(got["tiers"]) >= {"raw", "1m", "1h"} and "lag_ms" in got["rollup"]


def test_downsampling_keeps_each_pixel_columns_extremes():
    x = np.arange(10_000, dtype=np.float64)
    y = np.sin(x / 500)
    y[1234] = 50.0  # a one-sample spike
    y[7777] = -50.0
    xs, ys = downsample(x, y, 100)
    assert len(xs) <= 200 and 50.0 in ys and -50.0 in ys
    assert np.all(np.diff(xs) > 0)
    short_x, _ = downsample(x[:10], y[:10], 100)
    assert short_x.tolist() == x[:10].tolist()


def test_ui_app_is_read_only(tmp_path):
    settings = Settings.load(env={}, gateway_maintain=False)
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    vault.experiments.create("e0", '{job="e0"}', start=T0, end=T0 + 1000)
    try:
        with TestClient(create_ui_app(vault, settings)) as client:
            assert client.get("/ui/experiments").status_code == 200
            assert client.get("/api/v1/experiments").json()[0]["id"] == "e0"
            assert (
                client.post("/api/v1/experiments", json={"id": "x", "selector": "m"}).status_code
                == 405
            )
            assert client.patch("/api/v1/experiments/e0", json={"notes": "x"}).status_code == 405
            assert client.post("/api/v1/write", content=b"").status_code == 404  # not mounted
            assert client.post("/write", content=b"m v=1").status_code in (404, 405)
        assert vault.experiments.ids() == ["e0"]
    finally:
        vault.close()


def test_query_range_says_which_rollup_tier_answered(make_client):
    """``servedBy`` beside ``data`` when rollup rows answered (Explore shows it); an answer
    from raw samples is left exactly as Prometheus writes it (no extra key)."""
    hour = 3_600_000
    t0 = T0 // (24 * hour) * 24 * hour
    client, vault = make_client()
    rows = [("gpu_util", {"gpu": "0"}, t0 + i * 5_000, float(i % 100)) for i in range(4320)]
    vault.write(rows)
    vault.maintain(now_ms=t0 + 8 * hour)  # every hour rolled up
    cases = [
        ("max_over_time(gpu_util[1h])", hour, ["1h"]),
        ("gpu_util", 5_000, None),  # finer than a minute: only raw samples answer
    ]
    for expr, step, tiers in cases:
        params = {"query": expr, "start": (t0 + 2 * hour) / 1000, "end": (t0 + 6 * hour) / 1000}
        for _ in range(2):  # computed, then from the results cache: the same answer
            answer = client.get("/api/v1/query_range", params={**params, "step": step / 1000})
            body = answer.json()
            assert answer.status_code == 200 and body["status"] == "success", answer.text
            assert body["data"]["result"], expr
            assert body.get("servedBy") == tiers, (expr, body.get("servedBy"))


@pytest.mark.parametrize("align", ["elapsed", "time"])
def test_compare_aligns_by_elapsed_or_wall_time_as_experiment_compare(tenants, align):
    from metricvault.archive.compare import curves

    client, vault = tenants
    got = client.get(f"/api/v1/compare?ids=r1&metric=train_loss&align={align}", headers=AUTH_A)
    assert got.status_code == 200, got.text
    body = got.json()
    want = curves(vault, ["r1"], "train_loss", align=align)
    if align == "time":
        xs = [round(t.timestamp() * 1000) / 1000 for t in want["x"]]
    else:
        xs = want["x"].tolist()
    assert body["align"] == align and body["x_label"]
    assert body["curves"]["r1"]["x"] == pytest.approx(xs)
    assert body["curves"]["r1"]["y"] == pytest.approx(want["value"].tolist())


@pytest.mark.parametrize(
    "path", ["/api/v1/compare?ids=r1&align=epoch", "/api/v1/experiments/r1/history?align=epoch"]
)
def test_an_unknown_alignment_is_400_in_words(tenants, path):
    client, _ = tenants
    answer = client.get(path, headers=AUTH_A)
    assert answer.status_code == 400 and "align='epoch' is not an alignment" in answer.text


def test_history_by_elapsed_time_is_the_experiment_compare_curve(tenants):
    from metricvault.archive.compare import curves

    client, vault = tenants
    got = client.get("/api/v1/experiments/r1/history?align=elapsed", headers=AUTH_A).json()
    want = curves(vault, ["r1"], "train_loss", align="elapsed")
    assert got["align"] == "elapsed" and "learning_rate" in got["missing"]
    assert got["metrics"]["train_loss"]["x"] == pytest.approx(want["x"].tolist())
    assert got["metrics"]["train_loss"]["y"] == pytest.approx(want["value"].tolist())


def test_gpu_curves_list_what_the_run_has_no_series_of(tenants):
    client, _ = tenants
    got = client.get("/api/v1/experiments/r1/gpus?width=100", headers=AUTH_A).json()
    assert got["metrics"] == {}  # r1 logged training metrics only
    assert got["missing"] == [
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
    ]  # fmt: skip


def test_vault_stats_show_retention_and_label_cardinality_within_the_tenant(make_client):
    from metricvault.config import RetentionOverride

    override = RetentionOverride('{job="keep"}', "raw", "forever")
    client, vault = make_client(
        auth_bearer_tokens=(BearerToken(hash_secret(TOKEN_A), "team-a"),
                            BearerToken(hash_secret("admin"), ""), ),
        retention_overrides=(override,),
    )  # fmt: skip
    lines = [f"m,job=j{i % 2},gpu={i} v=1 {T0 + i}" for i in range(6)]
    assert (
        client.post("/write?precision=ms", content="\n".join(lines), headers=AUTH_A).status_code
        == 204
    )
    vault.flush()
    admin = client.get("/api/v1/vault/stats", headers={"Authorization": "Bearer admin"}).json()
    assert admin["retention_overrides"] == [
        {"selector": '{job="keep"}', "tier": "raw", "retention": "forever"}
    ]
    got = client.get("/api/v1/vault/stats", headers=AUTH_A).json()
    assert "retention_overrides" not in got and got["retention"]["raw"] == "30d"
    labels = {r["label"]: (r["series"], r["values"]) for r in got["labels"]}
    assert labels["gpu"] == (6, 6) and labels["job"] == (6, 2)
    assert "tenant" not in labels  # the tenant's own label says nothing to the tenant
    assert {"label": "job", "value": "j0", "series": 3} in got["top_values"]
