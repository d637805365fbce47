"""bench/cold_queries.py's second vault (--rollup-group-rows) at a tiny size, so it cannot rot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import metricvault  # noqa: E402
from bench import cold_queries  # noqa: E402
from bench.datasets import Summary, simulated  # noqa: E402
from bench.queries import query_cases  # noqa: E402
from metricvault.store import files  # noqa: E402
from metricvault.store.vault import Vault  # noqa: E402


def _rollup_groups(path: Path) -> list[int]:
    """The row counts of every row group of the vault's 1m and 1h files."""
    with Vault.open_local(str(path)) as vault:
        snap = vault.snapshot()
        metas = [pq.ParquetFile(f.path).metadata for t in ("1m", "1h") for f in snap.tier_files(t)]
    return [m.row_group(g).num_rows for m in metas for g in range(m.num_row_groups)]


def test_the_second_vault_has_rollup_row_groups_of_the_rows_asked_and_the_writer_keeps_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = files.ROW_GROUP_ROWS[True]
    first, second = tmp_path / "first", tmp_path / "second"
    samples = cold_queries.build(Summary(simulated(1, 0.05)), first, None)
    assert cold_queries.build(Summary(simulated(1, 0.05)), second, None, 500) == samples
    assert files.ROW_GROUP_ROWS[True] == own
    assert max(_rollup_groups(second)) == 500
    assert max(_rollup_groups(first)) > 500
    cold_queries.report_files(first, second)
    report = capsys.readouterr().out
    assert "| first | 1m |" in report and "| second | 1h |" in report


def test_rollup_files_of_any_row_group_size_give_the_same_answers(tmp_path: Path) -> None:
    """Files written with 64 Ki-row rollup groups (before 0012) answer as smaller groups do."""
    summaries = [Summary(simulated(1, 0.1)) for _ in range(3)]
    paths = [tmp_path / str(rows) for rows in (65_536, 1000, 97)]
    for summary, path, rows in zip(summaries, paths, (65_536, 1000, 97), strict=True):
        cold_queries.build(summary, path, None, rows)
    summary = summaries[0]
    cases = [c for c in query_cases(summary) if c.key in ("Q1", "Q2")]
    calls: list[dict[str, Any]] = [cold_queries.vault_call(case, summary) for case in cases]
    window = [summary.probe_selector(), summary.min_ts + 90_000, summary.max_ts - 7]
    calls.append({"args": window, "kwargs": {"step": "5m", "aggs": ["mean", "max", "p99"]}})
    answers = []
    for path in paths:
        with metricvault.open(str(path), need="read") as vault:
            answers.append([vault.query(*c["args"], **c["kwargs"]) for c in calls])
    for other in answers[1:]:
        for mine, theirs in zip(answers[0], other, strict=True):
            assert len(mine) > 0
            pd.testing.assert_frame_equal(mine, theirs)


def test_the_rollup_group_rows_are_restored_when_the_write_fails() -> None:
    own = files.ROW_GROUP_ROWS[True]
    with pytest.raises(RuntimeError), cold_queries.rollup_group_rows(100):
        assert files.ROW_GROUP_ROWS[True] == 100
        raise RuntimeError("the write failed")
    assert files.ROW_GROUP_ROWS[True] == own
