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
from metricvault.server.ui_common import downsample, esc
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


# --------------------------------------------------------------------------- archive state
def _git(repo, *args):
    import subprocess

    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _paper_repo(path):
    """A git repository with DVC and a local directory remote, as docs/archive.md sets one up."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    dvc = Path(sys.executable).with_name("dvc")
    if not dvc.exists():
        pytest.fail(f"{dvc} not found: install the test extras (pip install -e '.[test]')")
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "researcher@example.org")
    _git(path, "config", "user.name", "Researcher")
    (path / "README.md").write_text("paper\n")
    _git(path, "add", "README.md")
    _git(path, "commit", "-q", "-m", "paper")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    for args in (["init", "-q"], ["remote", "add", "-d", "store", str(path.parent / "remote")]):
        subprocess.run([str(dvc), *args], cwd=path, check=True, capture_output=True, env=env)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "dvc")
    return path


def test_the_archive_state_follows_an_export_through_dvc_to_its_tag(make_client, tmp_path):
    from metricvault.archive import dvc
    from metricvault.archive.repository import publish
    from metricvault.archive.snapshot_export import export_snapshot
    from metricvault.durations import now_ms

    repo = _paper_repo(tmp_path / "paper")
    out = repo / "artifacts" / "metrics"
    client, vault = make_client(
        auth_bearer_tokens=(
            BearerToken(hash_secret(TOKEN_A), "team-a"),
            BearerToken(hash_secret(TOKEN_B), "team-b"),
        ),
        archive_dir=str(out),
    )
    t0 = now_ms() - 3_600_000
    lines = "\n".join(f"train,job=r1 loss={10 - s} {t0 + s * 1000}" for s in range(10))
    assert client.post("/write?precision=ms", content=lines, headers=AUTH_A).status_code == 204
    body = {"id": "r1", "selector": '{job="r1"}', "start": t0, "end": t0 + 10_000}
    assert client.post("/api/v1/experiments", json=body, headers=AUTH_A).status_code == 201
    vault.flush()
    url = "/api/v1/experiments/r1/archive"

    state = client.get(url, headers=AUTH_A).json()
    assert state["state"] == "not archived" and not state["present"]
    assert state["export_command"] == "metricvault archive export r1"
    assert client.get(url, headers=AUTH_B).status_code == 404  # another tenant's experiment

    exp = vault.experiments.get("r1")
    info = export_snapshot(vault, exp.id, out)
    state = client.get(url, headers=AUTH_A).json()
    assert state["state"] == "exported" and state["present"] and state["pushed"] is None
    assert (state["rows"], state["content_hash"]) == (info.rows, info.content_hash)
    assert state["export_command"] == "metricvault archive export r1 --dvc"

    done = publish(info, repo)
    state = client.get(url, headers=AUTH_A).json()
    assert state["state"] == "archived" and state["pushed"] is True
    assert state["tag"] == "metrics/r1" == done.tag
    assert state["commit"] == _git(repo, "rev-parse", "metrics/r1^{commit}")
    assert state["md5"] == dvc.file_md5(out / "r1.parquet") == done.md5
    assert state["content_hash"] == info.content_hash and state["remote"] == "store"
    assert state["export_command"] == ""
    # the remote itself asked (dvc status --cloud): it holds the data
    assert client.get(url + "?check_remote=1", headers=AUTH_A).json()["pushed"] is True
    # the file deleted from the workspace: the tag's summary still says what was archived
    (out / "r1.parquet").unlink()
    state = client.get(url, headers=AUTH_A).json()
    assert state["state"] == "archived" and not state["present"]
    assert state["content_hash"] == info.content_hash and state["rows"] == info.rows
    assert "check_remote" in client.get(url + "?check_remote=yes", headers=AUTH_A).text


def test_the_experiment_page_has_an_archive_section(tenants):
    client, _ = tenants
    page = client.get("/ui/experiments/r1", headers=AUTH_A).text
    assert '<div id="archive" data-experiment="r1"' in page


# --------------------------------------------------------------------------- agents seen
def test_vault_stats_list_the_agents_seen_with_their_last_sample(make_client):
    from metricvault.durations import now_ms

    client, vault = make_client(
        auth_bearer_tokens=(
            BearerToken(hash_secret(TOKEN_A), "team-a"),
            BearerToken(hash_secret(TOKEN_B), "team-b"),
        )
    )
    now = now_ms()
    pushed = {"job": "metricvault-agent", "instance": "gpu-7:9400"}
    scraped = {"job": "metricvault-agent", "instance": "gpu-8:9400"}
    info = {"version": "1.0", "gpu_source": "nvml"}
    samples = [
        # a pushing edge agent, last seen 30 s ago; a scraped full agent, 2 hours ago
        *[("metricvault_agent_info", {**pushed, **info, "profile": "edge"}, now - s * 15_000 - 30_000, 1.0) for s in range(4)],  # noqa: E501
        ("metricvault_agent_push_info", {**pushed, "url": "http://gw:9201", "auth": "bearer"}, now - 30_000, 1.0),  # noqa: E501
        ("metricvault_agent_push_sent_requests_total", pushed, now - 45_000, 41.0),
        ("metricvault_agent_push_sent_requests_total", pushed, now - 30_000, 42.0),
        ("metricvault_agent_info", {**scraped, **info, "profile": "full"}, now - 7_200_000, 1.0),
    ]  # fmt: skip
    # team a's agents are written through the gateway (its tenant label set), team b's not
    for metric, labels, ts, value in samples:
        vault.write([(metric, {**labels, "tenant": "team-a"}, ts, value)])
    vault.write(
        [("metricvault_agent_info", {**scraped, "instance": "b:1", "tenant": "team-b"}, now, 1.0)]
    )
    vault.flush()
    agents = client.get("/api/v1/vault/stats", headers=AUTH_A).json()["agents"]
    assert [a["instance"] for a in agents] == ["gpu-7:9400", "gpu-8:9400"]  # newest first
    edge, full = agents
    assert edge["hostname"] == "gpu-7" and edge["profile"] == "edge" and edge["mode"] == "push"
    assert edge["last_ms"] == now - 30_000 and edge["sent_requests"] == 42
    assert edge["push_url"] == "http://gw:9201" and 25 < edge["age_s"] < 600
    assert full["mode"] == "scrape" and full["profile"] == "full"
    assert full["last_ms"] == now - 7_200_000 and full["sent_requests"] is None
    assert [
        a["instance"] for a in client.get("/api/v1/vault/stats", headers=AUTH_B).json()["agents"]
    ] == ["b:1"]


# --------------------------------------------------------------------------- alerts
def _rules_files(vault, alerts, incidents):
    import json
    import time
    from pathlib import Path

    state = Path(vault.state_dir)
    deadline = time.monotonic() + 30
    # the gateway's evaluator publishes its (empty) status once it holds the lease: wait for
    # that, so it cannot replace the files written here
    while not (state / "rules-status.json").exists():
        assert time.monotonic() < deadline, "the rule evaluator never published its status"
        time.sleep(0.05)
    groups = [
        {
            "name": "gpu",
            "file": "rules.yml",
            "rules": [
                {"name": "XidErrors", "type": "alerting", "health": "ok", "lastError": ""},
                {"name": "Broken", "type": "alerting", "health": "err", "lastError": "bad"},
            ],
        }
    ]
    (state / "rules-status.json").write_text(json.dumps({"groups": groups, "alerts": alerts}))
    (state / "rules-incidents.json").write_text(json.dumps({"incidents": incidents}))


def _alert(name, state="firing", **labels):
    return {
        "labels": {"alertname": name, **labels},
        "annotations": {},
        "state": state,
        "activeAt": "2026-01-01T00:00:00Z",
        "value": "1e+00",
    }


def test_alerts_are_grouped_under_their_root_cause(make_client):
    client, vault = make_client()
    alerts = [
        _alert("XidErrors", Hostname="node02", severity="critical"),
        _alert("GpuUtilLow", Hostname="node02", severity="warning"),
        _alert("DiskFilling", state="pending", Hostname="node09"),
    ]
    member = [dict(a["labels"]) for a in alerts[:2]]
    cause = {
        "alertname": "RootCause",
        "root_cause": "true",
        "incident": "node02",
        "cause": "gpu_fault",
        "severity": "critical",
        "Hostname": "node02",
    }
    incidents = [
        {
            "labels": cause,
            "annotations": {"description": "GPU fault on node02"},
            "opened_at_ms": T0,
            "members": member,
        }
    ]
    _rules_files(vault, alerts, incidents)
    got = client.get("/api/v1/ui/alerts").json()
    [incident] = got["incidents"]
    assert incident["incident"] == "node02" and incident["cause"] == "gpu_fault"
    assert incident["root_cause"]["labels"] == cause
    assert [a["labels"]["alertname"] for a in incident["evidence"]] == ["GpuUtilLow", "XidErrors"]
    assert all(a["labels"]["incident"] == "node02" for a in incident["evidence"])
    assert [a["labels"]["alertname"] for a in got["ungrouped"]] == ["DiskFilling"]
    health = {r["rule"]: (r["health"], r["last_error"]) for r in got["rules"]}
    assert health == {"XidErrors": ("ok", ""), "Broken": ("err", "bad")}


def test_alerts_already_labelled_with_their_incident_group_without_the_file():
    from metricvault.server.ui_data import group_alerts

    got = group_alerts(
        [
            _alert("RootCause", incident="job-x", root_cause="true", cause="hang"),
            _alert("NoProgress", incident="job-x", severity="warning"),
            _alert("Loose"),
        ]
    )
    assert got["incidents"][0]["root_cause"]["labels"]["cause"] == "hang"
    assert [a["labels"]["alertname"] for a in got["incidents"][0]["evidence"]] == ["NoProgress"]
    assert [a["labels"]["alertname"] for a in got["ungrouped"]] == ["Loose"]


def test_another_tenant_sees_neither_the_rules_nor_their_alerts(make_client):
    client, vault = make_client(
        auth_bearer_tokens=(
            BearerToken(hash_secret(TOKEN_A), "team-a"),
            BearerToken(hash_secret(TOKEN_B), "team-b"),
        ),
        rules_tenant="team-a",
    )
    _rules_files(vault, [_alert("XidErrors", Hostname="n1")], [])
    a = client.get("/api/v1/ui/alerts", headers=AUTH_A).json()
    b = client.get("/api/v1/ui/alerts", headers=AUTH_B).json()
    assert len(a["ungrouped"]) == 1 and len(a["rules"]) == 2
    assert b["ungrouped"] == [] and b["rules"] == [] and b["incidents"] == []


# --------------------------------------------------------------------------- anomalies
def test_anomalies_come_with_their_source_series_and_baseline(make_client):
    from metricvault.durations import now_ms

    client, vault = make_client()
    now = now_ms() // 60_000 * 60_000
    gpu = {"Hostname": "node01", "gpu": "0"}
    samples = []
    for i in range(60):
        ts = now - (60 - i) * 60_000
        temp = 60.0 + (30.0 if i == 40 else 0.0)
        samples.append(("DCGM_FI_DEV_GPU_TEMP", gpu, ts, temp))
        score = 0.95 if i == 40 else 0.1
        score_labels = {**gpu, "source_metric": "DCGM_FI_DEV_GPU_TEMP", "detector": "novelty"}
        samples.append(("metricvault_anomaly_score", score_labels, ts, score))
        other = {"Hostname": "node02", "gpu": "1", "source_metric": "DCGM_FI_DEV_GPU_TEMP"}
        samples.append(("metricvault_anomaly_score", {**other, "detector": "novelty"}, ts, 0.2))
    for stat, value in (("mean", 60.5), ("p95", 61.0), ("p99", 62.0)):
        labels = {**gpu, "source_metric": "DCGM_FI_DEV_GPU_TEMP", "stat": stat}
        samples.append(("metricvault_baseline", labels, now - 3_600_000, value))
    # a --by baseline of the whole model: less specific, not chosen over the GPU's own
    samples.append(
        ("metricvault_baseline", {"source_metric": "DCGM_FI_DEV_GPU_TEMP", "stat": "mean"}, now - 3_600_000, 1.0)  # noqa: E501
    )  # fmt: skip
    vault.write(samples)
    vault.flush()
    got = client.get(f"/api/v1/ui/anomalies?range=6h&end={now // 1000}").json()
    assert got["series"] == 2 and got["range"] == "6h"
    first, second = got["top"]
    assert first["labels"]["Hostname"] == "node01" and first["max_score"] == 0.95
    assert second["max_score"] == 0.2
    assert first["baseline"] == {"mean": 60.5, "p95": 61.0, "p99": 62.0}
    assert max(first["source"]["y"]) == 90.0 and len(first["source"]["x"]) == 60
    assert first["score"]["x"] == first["source"]["x"]
    assert second["source"] is None and second["baseline"] == {"mean": 1.0}
    assert "range" in client.get("/api/v1/ui/anomalies?range=2d").text


def test_the_alerts_page_has_a_range_picker_for_anomalies(make_client):
    client, _ = make_client()
    page = client.get("/ui/alerts").text
    assert '<select id="anomaly-range"' in page and '<option value="7d">' in page


# --------------------------------------------------------------------------- login
def _login_form(client):
    import re

    page = client.get("/ui/login")
    assert page.status_code == 200
    found = re.search(r'name="login_nonce" value="([^"]+)"', page.text)
    assert found is not None, "the login form carries its nonce"
    return found.group(1)


def test_a_page_without_credentials_answers_the_login_form(tenants):
    client, _ = tenants
    page = client.get("/ui/vault?x=1", follow_redirects=False)
    assert page.status_code == 401 and 'action="/ui/session"' in page.text
    assert "Basic" not in page.headers["www-authenticate"]  # no browser dialog over the form
    assert 'name="next" value="/ui/vault?x=1"' in page.text
    # the JSON endpoints stay 401 in words; a wrong header stays the gateway's answer
    assert client.get("/api/v1/vault/stats").status_code == 401
    wrong = client.get("/ui/vault", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "unknown bearer token" in wrong.text


def test_logging_in_sets_a_session_cookie_scoped_to_the_tenant(tenants):
    client, _ = tenants
    nonce = _login_form(client)
    form = {"token": TOKEN_A, "login_nonce": nonce, "next": "/ui/vault"}
    answer = client.post("/ui/session", data=form, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/vault"
    cookies = answer.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith("mv_session="))
    assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
    csrf = next(c for c in cookies if c.startswith("mv_csrf="))
    assert "HttpOnly" not in csrf and "SameSite=strict" in csrf
    assert TOKEN_A not in session and hash_secret(TOKEN_A) not in session  # nothing secret
    # the cookie alone reaches the pages and the JSON, as team a
    assert client.get("/ui/vault").status_code == 200
    rows = client.get("/api/v1/ui/experiments").json()["rows"]
    assert [r["id"] for r in rows] == ["r1"]
    assert client.get("/api/v1/vault/stats").json()["tenant"] == "team-a"
    assert client.get("/api/v1/experiments/r2/history").status_code == 404
    # a header still wins over the cookie: API clients unchanged
    assert client.get("/api/v1/vault/stats", headers=AUTH_B).json()["tenant"] == "team-b"


def test_basic_users_log_in_with_user_and_password(make_client):
    from metricvault.config import BasicUser

    client, _ = make_client(auth_basic_users=(BasicUser("ann", hash_secret("pw-1"), "team-a"),))
    nonce = _login_form(client)
    bad = client.post("/ui/session", data={"user": "ann", "password": "x", "login_nonce": nonce})
    assert bad.status_code == 401 and "wrong password" in bad.text
    nonce = _login_form(client)
    ok = client.post("/ui/session", data={"user": "ann", "password": "pw-1", "login_nonce": nonce})
    assert ok.status_code == 200 and ok.url.path == "/ui/experiments"
    assert client.get("/api/v1/vault/stats").json()["tenant"] == "team-a"


def test_a_login_posted_without_the_forms_nonce_is_refused(tenants):
    client, _ = tenants
    _login_form(client)
    answer = client.post("/ui/session", data={"token": TOKEN_A, "login_nonce": "forged"})
    assert answer.status_code == 403 and "mv_session" not in answer.headers.get("set-cookie", "")
    assert client.get("/api/v1/vault/stats").status_code == 401


def test_writes_by_cookie_need_the_csrf_token_and_logout_ends_the_session(tenants):
    client, _ = tenants
    nonce = _login_form(client)
    client.post("/ui/session", data={"token": TOKEN_A, "login_nonce": nonce})
    body = {"id": "by-cookie", "selector": '{job="x"}', "start": T0, "end": T0 + 1000}
    refused = client.post("/api/v1/experiments", json=body)
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.text
    token = client.cookies["mv_csrf"]
    assert (
        client.post("/api/v1/experiments", json=body, headers={"X-CSRF-Token": "x"}).status_code
        == 403
    )
    made = client.post("/api/v1/experiments", json=body, headers={"X-CSRF-Token": token})
    assert made.status_code == 201 and made.json()["tenant"] == "team-a"
    assert client.post("/ui/logout").status_code == 403  # logging out is a write too
    out = client.post("/ui/logout", headers={"X-CSRF-Token": token}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert "mv_session" not in client.cookies
    assert client.get("/api/v1/vault/stats").status_code == 401


def test_a_forged_expired_or_revoked_session_is_refused(tenants, make_client):
    from metricvault.server.auth import SESSION_TTL_S, Sessions

    client, vault = tenants
    settings = client.app.state.gateway.settings
    sessions = Sessions(settings, vault.state_dir)
    cookie, _ = sessions.login(token=TOKEN_A)
    assert sessions.verify(cookie).tenant == "team-a"
    for bad in (cookie[:-2] + "xx", "e30." + cookie.partition(".")[2], "garbage"):
        client.cookies.set("mv_session", bad)
        assert client.get("/api/v1/vault/stats").status_code == 401, bad
    client.cookies.clear()
    later = Sessions(settings, vault.state_dir, now=lambda: 10**10)
    assert later.key == sessions.key  # one key for every worker, from the state dir
    with pytest.raises(Exception, match="expired"):
        later.verify(cookie)
    assert SESSION_TTL_S <= 24 * 3600
    # the same cookie on a gateway whose config no longer has that token
    other, _ = make_client(auth_bearer_tokens=(BearerToken(hash_secret(TOKEN_B), "team-b"),))
    revoked = Sessions(other.app.state.gateway.settings, vault.state_dir)
    with pytest.raises(Exception, match="no longer configured"):
        revoked.verify(cookie)


def test_the_read_only_ui_logs_in_too(tmp_path):
    settings = Settings.load(
        env={}, gateway_maintain=False, auth_bearer_tokens=(BearerToken(hash_secret(TOKEN_A), ""),)
    )
    vault = Vault.open_local(str(tmp_path / "v"), settings)
    try:
        with TestClient(create_ui_app(vault, settings)) as client:
            nonce = _login_form(client)
            answer = client.post("/ui/session", data={"token": TOKEN_A, "login_nonce": nonce})
            assert answer.status_code == 200 and answer.url.path == "/ui/experiments"
            assert client.post("/api/v1/experiments", json={}).status_code == 405
    finally:
        vault.close()


def test_login_goes_back_only_to_a_page_of_this_server():
    from metricvault.server.ui_login import safe_next

    assert safe_next("/ui/vault?x=1") == "/ui/vault?x=1"
    for bad in ("https://evil.example/", "//evil.example/", "/\\evil", "ui/vault", "", None):
        assert safe_next(bad) == "/ui/experiments", bad


def test_the_alert_delivery_publishes_its_incidents_for_the_alerts_page(make_client):
    """The converger's incidents, as the alert delivery writes them after a round, group
    the evaluator's alerts on the page's JSON (the file is the only link between them)."""
    from metricvault.rules.convergence import FiringAlert
    from metricvault.server.alert_delivery import Delivery

    client, vault = make_client(alertmanagers=("http://127.0.0.1:9/",))
    delivery = Delivery(client.app.state.gateway)
    alerts = [
        _alert("XidErrors", Hostname="node02", severity="critical"),
        _alert("GpuUtilLow", Hostname="node02", severity="warning"),
    ]
    firing = [FiringAlert(a["labels"], {}, T0 + i * 1000) for i, a in enumerate(alerts)]
    _rules_files(vault, alerts, [])  # the evaluator's status: the alerts without incident
    delivery.converger.round(T0 + 60_000, firing)
    delivery._publish_incidents()
    got = client.get("/api/v1/ui/alerts").json()
    [incident] = got["incidents"]
    assert incident["root_cause"]["labels"]["root_cause"] == "true"
    assert incident["root_cause"]["labels"]["Hostname"] == "node02"
    assert sorted(a["labels"]["alertname"] for a in incident["evidence"]) == [
        "GpuUtilLow",
        "XidErrors",
    ]
    assert got["ungrouped"] == []


def test_alerts_evaluated_by_the_gateway_show_under_the_incident_it_formed(make_client, tmp_path):
    """The whole path in one gateway: its evaluator fires two alerts about one node, the
    alert delivery converges them into an incident (Alertmanager unreachable: it retries),
    and the page's JSON shows them under their RootCause."""
    import time

    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n  - name: node\n    interval: 1s\n    rules:\n"
        "      - alert: XidErrors\n        expr: vector(1)\n"
        "        labels: {Hostname: node02, severity: critical}\n"
        "      - alert: GpuUtilLow\n        expr: vector(1)\n"
        "        labels: {Hostname: node02, severity: warning}\n"
    )
    client, _ = make_client(rules_files=(str(rules),), alertmanagers=("http://127.0.0.1:9/",))
    deadline = time.monotonic() + 60
    while True:
        got = client.get("/api/v1/ui/alerts").json()
        if got["incidents"] and got["incidents"][0]["root_cause"]:
            break
        assert time.monotonic() < deadline, f"no incident formed: {got}"
        time.sleep(0.1)
    [incident] = got["incidents"]
    assert incident["incident"] == "node02"
    assert incident["root_cause"]["labels"]["alertname"] == "RootCause"
    assert sorted(a["labels"]["alertname"] for a in incident["evidence"]) == [
        "GpuUtilLow",
        "XidErrors",
    ]
    assert {r["rule"]: r["health"] for r in got["rules"]} == {"XidErrors": "ok", "GpuUtilLow": "ok"}


