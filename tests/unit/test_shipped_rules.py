"""The shipped rule files (deploy/rules/*.yml): Debian's promtool accepts each, every alert has
a unit-test file whose data fires it, each test file passes ``promtool test rules``, and a
mutated expectation fails it (the tests test something). ``metricvault rules test`` runs the
same files once the evaluator provides it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "rules"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*_test.yml"))
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus) is installed by make test"
)


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_rule_file_has_a_test_file() -> None:
    assert RULE_FILES, "no shipped rule files"
    tested = {
        (path.parent / name).resolve() for path in TEST_FILES for name in _load(path)["rule_files"]
    }
    assert {path.resolve() for path in RULE_FILES} == tested


def test_every_alert_has_test_data_that_fires_it() -> None:
    alerts = {
        rule["alert"]
        for path in RULE_FILES
        for group in _load(path)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fired = {
        case["alertname"]
        for path in TEST_FILES
        for test in _load(path)["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    # GpuAgentsAbsent, like every other alert, is in fired; nothing may be left untested
    assert alerts - fired == set()


@needs_promtool
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_accepts_the_rule_file(path: Path) -> None:
    result = _promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_passes_the_unit_tests(path: Path) -> None:
    result = _promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def _mutated(path: Path, tmp_path: Path) -> Path:
    """The test file with its first expected alert's severity changed, rule paths absolute."""
    doc = _load(path)
    doc["rule_files"] = [str((path.parent / name).resolve()) for name in doc["rule_files"]]
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                case["exp_alerts"][0]["exp_labels"]["severity"] = "mutated"
                out = tmp_path / path.name
                out.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
                return out
    raise AssertionError(f"{path} expects no alert at all")


@needs_promtool
@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_a_mutated_expectation_fails_promtool(path: Path, tmp_path: Path) -> None:
    result = _promtool("test", "rules", _mutated(path, tmp_path))
    assert result.returncode != 0
    assert 'severity="mutated"' in result.stdout + result.stderr


def _metricvault_rules_test(*files: Path) -> subprocess.CompletedProcess[str]:
    """``metricvault rules test FILE...`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "metricvault.cli", "rules", "test", *map(str, files)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_metricvault_rules_test_passes_every_shipped_unit_test_file() -> None:
    result = _metricvault_rules_test(*TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def mutated_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """One ``metricvault rules test`` of every mutated file (a process start each costs more
    than most files' evaluation), its report split per file: each file's failures follow its
    ``Unit Testing:`` line (stdout and stderr, unbuffered, in one stream)."""
    tmp = tmp_path_factory.mktemp("mutated")
    files = [_mutated(path, tmp) for path in TEST_FILES]
    result = subprocess.run(
        [sys.executable, "-m", "metricvault.cli", "rules", "test", *map(str, files)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    parts = re.split(r"^Unit Testing:\s+(\S+)$", result.stdout, flags=re.M)
    sections = {Path(name).name: text for name, text in zip(parts[1::2], parts[2::2], strict=True)}
    return result, sections


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_metricvault_rules_test_fails_a_mutated_expectation(
    path: Path, mutated_run: tuple[subprocess.CompletedProcess[str], dict[str, str]]
) -> None:
    result, sections = mutated_run
    assert result.returncode != 0, result.stdout
    assert path.name in sections, result.stdout
    assert "SUCCESS" not in sections[path.name], sections[path.name]
    assert 'severity="mutated"' in sections[path.name], result.stdout
