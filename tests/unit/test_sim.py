"""The synthetic cluster workload: deterministic, well-formed, realistic enough to test against."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from metricvault.errors import ConfigError
from metricvault.sim import (
    GPU_METRICS,
    LABEL_NAMES,
    SCHEMA,
    TRAINING_METRICS,
    ClusterSpec,
    JobSpec,
    default_jobs,
    generate,
    series_count,
    to_pandas,
    total_samples,
)
from metricvault.sim.plan import make_plan
from metricvault.sim.spec import FB_TOTAL_MIB

# Two days so the node restart happens; two GPUs per node keep it small (~1.5 M rows).
SPEC = ClusterSpec(nodes=2, gpus_per_node=2, days=2.0, seed=7)
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    # Rows of a series come in time order: chunks are time-ordered, series are contiguous in one.
    df = to_pandas(SPEC)
    labels = ["metric", "Hostname", "gpu", "job"]
    df["series"] = df.groupby(labels, dropna=False, sort=False).ngroup()
    return df


def _digest(tables: list[pa.Table]) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        for table in tables:
            writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def _metric(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df[df["metric"] == name]


# --- determinism -------------------------------------------------------------------------------


def test_same_spec_gives_same_bytes() -> None:
    spec = ClusterSpec(nodes=2, gpus_per_node=2, days=0.25, seed=3)
    assert _digest(list(generate(spec))) == _digest(list(generate(spec)))


def test_different_seed_gives_different_data() -> None:
    first = ClusterSpec(nodes=1, gpus_per_node=2, days=0.25, seed=1)
    second = ClusterSpec(nodes=1, gpus_per_node=2, days=0.25, seed=2)
    assert _digest(list(generate(first))) != _digest(list(generate(second)))


def test_values_do_not_depend_on_chunk_size() -> None:
    spec = ClusterSpec(nodes=2, gpus_per_node=1, days=0.5, seed=5)
    keys = ["metric", "Hostname", "gpu", "job", "timestamp"]

    def rows(chunk_hours: float) -> pd.DataFrame:
        df = pa.concat_tables(generate(spec, chunk_hours)).to_pandas()
        return df.sort_values(keys).reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(6.0), rows(0.7))


# --- shape -------------------------------------------------------------------------------------


def test_every_chunk_has_the_schema_and_chunks_are_time_ordered() -> None:
    spec = ClusterSpec(nodes=2, gpus_per_node=2, days=0.5)
    chunk_ms = 2 * 3_600_000
    previous_end = -1
    for table in generate(spec, chunk_hours=2.0):
        assert table.schema == SCHEMA
        assert table.column_names == ["metric", "timestamp", "value", *LABEL_NAMES]
        stamps = table["timestamp"].to_numpy()
        window = (stamps.min() - spec.start_ms) // chunk_ms
        assert ((stamps - spec.start_ms) // chunk_ms == window).all()
        assert stamps.min() > previous_end
        previous_end = stamps.max()


def test_every_row_is_labelled_simulated(frame: pd.DataFrame) -> None:
    assert (frame["simulated"] == "true").all()


def test_gpu_series_carry_gpu_labels_and_training_series_carry_job(frame: pd.DataFrame) -> None:
    gpu_rows = frame[frame["metric"].isin(GPU_METRICS)]
    assert gpu_rows[["Hostname", "UUID", "device", "gpu", "modelName"]].notna().all().all()
    assert gpu_rows["job"].isna().all()
    assert set(gpu_rows["Hostname"].unique()) == {"node01", "node02"}
    assert set(gpu_rows["device"].unique()) == {"nvidia0", "nvidia1"}
    uuids = gpu_rows.drop_duplicates(["Hostname", "gpu", "UUID"])["UUID"]
    assert len(uuids) == uuids.nunique() == SPEC.nodes * SPEC.gpus_per_node
    assert uuids.str.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}").all()
    train_rows = frame[frame["metric"].isin(TRAINING_METRICS)]
    assert set(train_rows["job"].unique()) == {"llama-70b-r3", "llama-70b-r4"}
    assert train_rows[["Hostname", "UUID", "device", "gpu", "modelName"]].isna().all().all()


def test_series_count_matches(frame: pd.DataFrame) -> None:
    assert frame["series"].nunique() == series_count(SPEC) == 2 * 2 * 11 + 2 * 7


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        ClusterSpec(nodes=1, gpus_per_node=1, days=0.3, interval_s=15, seed=9),
        ClusterSpec(
            nodes=3,
            gpus_per_node=1,
            days=2.2,
            interval_s=10,
            jobs=(JobSpec("solo", (2, 0), 3_600, 50_000, 1e9, 2_000.0),),
        ),
    ],
)
def test_total_samples_is_exact(spec: ClusterSpec) -> None:
    assert total_samples(spec) == sum(table.num_rows for table in generate(spec))


def test_timestamps_are_scrape_aligned_with_a_constant_offset(frame: pd.DataFrame) -> None:
    step_ms = SPEC.interval_s * 1000
    offset = (frame["timestamp"] - SPEC.start_ms) % step_ms
    assert offset.between(1, 60).all()
    assert offset.groupby(frame["series"]).nunique().eq(1).all()
    assert (frame.groupby("series")["timestamp"].diff().dropna() > 0).all()


# --- events ------------------------------------------------------------------------------------


def test_every_node_has_a_scrape_gap(frame: pd.DataFrame) -> None:
    step_ms = SPEC.interval_s * 1000
    util = _metric(frame, "DCGM_FI_DEV_GPU_UTIL")
    gaps = util.groupby("series")["timestamp"].diff()
    short = util[(gaps > step_ms) & (gaps <= 7 * step_ms)]
    assert set(short["Hostname"].unique()) == {"node01", "node02"}
    # all series of a node miss the same scrapes
    per_node = util.groupby("Hostname")["timestamp"].nunique()
    node_rows = frame[frame["Hostname"].notna()].groupby("Hostname")["timestamp"].nunique()
    pd.testing.assert_series_equal(per_node, node_rows)


def test_energy_counter_only_resets_at_the_restart(frame: pd.DataFrame) -> None:
    restart = make_plan(SPEC).restart
    assert restart is not None
    energy = _metric(frame, ENERGY)
    drops = energy[energy.groupby("series")["value"].diff() < 0]
    step_ms = SPEC.interval_s * 1000
    first_back = SPEC.start_ms + restart.down_end * step_ms
    assert len(drops) == SPEC.gpus_per_node
    assert set(drops["Hostname"].unique()) == {f"node{restart.node + 1:02d}"}
    assert ((drops["timestamp"] - first_back).between(0, 60)).all()
    assert (drops["value"] < 5e6).all()  # starts again from one interval's energy (mJ)
    gap = energy.groupby("series")["timestamp"].diff()
    assert (gap[drops.index] >= 300_000).all()  # about 5 minutes without data


def test_energy_counter_integrates_power(frame: pd.DataFrame) -> None:
    one = frame[(frame["Hostname"] == "node02") & (frame["gpu"] == "1")]
    wide = one.pivot_table(index="timestamp", columns="metric", values="value")
    consecutive = np.diff(wide.index.to_numpy()) == SPEC.interval_s * 1000
    added = np.diff(wide[ENERGY].to_numpy())[consecutive]
    power = wide["DCGM_FI_DEV_POWER_USAGE"].to_numpy()[1:][consecutive]
    assert np.abs(added - power * SPEC.interval_s * 1000).max() <= 1.0


def test_no_restart_in_short_runs() -> None:
    assert make_plan(ClusterSpec(days=1.5)).restart is None
    assert make_plan(ClusterSpec(days=2.0)).restart is not None


def test_training_counter_is_monotonic(frame: pd.DataFrame) -> None:
    tokens = _metric(frame, "train_tokens_total")
    assert (tokens.groupby("series")["value"].diff().dropna() >= 0).all()
    assert tokens["value"].max() > 1e8


# --- values ------------------------------------------------------------------------------------


def _has_decimals(values: pd.Series, decimals: int) -> bool:
    return bool((values == np.round(values, decimals)).all())


@pytest.mark.parametrize(
    ("metric", "low", "high", "decimals"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", 0, 100, 0),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 0, 100, 0),
        ("DCGM_FI_DEV_FB_USED", 0, FB_TOTAL_MIB, 0),
        ("DCGM_FI_DEV_FB_FREE", 0, FB_TOTAL_MIB, 0),
        ("DCGM_FI_DEV_GPU_TEMP", 20, 90, 0),
        ("DCGM_FI_DEV_POWER_USAGE", 55, 700, 3),
        ("DCGM_FI_DEV_SM_CLOCK", 345, 1980, 0),
        ("DCGM_FI_PROF_SM_ACTIVE", 0, 1, 6),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0, 1, 6),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0, 1, 6),
        ("mfu", 0, 0.7, None),
        ("learning_rate", 0, 1.5e-4, None),
        ("train_loss", 1.5, 20, None),
        ("grad_norm", 0.05, 50, None),
    ],
)
def test_values_are_in_range(
    frame: pd.DataFrame, metric: str, low: float, high: float, decimals: int | None
) -> None:
    values = _metric(frame, metric)["value"]
    assert len(values) > 0
    assert values.between(low, high).all(), (values.min(), values.max())
    if decimals is not None:
        assert _has_decimals(values, decimals)
    assert not np.signbit(values).any()  # no -0.0


def test_fb_used_plus_free_is_the_total(frame: pd.DataFrame) -> None:
    keys = ["UUID", "timestamp"]
    used = _metric(frame, "DCGM_FI_DEV_FB_USED").set_index(keys)["value"]
    free = _metric(frame, "DCGM_FI_DEV_FB_FREE").set_index(keys)["value"]
    total = used.add(free)
    assert len(total) == len(used) == len(free)
    assert (total == FB_TOTAL_MIB).all()
    assert used.min() == 0 and used.max() > 70_000


def test_sm_clock_comes_in_15_mhz_steps(frame: pd.DataFrame) -> None:
    assert (_metric(frame, "DCGM_FI_DEV_SM_CLOCK")["value"] % 15 == 0).all()


def test_utilisation_follows_the_job_phases(frame: pd.DataFrame) -> None:
    job = default_jobs(SPEC.nodes, SPEC.days)[0]
    util = _metric(frame, "DCGM_FI_DEV_GPU_UTIL")
    util = util[util["Hostname"] == "node01"]
    since_start_s = (util["timestamp"] - SPEC.start_ms) / 1000 - job.start_offset_s
    before = util[since_start_s < 0]
    assert before["value"].max() <= 1
    power = _metric(frame, "DCGM_FI_DEV_POWER_USAGE")
    idle_power = power[
        (power["Hostname"] == "node01") & (power["timestamp"] < before.timestamp.max())
    ]
    assert idle_power["value"].between(55, 90).all()
    # training most of the time, with checkpoint dips roughly every 2 hours
    first_day = util[(since_start_s > 600) & (since_start_s < 86_400)]
    assert first_day["value"].median() >= 95
    dips = first_day[first_day["value"] < 20]
    dip_hours = set(((since_start_s[dips.index]) // 3600).astype(int))
    assert {2, 4, 6, 8, 10} <= dip_hours


def test_mfu_is_realistic_and_dips_at_checkpoints(frame: pd.DataFrame) -> None:
    mfu = _metric(frame, "mfu")
    training = mfu[mfu["value"] > 0]["value"]
    assert training.quantile(0.05) >= 0.35 and training.quantile(0.95) <= 0.55
    assert (mfu["value"] == 0).mean() > 0.01


def test_loss_decreases_and_learning_rate_warms_up_then_decays(frame: pd.DataFrame) -> None:
    loss = _metric(frame, "train_loss")
    r3 = loss[loss["job"] == "llama-70b-r3"]["value"].to_numpy()
    assert r3[:100].mean() > r3[-100:].mean() + 2
    lr = _metric(frame, "learning_rate")
    r3_lr = lr[lr["job"] == "llama-70b-r3"]["value"].to_numpy()
    peak = int(np.argmax(r3_lr))
    assert 0 < peak < len(r3_lr) // 4 and r3_lr[-1] < r3_lr[peak] / 2


# --- specs -------------------------------------------------------------------------------------


def test_default_jobs_share_the_cluster() -> None:
    r3, r4 = default_jobs(13, 7.0)
    assert (r3.name, r4.name) == ("llama-70b-r3", "llama-70b-r4")
    assert set(r3.nodes) | set(r4.nodes) == set(range(13)) and not set(r3.nodes) & set(r4.nodes)
    solo_r3, solo_r4 = default_jobs(1, 4.0)
    assert solo_r3.start_offset_s + solo_r3.duration_s <= solo_r4.start_offset_s


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ClusterSpec(nodes=0), "at least 1 node"),
        (ClusterSpec(interval_s=0), "interval_s"),
        (ClusterSpec(days=0.0), "shorter than one scrape interval"),
        (ClusterSpec(days=float("nan")), "finite"),
        (ClusterSpec(start_ms=0), "timestamp range"),
        (ClusterSpec(jobs=(JobSpec("a", (5,), 0, 10, 1.0, 1.0),)), "distinct indices"),
        (
            ClusterSpec(
                jobs=(JobSpec("a", (0,), 0, 100, 1.0, 1.0), JobSpec("b", (0,), 50, 100, 1.0, 1.0))
            ),
            "same time",
        ),
    ],
)
def test_bad_specs_are_refused(spec: ClusterSpec, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        total_samples(spec)


def test_bad_chunk_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="chunk_hours"):
        generate(ClusterSpec(days=0.1), chunk_hours=0)
    with pytest.raises(ConfigError, match="nodes"):
        generate(ClusterSpec(nodes=-1))


@pytest.mark.slow
def test_the_demo_size_run_yields_exactly_total_samples() -> None:
    # Generation speed is measured by bench/storage.py, not asserted here.
    spec = ClusterSpec()
    rows = sum(table.num_rows for table in generate(spec))
    assert rows == total_samples(spec) > 40_000_000


def test_train_step_counts_optimizer_steps_from_tokens(frame: pd.DataFrame) -> None:
    from metricvault.sim.training import TOKENS_PER_STEP

    tokens = _metric(frame, "train_tokens_total")
    steps = _metric(frame, "train_step")
    merged = tokens.merge(steps, on=["timestamp", "job"], suffixes=("_tokens", "_step"))
    assert len(merged) == len(tokens)
    assert (merged["value_step"] == merged["value_tokens"] // TOKENS_PER_STEP).all()
    assert merged.groupby("job")["value_step"].is_monotonic_increasing.all()
