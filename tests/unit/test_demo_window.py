"""The demo's data ends now (dashboards' default ranges and the docs' checks find it), and with
a seed and an explicit end it is the same data on every run."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from metricvault import Vault
from metricvault.cli.main import app
from metricvault.demo import demo_spec
from metricvault.durations import now_ms, parse_time_ms
from metricvault.sim import ClusterSpec, generate

END = "2026-11-30T12:00:03Z"


@pytest.mark.parametrize(
    ("end_ms", "days", "interval_s", "expected_end"),
    [
        (1_764_504_000_000, 1.0, 5, 1_764_504_000_000),
        (1_764_504_003_000, 0.5, 5, 1_764_504_000_000),  # moved down to a whole interval
        (1_764_504_003_000, 2.0, 1, 1_764_504_003_000),
    ],
)
def test_a_spec_ending_at_a_time_covers_the_days_before_it(
    end_ms: int, days: float, interval_s: int, expected_end: int
) -> None:
    spec = ClusterSpec.ending_at(end_ms, days, nodes=1, interval_s=interval_s)
    assert spec.end_ms == expected_end
    assert spec.end_ms - spec.start_ms == int(days * 86_400_000)


def test_the_demo_ends_now_unless_told_otherwise() -> None:
    before = now_ms()
    spec = demo_spec(nodes=1, days=1.0, seed=0)
    assert before - 5_000 <= spec.end_ms <= now_ms()
    fixed = demo_spec(nodes=1, days=1.0, seed=0, end_ms=parse_time_ms(END))
    assert fixed == demo_spec(nodes=1, days=1.0, seed=0, end_ms=parse_time_ms(END))


def test_a_seed_and_an_end_give_the_same_samples() -> None:
    def first_chunk() -> pa.Table:
        spec = demo_spec(nodes=1, days=0.01, seed=4, end_ms=parse_time_ms(END))
        chunk = next(iter(generate(spec)))
        assert isinstance(chunk, pa.Table)
        return chunk

    assert first_chunk().equals(first_chunk())


def test_demo_command_data_reaches_its_end(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        ["demo", "-d", str(data), "--days", "0.01", "--nodes", "1", "--end", END,
         "--report", str(tmp_path / "r.html")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2026-11-30 12:00 UTC" in result.output
    with Vault.open_local(str(data)) as vault:
        last = int(vault.sql("SELECT max(ts) AS last FROM raw")["last"][0])
    end = parse_time_ms("2026-11-30T12:00:00Z")
    assert end - 15_000 <= last < end  # the last scrapes (with the simulated jitter)
