"""bench/promql_engine.py at a tiny size, so it cannot rot: the table it prints, and a source
tree it cannot import refused rather than measured as the wrong code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import promql_engine  # noqa: E402


def test_each_query_gets_a_row_of_min_and_median_cpu_per_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    promql_engine.main(["--workdir", str(tmp_path), "--nodes", "1", "--days", "1",
                        "--rounds", "2", "--runs", "2", "--queries", "avg,energy"])  # fmt: skip
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert len(rows) == 2, out
    for row in rows:
        cells = re.findall(r"(\d+\.\d) / (\d+\.\d)", row)
        assert len(cells) == 2, row  # two rounds
        assert all(0 < float(low) <= float(mid) for low, mid in cells), row
    assert (tmp_path / "vault-1n-1d" / "END").exists()  # kept for the next run


def test_a_tree_the_child_does_not_import_from_is_refused(tmp_path: Path) -> None:
    vault = promql_engine.build(tmp_path, 1, 1)
    elsewhere = tmp_path / "not-a-source-tree"
    elsewhere.mkdir()
    with pytest.raises(RuntimeError, match="not metricvault from"):
        promql_engine.measure(elsewhere, vault, "DCGM_FI_DEV_GPU_UTIL", "1d", 1)


def test_the_cells_a_pass_asked_for_are_the_ones_the_child_ran(tmp_path: Path) -> None:
    vault = promql_engine.build(tmp_path, 1, 1)
    expr, src = "avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m])", REPO_ROOT / "src"
    got = promql_engine.measure(src, vault, expr, "1d", 1, 4096)
    assert got["min"] > 0


@pytest.mark.parametrize(
    ("part", "header"),
    [("json", "timing the JSON body"), ("api", "timing the query API request")],
)
def test_the_json_and_api_parts_time_each_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str, header: str
) -> None:
    """``--part json`` times each answer's JSON body, ``--part api`` a query_range request
    through the gateway's app: a row per query, in the order asked."""
    promql_engine.main(["--workdir", str(tmp_path), "--nodes", "1", "--days", "1",
                        "--rounds", "1", "--runs", "2", "--queries", "gpu,avg",
                        "--part", part])  # fmt: skip
    out = capsys.readouterr().out
    assert header in out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [
        'DCGM_FI_DEV_GPU_UTIL{Hostname="node01",gpu="0"}',
        "avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m])",
    ]
    assert all(re.search(r"\d+\.\d / \d+\.\d", row) for row in rows), out
