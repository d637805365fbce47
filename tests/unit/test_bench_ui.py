"""bench/ui.py's vault builder and report at a tiny size, so the benchmark cannot rot (the
browser part runs only in the benchmark itself)."""

from __future__ import annotations

import sys
from pathlib import Path

from starlette.testclient import TestClient

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import ui as bench_ui  # noqa: E402
from metricvault.config import Settings  # noqa: E402
from metricvault.server.app import create_app  # noqa: E402
from metricvault.store.vault import Vault  # noqa: E402

END_MS = 1_767_225_600_000 + 40 * 86_400_000  # a whole hour


def test_records_are_deterministic_distinct_and_end_before_the_data_does() -> None:
    recs = bench_ui.records(300, curve_runs=20, steps=100, end_ms=END_MS)
    assert recs == bench_ui.records(300, curve_runs=20, steps=100, end_ms=END_MS)
    assert len({r.id for r in recs}) == 300
    assert [r.curves for r in recs] == [False] * 280 + [True] * 20  # the newest have curves
    assert all(r.start_ms < r.end_ms < END_MS for r in recs)
    assert [r.start_ms for r in recs] == sorted(r.start_ms for r in recs)


def test_built_vault_lists_every_experiment_through_the_ui_api(tmp_path: Path) -> None:
    built = bench_ui.build_vault(tmp_path / "vault", 200, curve_runs=3, steps=40, end_ms=END_MS)
    assert len(built.ids) == 200 and len(built.curve_ids) == 3 and built.job_ids == []
    settings = Settings.load(env={}, gateway_maintain=False, retention_raw="forever")
    with (
        Vault.open_local(str(built.path), settings) as vault,
        TestClient(create_app(vault, settings)) as client,
    ):
        table = client.get("/api/v1/ui/experiments", params={"limit": 5}).json()
        assert table["total"] == 200
        assert [r["id"] for r in table["rows"]][:3] == built.curve_ids[::-1]  # newest first
        assert table["rows"][0]["final_loss"] is not None  # its curves are in the vault
        found = client.get("/api/v1/ui/experiments", params={"q": built.ids[7]}).json()
        assert [r["id"] for r in found["rows"]] == [built.ids[7]]
        curves = client.get(f"/api/v1/experiments/{built.curve_ids[0]}/history").json()
        assert curves["missing"] == []
        assert {n: m["points"] for n, m in curves["metrics"].items()} == dict.fromkeys(
            bench_ui.CURVE_METRICS, 40
        )


def test_report_marks_a_missed_target_and_prints_the_load() -> None:
    rows = [
        bench_ui.Row(
            "metricvault", "fast", [{"fcp": 80.0, "total": 120.0}] * 3, limit=300.0, key="fcp"
        ),
        bench_ui.Row("metricvault", "slow", [{"total": 900.0}, {"total": 1200.0}], limit=1000.0),
    ]
    text = bench_ui.report(rows, (3.5, 4.0))
    assert "load average 3.5 at start, 4.0 at the end" in text
    fast, slow = (line for line in text.splitlines() if line.startswith("| metricvault"))
    assert fast.endswith("| PASS |") and "| 80 / 80 |" in fast
    assert slow.endswith("| MISS |") and "| 900 / 1,200 |" in slow
    assert "- metricvault, slow: 900, 1,200" in text  # every run, not only first and median
    assert "- metricvault, fast: 80, 80, 80" in text
    assert "first paint of every page load: 3 loads, at most 80, 0 over 300" in text
