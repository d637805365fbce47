"""Baselines learned from the rollup rows, checked against numpy on the raw samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from metricvault import Vault
from metricvault.analysis.baselines import (
    BASELINE_METRIC,
    HOUR_MS,
    BaselineSpec,
    compute_baselines,
    maintain_baselines,
    run_baselines,
    seasonality,
)
from metricvault.errors import InputError, MetricVaultError

DAYS = 28
STEP_MS = 60_000
NOW = (1_790_000_000_000 // (7 * 24 * HOUR_MS)) * 7 * 24 * HOUR_MS  # a Thursday 00:00 UTC
START = NOW - DAYS * 24 * HOUR_MS


def _gpu_series(seed: int, daily: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = np.arange(START, NOW, STEP_MS)
    hour_of_day = (ts // HOUR_MS) % 24
    values = 40_000 + daily * np.sin(2 * np.pi * hour_of_day / 24) + rng.normal(0, 500, ts.size)
    return ts, values


@pytest.fixture(scope="module")
def vault(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Vault, dict[str, np.ndarray]]]:
    path = Path(tmp_path_factory.mktemp("baselines")) / "v"
    raw: dict[str, np.ndarray] = {}
    with Vault.open_local(str(path)) as v:
        frames = []
        for gpu, (seed, daily) in {"0": (1, 8000.0), "1": (2, 0.0)}.items():
            ts, values = _gpu_series(seed, daily)
            raw[gpu] = values
            frames.append(
                pd.DataFrame(
                    {"metric": "DCGM_FI_DEV_FB_USED", "timestamp": ts, "value": values,
                     "Hostname": "node01", "gpu": gpu, "modelName": "H100"}
                )
            )  # fmt: skip
        ts = np.arange(START, NOW, STEP_MS)
        frames.append(
            pd.DataFrame(
                {"metric": "requests_total", "timestamp": ts, "value": np.arange(ts.size) * 120.0,
                 "Hostname": "node01", "gpu": "", "modelName": ""}
            )
        )  # fmt: skip
        v.write(pd.concat(frames, ignore_index=True))
        v.maintain(now_ms=NOW)
        yield v, raw


def _by_gpu(baselines: list[Any]) -> dict[str, Any]:
    return {b.labels["gpu"]: b for b in baselines}


def test_per_series_statistics_match_numpy_on_the_raw_samples(
    vault: tuple[Vault, dict[str, np.ndarray]],
) -> None:
    v, raw = vault
    spec = BaselineSpec("DCGM_FI_DEV_FB_USED", warmup="0h")
    found = _by_gpu(compute_baselines(v, spec, NOW))
    for gpu, values in raw.items():
        b = found[gpu]
        assert b.kind == "gauge" and b.trusted and b.history_hours == DAYS * 24
        stats = b.stats
        assert stats["mean"] == pytest.approx(values.mean(), rel=1e-9)
        assert stats["stddev"] == pytest.approx(values.std(), rel=1e-9)
        ordered = np.sort(values)
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            assert stats[name] == pytest.approx(ordered[int(q * (values.size - 1))], rel=0.01)
        assert stats["median"] == pytest.approx(np.median(values), rel=0.01)
        mad = np.median(np.abs(values - np.median(values)))
        # within half a sketch bucket (1 % of the level, ~400 here) of numpy's, not better:
        # this spread (sigma 500) is narrower than a bucket (docs/anomaly.md, Baselines)
        assert abs(stats["mad"] - mad) <= 0.01 * np.median(values)


def test_the_daily_cycle_is_found_and_noise_is_not(
    vault: tuple[Vault, dict[str, np.ndarray]],
) -> None:
    v, _ = vault
    found = _by_gpu(compute_baselines(v, BaselineSpec("DCGM_FI_DEV_FB_USED"), NOW))
    cyclic, flat = found["0"], found["1"]
    assert cyclic.seasonality.seasonal and cyclic.profile_mean is not None
    assert not flat.seasonality.seasonal and flat.profile_mean is None
    # the profile is the hour's mean: sin at 06:00 UTC is the top
    profile = cyclic.profile_mean
    assert profile[6] == pytest.approx(48_000, rel=0.01)


@pytest.mark.parametrize(
    ("amplitude", "seasonal"),
    [(0.0, False), (0.05, False), (1.0, True), (3.0, True)],
)
def test_seasonality_test_against_white_noise(amplitude: float, seasonal: bool) -> None:
    rng = np.random.default_rng(7)
    hours = np.arange(24 * DAYS) + 1000
    values = amplitude * np.sin(2 * np.pi * (hours % 24) / 24) + rng.normal(0, 1, hours.size)
    assert seasonality(values, hours).seasonal is seasonal


def test_groups_merge_their_series(vault: tuple[Vault, dict[str, np.ndarray]]) -> None:
    v, raw = vault
    spec = BaselineSpec("DCGM_FI_DEV_FB_USED", by=("modelName",), warmup="0h")
    (group,) = compute_baselines(v, spec, NOW)
    both = np.concatenate(list(raw.values()))
    assert group.labels == {"modelName": "H100"} and group.series == 2
    assert group.stats["mean"] == pytest.approx(both.mean(), rel=1e-9)
    assert group.stats["stddev"] == pytest.approx(both.std(), rel=1e-9)
    assert group.stats["p99"] == pytest.approx(np.sort(both)[int(0.99 * (both.size - 1))], rel=0.01)


def test_counters_are_baselined_on_their_rates(vault: tuple[Vault, dict[str, np.ndarray]]) -> None:
    v, _ = vault
    (b,) = compute_baselines(v, BaselineSpec("requests_total"), NOW)
    assert b.kind == "counter"
    # 120 per minute; the window's first hour lacks the increase into its first sample
    assert b.stats["mean"] == pytest.approx(2.0, rel=1e-4)
    assert b.stats["p99"] == pytest.approx(2.0, rel=1e-9)


def test_short_history_is_not_trusted_and_not_stored(
    vault: tuple[Vault, dict[str, np.ndarray]],
) -> None:
    v, _ = vault
    spec = BaselineSpec("DCGM_FI_DEV_FB_USED", window="3d", min_history="7d")
    found = compute_baselines(v, spec, NOW)
    assert found and not any(b.trusted for b in found)


def test_warmup_hours_are_left_out(vault: tuple[Vault, dict[str, np.ndarray]]) -> None:
    v, _ = vault
    # the series begin inside a 30-day window: their first 3 hours are warm-up
    spec = BaselineSpec("DCGM_FI_DEV_FB_USED", window="30d", warmup="3h")
    assert {b.history_hours for b in compute_baselines(v, spec, NOW)} == {DAYS * 24 - 3}


def test_stored_baselines_work_in_promql(vault: tuple[Vault, dict[str, np.ndarray]]) -> None:
    v, _ = vault
    at = NOW + 30_000
    run_baselines(v, [BaselineSpec("DCGM_FI_DEV_FB_USED")], at)
    p99 = v.promql(f'{BASELINE_METRIC}{{stat="p99"}}', at)
    thresholds = dict(zip(p99["gpu"], p99["value"], strict=True))
    assert set(thresholds) == {"0", "1"}
    # GPU 1 crosses its 28-day P99, GPU 0 stays under its own
    labels = {"Hostname": "node01", "modelName": "H100"}
    v.write(
        [
            ("DCGM_FI_DEV_FB_USED", {**labels, "gpu": "0"}, at, thresholds["0"] * 0.9),
            ("DCGM_FI_DEV_FB_USED", {**labels, "gpu": "1"}, at, thresholds["1"] * 1.1),
        ]
    )
    frame = v.promql('DCGM_FI_DEV_FB_USED > on(Hostname, gpu) metricvault_baseline{stat="p99"}', at)
    assert list(frame["gpu"]) == ["1"]
    assert list(frame["value"]) == pytest.approx([thresholds["1"] * 1.1])
    seasonal = v.promql(f'{BASELINE_METRIC}{{stat="seasonal_mean"}}', at)
    assert set(seasonal["gpu"]) == {"0"}


def test_maintain_recomputes_only_stale_baselines(
    vault: tuple[Vault, dict[str, np.ndarray]],
) -> None:
    v, _ = vault
    spec = BaselineSpec("requests_total")
    first = maintain_baselines(v, [spec], "1h", NOW - 50 * 60_000)
    assert first["recomputed"] == 1
    again = maintain_baselines(v, [spec], "1h", NOW - 40 * 60_000)
    assert (again["recomputed"], again["untrusted"]) == (0, 0)
    assert again["carried_forward"] > 0
    later = maintain_baselines(v, [spec], "1h", NOW + 20 * 60_000)
    assert later["recomputed"] == 1


def test_maintain_carries_the_seasonal_profile_forward(
    vault: tuple[Vault, dict[str, np.ndarray]],
) -> None:
    v, _ = vault
    spec = BaselineSpec("DCGM_FI_DEV_FB_USED")
    at = NOW + 2 * HOUR_MS
    run_baselines(v, [spec], at)
    later = at + 30 * 60_000  # past the lookback of the last written point, within the interval
    assert maintain_baselines(v, [spec], "1h", later)["recomputed"] == 0
    found = v.promql(f'{BASELINE_METRIC}{{stat="seasonal_mean"}}', later)
    (profile,) = [b.profile_mean for b in compute_baselines(v, spec, at) if b.labels["gpu"] == "0"]
    hour_of_week = int(((later // HOUR_MS) + 72) % 168)
    assert profile is not None
    assert list(found["value"]) == pytest.approx([profile[hour_of_week]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"selector": "DCGM{"}, "selector"),
        ({"selector": "x", "window": "10m"}, "under 1h"),
        ({"selector": "x", "by": ("stat",)}, "reserved"),
    ],
)
def test_bad_specs_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(Exception, match=message) as err:
        BaselineSpec(**kwargs)  # type: ignore[arg-type]
    assert isinstance(err.value, (InputError, ValueError))


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("up", BaselineSpec("up")),
        (
            "DCGM_FI_DEV_FB_USED by Hostname,gpu",
            BaselineSpec("DCGM_FI_DEV_FB_USED", ("Hostname", "gpu")),
        ),
        (
            'x{job="a b"} by job over 14d min 2d',
            BaselineSpec('x{job="a b"}', ("job",), "14d", "2d"),
        ),
        ('x{job=" by y"}', BaselineSpec('x{job=" by y"}')),
    ],
)
def test_baselines_setting_entries(entry: str, expected: BaselineSpec) -> None:
    assert BaselineSpec.parse(entry) == expected


@pytest.mark.parametrize("entry", ["", " by job", "x over 10m", "x{ by job"])
def test_bad_baselines_setting_entries_are_refused(entry: str) -> None:
    with pytest.raises(MetricVaultError):
        BaselineSpec.parse(entry)
