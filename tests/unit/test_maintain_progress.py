"""Issue 12: maintenance reports progress through a callback, so the store imports no terminal
library; the CLI, the demo and ``vault.maintain(progress=True)`` draw it with rich."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

from metricvault import Vault
from metricvault.store import maintenance

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
D = 86_400_000


def _two_days(vault: Vault) -> None:
    """Two days of a gauge, written in three flushes: files to compact and hours to roll up."""
    for part in range(3):
        vault.write(
            [
                ("gpu_util", {"gpu": "0"}, T0 + part * D // 2 + i * 60_000, float(i))
                for i in range(60)
            ]
        )
        vault.flush()


def test_importing_the_store_imports_no_terminal_library():
    code = (
        "import sys, metricvault.store.maintenance, metricvault.store.vault\n"
        "loaded = sorted(m for m in sys.modules if m == 'rich' or m.startswith(('rich.', "
        "'metricvault.cli')))\n"
        "print(','.join(loaded))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_maintain_reports_each_step_to_a_callback(tmp_path):
    calls: dict[str, list[tuple[int, int]]] = defaultdict(list)
    with Vault.open_local(str(tmp_path / "v")) as vault:
        _two_days(vault)
        report = maintenance.maintain(
            vault, T0 + 3 * D, progress=lambda step, done, total: calls[step].append((done, total))
        )
    assert report["compacted_partitions"] >= 1 and report["rolled_up_hours"] >= 1
    assert {"compacting", "rolling up"} <= set(calls)
    for step, seen in calls.items():
        total = seen[0][1]
        assert seen == [(i, total) for i in range(total + 1)], step  # 0, 1, ..., total


def test_vault_maintain_takes_a_callback_or_true(tmp_path, capsys):
    steps: list[str] = []
    with Vault.open_local(str(tmp_path / "a")) as vault:
        _two_days(vault)
        with_callback = vault.maintain(T0 + 3 * D, progress=lambda s, d, t: steps.append(s))
    with Vault.open_local(str(tmp_path / "b")) as vault:
        _two_days(vault)
        with_bar = vault.maintain(T0 + 3 * D, progress=True)  # rich, as before issue 12
    assert "rolling up" in steps
    assert {k: v for k, v in with_bar.items()} == with_callback
