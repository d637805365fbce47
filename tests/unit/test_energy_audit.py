"""A node's energy over a period, two ways: ``metricvault sql`` over the rollups' ``increase``
and PromQL's ``increase(...)``, against the raw samples computed here.

SQL is the exact reset-corrected sum of the counter's rises; PromQL is Prometheus's
``increase``, which extrapolates to the window's edges (computed here as Prometheus does). The
simulated node reboots once (its energy counters restart near zero) and misses some scrapes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest

from metricvault import Vault
from metricvault.config import Settings
from metricvault.durations import HOUR_MS
from metricvault.sim import ClusterSpec, generate

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
END_MS = 1_767_225_600_000 + 3 * 86_400_000  # fixed: the same samples every run
DAYS = 2.2  # two days or more: the node reboots once


@pytest.fixture(scope="module")
def energy_vault(tmp_path_factory: pytest.TempPathFactory):
    spec = ClusterSpec.ending_at(END_MS, DAYS, nodes=1, gpus_per_node=2, seed=11)
    path = tmp_path_factory.mktemp("energy") / "vault"
    with Vault.open_local(str(path), Settings.load(env={})) as vault:
        for chunk in generate(spec):
            chunk = chunk.filter(pc.equal(chunk["metric"], ENERGY))
            if chunk.num_rows:
                vault.write(chunk)
        vault.maintain(now_ms=END_MS + 2 * HOUR_MS)
    with Vault.open_local(str(path), Settings.load(env={})) as vault:
        yield vault, spec


def _raw(vault: Vault) -> list[tuple[np.ndarray, np.ndarray]]:
    raw = vault.sql(
        f"SELECT r.series_id, r.ts, r.value FROM raw r JOIN series s USING (series_id) "
        f"WHERE s.metric = '{ENERGY}' ORDER BY 1, 2"
    )
    sid, ts, value = (np.asarray(raw[c]) for c in ("series_id", "ts", "value"))
    return [(ts[sid == s], value[sid == s]) for s in np.unique(sid)]


def _rises(value: np.ndarray) -> np.ndarray:
    """Each sample's rise from the one before it; after a reset, its whole value."""
    return np.where(value[1:] >= value[:-1], value[1:] - value[:-1], value[1:])


def _exact(series, start: int, end: int) -> float:
    """The energy of samples in [start, end), each from the sample before it."""
    total = 0.0
    for ts, value in series:
        inside = (ts[1:] >= start) & (ts[1:] < end)
        total += float(_rises(value)[inside].sum())
    return total


def _prometheus_increase(series, end: int, range_ms: int) -> float:
    """Prometheus's ``increase`` at ``end`` (promql/functions.go extrapolatedRate), summed."""
    total = 0.0
    for ts, value in series:
        keep = (ts > end - range_ms) & (ts <= end)
        t, v = ts[keep] / 1000.0, value[keep]
        if len(t) < 2:
            continue
        result = float(_rises(v).sum())
        sampled = t[-1] - t[0]
        to_start, to_end = t[0] - (end - range_ms) / 1000.0, end / 1000.0 - t[-1]
        average = sampled / (len(t) - 1)
        if result > 0 and v[0] >= 0:
            to_start = min(to_start, sampled * (v[0] / result))
        threshold = average * 1.1
        window = sampled
        window += to_start if to_start < threshold else average / 2
        window += to_end if to_end < threshold else average / 2
        total += result * window / sampled
    return total


def _sql_energy(vault: Vault, tier: str, start: int, end: int) -> float:
    answer = vault.sql(
        f"SELECT sum(r.increase) AS mj FROM rollup_{tier} r JOIN series s USING (series_id) "
        f"WHERE s.metric = '{ENERGY}' AND json_extract_string(s.labels, '$.Hostname') = "
        f"'node01' AND r.ts >= {start} AND r.ts < {end}"
    )
    return float(np.asarray(answer["mj"])[0])


@pytest.mark.parametrize("tier", ["1m", "1h"])
@pytest.mark.parametrize("hours", [6, 24, 48])
def test_sql_energy_is_the_exact_increase_and_promql_the_extrapolated_one(
    energy_vault, tier: str, hours: int
) -> None:
    vault, spec = energy_vault
    end = spec.end_ms // HOUR_MS * HOUR_MS
    start = end - hours * HOUR_MS
    series = _raw(vault)
    exact = _exact(series, start, end)
    assert exact > 0
    assert _sql_energy(vault, tier, start, end) == pytest.approx(exact, rel=1e-12)
    at = pd.Timestamp(end, unit="ms", tz="UTC")
    answer = vault.promql(f'sum(increase({ENERGY}{{Hostname="node01"}}[{hours}h]))', at)
    promql = float(answer["value"].iloc[0])
    assert promql == pytest.approx(_prometheus_increase(series, end, hours * HOUR_MS), rel=1e-9)
    # the extrapolation is all that differs: at most ~1.1 scrape intervals at each edge
    assert abs(promql - exact) / exact < 2.2 * spec.interval_s / (hours * 3600) + 1e-9


def test_the_reboot_is_inside_the_audited_period(energy_vault) -> None:
    """The pair above covers a counter reset: some sample is below the one before it."""
    vault, _ = energy_vault
    resets = sum(int((np.diff(value) < 0).sum()) for _, value in _raw(vault))
    assert resets >= 2  # both GPUs of the rebooted node