def _downsample_per_column(x, y, width):
    """The reference: a loop over the pixel columns, each column's first minimum and first
    maximum in x order."""
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size <= 2 * width:
        return x, y
    column = np.minimum(((x - x[0]) / (x[-1] - x[0]) * width).astype(np.int64), width - 1)
    chosen: list[int] = []
    for c in np.unique(column):
        where = np.flatnonzero(column == c)
        lo, hi = where[np.argmin(y[where])], where[np.argmax(y[where])]
        chosen.extend(sorted({int(lo), int(hi)}))
    return x[chosen], y[chosen]


def test_downsampling_picks_what_a_loop_over_the_columns_picks():
    rng = np.random.default_rng(7)
    for trial in range(200):
        n, width = int(rng.integers(1, 3000)), int(rng.integers(1, 400))
        x = np.sort(rng.choice(50_000, n, replace=False)).astype(np.float64)
        # ties (small integers) in every other trial: the first extreme must be the one kept
        y = rng.integers(0, 4, n).astype(np.float64) if trial % 2 else rng.normal(size=n)
        y[rng.random(n) < 0.1] = np.nan
        want, got = _downsample_per_column(x, y, width), downsample(x, y, width)
        assert got[0].tolist() == want[0].tolist(), trial
        assert got[1].tolist() == want[1].tolist(), trial


