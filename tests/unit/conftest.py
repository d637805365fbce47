"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from metricvault.config import Settings
from metricvault.server.app import create_app
from metricvault.store.vault import Vault


@pytest.fixture
def make_client(tmp_path):
    """``make(**settings)`` -> (an in-process gateway client, its vault); closed after the test."""
    clients: list[tuple[TestClient, Vault]] = []

    def make(**overrides):
        settings = Settings.load(env={}, **{"gateway_maintain": False, **overrides})
        vault = Vault.open_local(str(tmp_path / f"v{len(clients)}"), settings)
        client = TestClient(create_app(vault, settings))
        client.__enter__()
        clients.append((client, vault))
        return client, vault

    yield make
    for client, vault in clients:
        client.__exit__(None, None, None)
        vault.close()
