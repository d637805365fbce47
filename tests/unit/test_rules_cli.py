"""`metricvault rules check|test` exit as promtool does, and `serve --rules` refuses an
invalid rule file before it listens, in promtool's words, creating nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_rules_unittest import RULES, TESTS

BAD = "groups:\n  - name: g\n    rules:\n      - alert: A\n"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("command", "file", "text", "status"),
    [
        ("check", "rules.yml", RULES, 0),
        ("check", "bad.yml", BAD, 1),
        ("test", "unit.yml", TESTS, 0),
        ("test", "unit.yml", TESTS.replace("value: 1", "value: 2"), 1),
    ],
)
def test_rules_commands_exit_as_promtool(
    tmp_path: Path, command: str, file: str, text: str, status: int
):
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / file).write_text(text)
    done = _cli("rules", command, file, cwd=tmp_path)
    assert done.returncode == status, done.stdout + done.stderr


def test_serve_refuses_an_invalid_rule_file_before_listening(tmp_path: Path):
    (tmp_path / "bad.yml").write_text(BAD)
    data = tmp_path / "vault"
    done = _cli("serve", "--data", str(data), "--rules", "bad.yml", "--listen", "127.0.0.1:1",
                cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0
    said = " ".join((done.stderr + done.stdout).split())  # the terminal may wrap it
    assert 'bad.yml: 0:0: group "g", rule 1, "A": field \'expr\' must be set in rule' in said
    assert not data.exists()
