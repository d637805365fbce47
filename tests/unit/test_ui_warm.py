"""The UI's warm-up before the server listens reads a small series index whole, so that no
page's first query reads it, and leaves a large one to be read by parts as queries ask."""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.server import ui_api
from metricvault.server.app import create_ui_app
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000


def _vault(path: Path) -> None:
    with Vault.open_local(str(path)) as vault:
        vault.write([(f"m{i}", {"k": str(i)}, T0, float(i)) for i in range(20)])
        vault.flush()


@pytest.mark.parametrize("limit, loaded", [(50_000, True), (0, False)], ids=["small", "large"])
def test_warm_up_reads_a_small_series_index_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int, loaded: bool
) -> None:
    _vault(tmp_path / "v")
    monkeypatch.setattr(ui_api, "WARM_SERIES_ROWS", limit)
    settings = Settings.load(env={}, gateway_maintain=False)
    with Vault.open_local(str(tmp_path / "v")) as vault:
        assert not vault.index.fully_loaded()  # an opened vault reads its index by parts
        create_ui_app(vault, settings)
        assert vault.index.fully_loaded() is loaded
        assert len(vault.series(None)) == 20  # and answers the same either way


def test_freeze_startup_heap_leaves_the_live_objects_out_of_later_collections() -> None:
    import gc

    from metricvault.server.ui_common import freeze_startup_heap

    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 1000  # at least the modules' objects
    finally:
        gc.unfreeze()  # the other tests of this process collect as before


def test_metricvault_ui_freezes_its_heap_before_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    import uvicorn
    from typer.testing import CliRunner

    from metricvault.cli.main import app

    _vault(tmp_path / "v")
    frozen: list[int] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: frozen.append(gc.get_freeze_count()))
    try:
        got = CliRunner().invoke(app, ["ui", "--data", str(tmp_path / "v")])
    finally:
        gc.unfreeze()
    assert got.exit_code == 0, got.output
    assert frozen and frozen[0] > 1000
