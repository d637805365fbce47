"""The slowest documentation pages' commands, run as test_docs_commands.py runs the others (a
file of their own so that `make test`'s parallel workers share the pages out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_docs_commands import (
    FAST,
    PAGES,
    SLOW_PAGES,
    Workspace,
    demo_vault,
    run_page,
    workspace_factory,
    workspace_template,
)

pytestmark = pytest.mark.e2e

SLOW = [p for p in PAGES if p.name in SLOW_PAGES]
# the fixtures this file's test uses
__all__ = ["demo_vault", "workspace_factory", "workspace_template"]


@pytest.mark.parametrize("page", SLOW, ids=[p.name for p in SLOW])
def test_every_documented_command_runs(
    page: Path,
    tmp_path: Path,
    demo_vault: Path,
    request: pytest.FixtureRequest,
    workspace_factory: list[Workspace],
) -> None:
    run_page(page, tmp_path, demo_vault, request, workspace_factory)


def test_every_page_runs_from_exactly_one_file() -> None:
    assert sorted(p.name for p in SLOW) == sorted(SLOW_PAGES), "a slow page has no commands"
    assert sorted(FAST + SLOW) == sorted(PAGES)
