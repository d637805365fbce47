"""bench/json_pieces.py at its tiny size, so it cannot rot: both tables, every way timed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import json_pieces  # noqa: E402


def test_each_way_gets_a_timed_row_beside_its_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    json_pieces.main(["--quick"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (.+?) \| (\d+\.\d{3}) \| (\d+\.\d{2}) \|$", out, re.MULTILINE)
    assert [name for name, _, _ in rows] == [
        "a + big + b", "f-string", '"".join',
        "np.unique(return_inverse=True)", "pyarrow dictionary_encode",
    ]  # fmt: skip
    assert rows[0][2] == "1.00" and rows[3][2] == "1.00"  # each table's baseline
