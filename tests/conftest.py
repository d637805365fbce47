"""Shared test setup: a vault's settings must come from the test, never from the environment."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

ENV_PREFIX = "METRICVAULT_"


@pytest.fixture(autouse=True, scope="session")
def _no_metricvault_env() -> Iterator[None]:
    """``Settings.load`` reads ``METRICVAULT_*``; a developer's shell must not change results.

    Session-scoped (not ``monkeypatch``) so hypothesis tests may use it without a health-check
    complaint about function-scoped fixtures.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    yield
    os.environ.update(saved)
