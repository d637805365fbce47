"""bench/cold_queries.py's second vault (--rollup-group-rows) at a tiny size, so it cannot rot."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import cold_queries  # noqa: E402
from bench.datasets import Summary, simulated  # noqa: E402
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


def test_the_rollup_group_rows_are_restored_when_the_write_fails() -> None:
    own = files.ROW_GROUP_ROWS[True]
    with pytest.raises(RuntimeError), cold_queries.rollup_group_rows(100):
        assert files.ROW_GROUP_ROWS[True] == 100
        raise RuntimeError("the write failed")
    assert files.ROW_GROUP_ROWS[True] == own
