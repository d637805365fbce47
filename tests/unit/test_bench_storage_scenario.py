"""bench/storage.py --scenario seed-6-months at a tiny size, so the benchmark cannot rot."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import storage  # noqa: E402


def test_the_scenario_scales_each_tier_per_series_and_day_to_the_days_it_keeps() -> None:
    run = storage.ScenarioRun(nodes=1, gpus=8, days=2.0, first_day="2026-01-01", series=100)
    run.samples = 1000
    run.tier_bytes = {"raw": 2_000_000, "1m": 1_000_000, "1h": 40_000}
    run.tier_rows = {"raw": 1000, "1m": 100, "1h": 2}
    # 2 MB over 100 series and 2 days is 10 kB per series-day: x 1,500 series x 30 days
    assert run.scaled(run.tier_bytes["raw"], 30) == pytest.approx(10_000 * 1500 * 30)
    report = storage.scenario_report(run, "bench/storage.py --scenario seed-6-months")
    total = (10_000 * 30 + 5_000 * 182 + 200 * 182) * 1500 / 1e9
    assert f"**{total:.2f}**" in report
    assert f"total {total:.2f} GB vs target 3 GB: **PASS**; with the rollups in format 1" in report
    assert "VictoriaMetrics: not measured" in report
    run.vm_data_bytes, run.vm_total_bytes = 2_500_000, 3_000_000
    report = storage.scenario_report(run, "bench/storage.py --scenario seed-6-months")
    assert "metricvault raw / VictoriaMetrics: 0.800 (target <= 0.9: **PASS**)" in report


def test_a_tiny_scenario_run_measures_every_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scenario.md"
    argv = ["--scenario", "seed-6-months", "--nodes", "1", "--gpus-per-node", "1", "--days",
            "0.1", "--no-vm", "--workdir", str(tmp_path), "--markdown", str(out)]  # fmt: skip
    assert storage.main(argv) == 0
    report = out.read_text()
    for tier in ("raw", "1m", "1h"):
        row = re.search(rf"^\| {tier} \| ([\d,]+) \| ([\d,]+) \|", report, re.M)
        assert row is not None, report
        assert int(row.group(2).replace(",", "")) > 0, tier
    assert "VictoriaMetrics skipped (--no-vm)" in report
    assert re.search(r"total [\d.]+ GB vs target 3 GB", report)
