"""Issue 12: every file and directory name of a vault, its gateway and its maintenance is
defined once, in metricvault.store.layout, and used from there everywhere else."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

import metricvault
from metricvault.store import layout

SRC = Path(metricvault.__file__).parent
# Names distinctive enough that any string holding them is a file name written a second time
# (a whole name: ``metricvault.lock``, DVC's lock, is not ``vault.lock``).
_WHOLE = (
    layout.VAULT_LOCK,
    layout.MAINTAIN_LOCK,
    layout.WORKERS_LOCK,
    layout.GATEWAY_METRICS_DIR,
    layout.WORKER_BUFFER_PREFIX,
)
FILE_NAME_RE = re.compile(
    "|".join([*(rf"(?<![\w.-]){re.escape(n)}" for n in _WHOLE), re.escape(layout.BUFFER_SUFFIX)])
)
# Directory names too common as words to search for: caught where a path is built from them.
DIR_NAMES = {layout.CATALOG_DIR, layout.DATA_DIR, layout.SERIES_DIR, layout.EXPERIMENTS_DIR}
PATH_BUILDERS = {"path", "list_files"}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _spelled_outside_layout() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == Path(layout.__file__):
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        where = path.relative_to(SRC)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
            ) and (FILE_NAME_RE.search(node.value) or node.value == layout.QUARANTINE_DIR):
                found.append(f"{where}:{node.lineno} {node.value!r}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in PATH_BUILDERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in DIR_NAMES
            ):
                found.append(f"{where}:{node.lineno} {node.func.attr}({node.args[0].value!r})")
    return found


def test_vault_file_names_are_spelled_only_in_layout_py():
    assert _spelled_outside_layout() == []


def test_worker_buffer_names_round_trip_to_their_pid():
    name = layout.worker_buffer_name(os.getpid())
    assert name.startswith(layout.WORKER_BUFFER_PREFIX)
    assert layout.worker_pid(name) == os.getpid()


@pytest.mark.parametrize("name", [layout.BUFFER_NAME, "buffer-worker-", "buffer-worker-12x", "x-1"])
def test_other_buffer_names_have_no_worker_pid(name):
    assert layout.worker_pid(name) is None


def test_buffer_files_are_the_sqlite_files_of_the_state_dir(tmp_path):
    main = layout.buffer_file(tmp_path)
    worker = layout.buffer_file(tmp_path, layout.worker_buffer_name(7))
    for path in (main, worker, tmp_path / "notes.txt", tmp_path / f"{main.name}-wal"):
        path.write_text("")
    assert layout.buffer_files(tmp_path) == sorted([main, worker])