def test_static_files_carry_an_etag_and_versioned_urls_are_kept_for_good(tenants):
    import re

    client, _ = tenants
    page = client.get("/ui/experiments", headers=AUTH_A).text
    found = re.search(r'src="(/ui/static/ui\.js\?v=[0-9a-f]+)"', page)
    assert found, page
    url = found.group(1)
    first = client.get(url, headers=AUTH_A)
    assert first.status_code == 200 and "immutable" in first.headers["cache-control"]
    etag = first.headers["etag"]
    plain = client.get("/ui/static/ui.js", headers=AUTH_A)
    assert plain.headers["cache-control"] == "no-cache" and plain.headers["etag"] == etag
    again = client.get("/ui/static/ui.js", headers={**AUTH_A, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    stale = client.get("/ui/static/ui.js?v=0", headers={**AUTH_A, "If-None-Match": '"0"'})
    assert stale.status_code == 200 and stale.headers["cache-control"] == "no-cache"
    assert stale.content == first.content


def test_vault_stats_can_answer_the_raw_horizon_alone(tenants):
    client, _ = tenants
    full = client.get("/api/v1/vault/stats", headers=AUTH_A).json()
    only = client.get("/api/v1/vault/stats?only=raw_horizon", headers=AUTH_A).json()
    assert only == {"raw_horizon": full["raw_horizon"]}


def test_compare_answers_its_curves_and_its_summaries_apart_as_the_page_asks(tenants):
    client, _ = tenants
    url = "/api/v1/compare?ids=r1&metric=loss"
    whole = client.get(url, headers=AUTH_A).json()
    curves = client.get(url + "&summaries=0", headers=AUTH_A).json()
    summaries = client.get(url + "&curves=0", headers=AUTH_A).json()
    assert curves["summaries"] is None and summaries["curves"] is None
    assert curves["curves"] == whole["curves"] and summaries["summaries"] == whole["summaries"]
    assert curves["params"] == summaries["params"] == whole["params"]


def test_pages_declare_no_icon_so_the_browser_asks_for_none(tmp_path):
    """An empty data: icon, so no /favicon.ico request waits beside a page's data."""
    settings = Settings.load(env={}, gateway_maintain=False)
    with (
        Vault.open_local(str(tmp_path / "v"), settings) as vault,
        TestClient(create_ui_app(vault, settings)) as client,
    ):
        for page in ("experiments", "compare", "explore", "alerts", "vault"):
            html = client.get(f"/ui/{page}").text
            assert '<link rel="icon" href="data:,">' in html, page
        assert '<link rel="icon" href="data:,">' in client.get("/ui/login").text


def test_pages_carry_their_stylesheets_so_the_first_paint_waits_for_no_other_request(tmp_path):
    from metricvault.server.ui_common import STATIC_DIR

    settings = Settings.load(env={}, gateway_maintain=False)
    with (
        Vault.open_local(str(tmp_path / "v"), settings) as vault,
        TestClient(create_ui_app(vault, settings)) as client,
    ):
        html = client.get("/ui/experiments").text
        for sheet in ("ui.css", "vendor/uplot/uPlot.min.css"):
            assert f"<style>{(STATIC_DIR / sheet).read_text()}</style>" in html
        assert 'rel="stylesheet"' not in html
