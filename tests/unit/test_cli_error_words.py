"""Errors the command line shows are worded in its own terms (its flags, its fixes), while the
HTTP API keeps Prometheus's wording, which clients match on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from metricvault import Vault
from metricvault.errors import NvmlUnavailable, PromQLError, ResolutionError
from metricvault.promql.limits import check_resolution

T0 = 1_767_225_600_000
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def vault_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("words") / "v"
    with Vault.open_local(str(path)) as v:
        v.write([("gpu_util", {"gpu": "0"}, T0 + i * 60_000, float(i)) for i in range(60)])
    return str(path)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICVAULT_")}
    return subprocess.run(
        [sys.executable, "-m", "metricvault.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    ("days", "step", "points", "smallest"),
    [(8, "1m", "11,520", "63s"), (30, "10s", "259,200", "236s"), (366, "1h", "8,784", None)],
)
def test_promql_over_too_many_points_names_the_step_flag(
    vault_dir: str, days: int, step: str, points: str, smallest: str | None
) -> None:
    done = cli(
        "promql", "gpu_util", "--data", vault_dir,
        "--start", str(T0), "--end", str(T0 + days * DAY_MS), "--step", step,
    )  # fmt: skip
    if smallest is None:  # under the limit: answered
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert f"--step {step} gives {points} points per series" in message
    assert f"give --step {smallest} or more" in message
    assert "?step=" not in message and "Traceback" not in done.stderr


def test_the_engine_keeps_prometheus_wording_for_the_http_api() -> None:
    with pytest.raises(ResolutionError) as caught:
        check_resolution(0, 8 * DAY_MS, 60_000)
    assert isinstance(caught.value, PromQLError) and caught.value.status == 400
    assert caught.value.message == (
        "exceeded maximum resolution of 11,000 points per timeseries. "
        "Try decreasing the query resolution (?step=XX)"
    )
    assert caught.value.smallest_step_s == 63  # 8 days / 11,000 points, rounded up


def test_agent_gpu_nvml_without_nvml_says_the_fix(tmp_path: Path) -> None:
    from metricvault.collect.sources.nvml import NvmlSource

    try:
        NvmlSource().close()
    except NvmlUnavailable:
        pass
    else:
        pytest.skip("NVML works on this machine: the agent would start, nothing to refuse")
    done = cli("agent", "--gpu", "nvml", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert message.startswith("error (NvmlUnavailable): --gpu nvml: ")
    for fix in ("install the NVIDIA driver", "--gpu auto", "--simulate-gpus N"):
        assert fix in message
