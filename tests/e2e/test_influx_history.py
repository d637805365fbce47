"""``history`` on the InfluxDB backend answers like the embedded store (real influxd)."""

# ruff: noqa: F811  (the fixtures imported from influx_fixture are parameters here)
from __future__ import annotations

import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from metricvault.config import Settings
from metricvault.public import Vault
from metricvault.public_influx import InfluxVault
from metricvault.store.backends.influxdb import setup

from .influx_fixture import InfluxServer, influxd  # noqa: F401

pytestmark = pytest.mark.e2e


def _samples(t0: int) -> list[tuple[str, dict[str, str], int, float]]:
    r0, r1 = {"experiment": "ranks", "rank": "0"}, {"experiment": "ranks", "rank": "1"}
    return [
        ("train_step", r0, t0 + 1000, 0.0),
        ("train_step", r0, t0 + 2000, 1.0),
        ("train_loss", r0, t0 + 1000, 3.0),
        ("train_loss", r0, t0 + 2000, 2.0),
        ("train_step", r1, t0 + 2000, 5.0),
        ("train_loss", r1, t0 + 2000, 9.0),
    ]


def test_history_on_influxdb_equals_the_embedded_store(
    influxd: InfluxServer, tmp_path: Path
) -> None:
    t0 = int(time.time() * 1000) // 60_000 * 60_000 - 600_000  # within the raw retention
    settings = Settings()
    uri = influxd.uri(f"mv_{uuid.uuid4().hex[:10]}")
    setup(uri, settings)
    frames = []
    for vault in (Vault.open_local(str(tmp_path / "v")), InfluxVault.open(uri, settings)):
        with vault:
            vault.experiments.create("ranks", '{experiment="ranks"}', start=t0, end=t0 + 10_000)
            vault.write(_samples(t0))
            frames.append(vault.history("ranks", metrics=["train_loss"]))
    pd.testing.assert_frame_equal(frames[1], frames[0])
    assert frames[0]["train_loss"].tolist() == [3.0, 2.0, 9.0]
