"""PromQL from the rollup tiers (issue 13): where windows and steps are whole buckets, the
1m/1h rows answer exactly what the raw samples answer (the raw-sample engine over the same
samples is the reference here; tests/e2e/test_promql_oracle.py checks it against Prometheus),
and where they cannot (NaN samples, gauges under rate, unaligned windows, Prometheus 3
windows) the engine reads raw samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from metricvault.promql import Engine, EngineOptions, MemorySource
from metricvault.promql.values import QueryResult
from metricvault.protocols import (
    ALL_BUCKET_COLUMNS,
    BUCKET_COLUMNS,
    BUCKET_FUNCTIONS,
    BucketSelection,
    Horizons,
    SeriesBuckets,
    bucket_columns,
)

HOUR = 3_600_000
MIN = 60_000
T0 = (1_700_000_000_000 // (24 * HOUR)) * 24 * HOUR  # midnight: samples on bucket boundaries
SPAN = 6 * HOUR


def _workload() -> list[tuple[str, dict[str, str], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    ts5 = T0 + np.arange(0, SPAN, 5_000)  # 5 s scrapes: every minute's first sample on :00
    for gpu in range(3):
        util = np.round(rng.uniform(0, 100, ts5.size), 1)
        out.append(("gpu_util", {"gpu": str(gpu)}, ts5, util))
        energy = np.cumsum(np.round(rng.uniform(100, 400, ts5.size), 3))
        if gpu == 1:  # counter resets (a restart every ~80 minutes), one right on a boundary
            for at in (1000, 1920, 3000):
                energy[at:] -= energy[at] - 5.0
        out.append(("energy_total", {"gpu": str(gpu)}, ts5, energy))
    # jittered 15 s scrapes, and a counter with a gap longer than the counter lookback (1h)
    ts15 = T0 + np.arange(0, SPAN, 15_000) + rng.integers(0, 900, SPAN // 15_000)
    out.append(("jitter_total", {"job": "x"}, ts15, np.cumsum(rng.uniform(0, 9, ts15.size))))
    gap = (ts15 < T0 + HOUR) | (ts15 > T0 + 2 * HOUR + 30 * MIN)
    out.append(("gappy_total", {"job": "x"}, ts15[gap], np.arange(gap.sum(), dtype=float)))
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Engine, object]]:
    from metricvault.store.vault import Vault

    memory = MemorySource()
    vault = Vault.open_local(str(tmp_path_factory.mktemp("tiers") / "vault"))
    rows = []
    for metric, labels, ts, values in _workload():
        memory.add({"__name__": metric, **labels}, ts.tolist(), values.tolist())
        rows += [(metric, labels, int(t), float(v)) for t, v in zip(ts, values, strict=True)]
    vault.write(rows)
    vault.maintain(now_ms=T0 + SPAN + 2 * HOUR)  # rolls up every hour
    assert vault.catalog_version().rollup_watermark_ms() is None
    yield Engine(vault), Engine(memory), vault
    vault.close()


def _agree(got: QueryResult, want: QueryResult) -> None:
    assert [s[0] for s in got.series] == [s[0] for s in want.series]
    for (labels, gt, gv), (_, wt, wv) in zip(got.series, want.series, strict=True):
        assert gt.tolist() == wt.tolist(), labels
        assert np.allclose(gv, wv, rtol=1e-5, atol=0, equal_nan=True), (labels, gv, wv)


ALIGNED = [
    ("avg_over_time(gpu_util[1h])", HOUR, {"1h"}),
    ("max_over_time(gpu_util[1h])", HOUR, {"1h"}),
    ("min_over_time(gpu_util[2h])", HOUR, {"1h"}),
    ("sum_over_time(gpu_util[1m])", MIN, {"1m"}),
    ("count_over_time(gpu_util[5m])", 5 * MIN, {"1m"}),
    ("last_over_time(gpu_util[1h])", 30 * MIN, {"1m"}),
    ("present_over_time(jitter_total[1m])", MIN, {"1m"}),
    ("rate(energy_total[1h])", HOUR, {"1h"}),
    ("increase(energy_total[5m])", 5 * MIN, {"1m"}),
    ("rate(energy_total[1m])", MIN, {"1m"}),
    ("delta(gpu_util[10m])", 10 * MIN, {"1m"}),
    ("rate(jitter_total[2m])", 2 * MIN, {"1m"}),
    ("increase(gappy_total[2h])", HOUR, {"1h"}),
    ("rate(gappy_total[10m])", 5 * MIN, {"1m"}),
    ("sum by (gpu) (rate(energy_total[5m] offset 1h))", 5 * MIN, {"1m"}),
    ("topk(2, avg_over_time(gpu_util[1h]))", HOUR, {"1h"}),
    (f"max_over_time(gpu_util[1h] @ {(T0 + 3 * HOUR) // 1000})", 2 * HOUR, {"1h"}),
    (f"max_over_time(gpu_util[1h] @ {(T0 + 3 * HOUR) // 1000 + 30})", 2 * HOUR, set()),
]


@pytest.mark.parametrize(("expr", "step", "tiers"), ALIGNED)
def test_aligned_windows_are_answered_from_rollups_exactly(engines, expr, step, tiers) -> None:
    rollups, raw, _ = engines
    start, end = T0 + 2 * HOUR, T0 + SPAN
    got = rollups.evaluate(expr, start, end, step)
    _agree(got, raw.evaluate(expr, start, end, step))
    assert got.served_by == tiers, got.served_by
    assert got.warnings == []


SKETCH_KEYS = {"sketch_start", "sketch_end", "sketch_held", "sketch_codes", "sketch_counts"}


@pytest.mark.parametrize("func", [*sorted(BUCKET_FUNCTIONS), None])
def test_the_vault_hands_over_only_the_bucket_columns_the_function_reads(engines, func) -> None:
    from metricvault.promql.source import hints_for
    from metricvault.selector import Matcher

    *_, vault = engines
    refs = T0 + 2 * HOUR + HOUR * np.arange(4)
    matchers = [Matcher("__name__", "=", "energy_total")]
    selection = vault.select_buckets(matchers, hints_for(refs, HOUR, func, False))
    assert selection is not None and selection.series
    wanted = set(bucket_columns(func))
    assert {"ts", "count", "first", "first_ts", "nonfinite"} <= wanted
    for s in selection.series:
        assert set(s.columns) == wanted | SKETCH_KEYS, func


def test_the_vault_lays_every_series_rows_end_to_end_as_well(engines) -> None:
    """BucketSelection.rows: the columns of all series' rows, of which each series' columns
    are the consecutive slices (the engine checks all rows there at once)."""
    from metricvault.promql.source import hints_for
    from metricvault.selector import Matcher

    *_, vault = engines
    refs = T0 + 2 * HOUR + HOUR * np.arange(4)
    selection = vault.select_buckets(
        [Matcher("__name__", "=~", "energy_total|gpu_util")], hints_for(refs, HOUR, "rate", False)
    )
    assert selection is not None and len(selection.series) > 1 and selection.rows is not None
    assert set(selection.rows) == set(bucket_columns("rate"))
    at = 0
    for s in selection.series:
        n = s.columns["ts"].size
        for name, flat in selection.rows.items():
            assert np.array_equal(s.columns[name], flat[at : at + n], equal_nan=True), name
        at += n
    assert at == selection.rows["ts"].size


def test_bucket_columns_name_each_functions_own_and_all_for_the_others() -> None:
    assert "increase" in bucket_columns("rate") and "sum" not in bucket_columns("rate")
    assert "sum" in bucket_columns("avg_over_time") and "max" not in bucket_columns("avg_over_time")
    assert "last" not in bucket_columns("avg_over_time") and "last" in bucket_columns(None)
    assert {"sum", "min", "max"} <= set(bucket_columns("sum_over_time"))  # the window cache's
    assert bucket_columns("quantile_over_time") == (*BUCKET_COLUMNS, "m2") == ALL_BUCKET_COLUMNS
    assert bucket_columns("stddev_over_time") == (*BUCKET_COLUMNS, "m2")


def test_instant_queries_on_a_boundary_use_rollups(engines) -> None:
    rollups, raw, _ = engines
    for expr in ("rate(energy_total[1h])", "max_over_time(gpu_util[3h])"):
        got = rollups.evaluate(expr, T0 + 4 * HOUR)
        _agree(got, raw.evaluate(expr, T0 + 4 * HOUR))
        assert got.served_by == {"1h"}


@pytest.mark.parametrize(
    "expr",
    [
        "rate(energy_total[75s])",  # Grafana's $__rate_interval at a 1m step: not whole minutes
        "avg_over_time(gpu_util[1m])",  # evaluated at :30 below
        "irate(energy_total[5m])",  # needs the last two samples
        "rate(gpu_util[5m])",  # a gauge: rollups keep no increase for it
    ],
)
def test_what_rollups_cannot_answer_exactly_reads_raw_samples(engines, expr) -> None:
    rollups, raw, _ = engines
    start = T0 + 2 * HOUR + 30_000
    got = rollups.evaluate(expr, start, start + HOUR, MIN)
    _agree(got, raw.evaluate(expr, start, start + HOUR, MIN))
    assert got.served_by == set()


def test_rollups_can_be_turned_off(engines) -> None:
    _, _, vault = engines
    engine = Engine(vault, EngineOptions(use_rollups=False))
    got = engine.evaluate("rate(energy_total[1h])", T0 + 2 * HOUR, T0 + SPAN, HOUR)
    assert got.served_by == set()


def test_prometheus_3_windows_read_raw_samples(engines) -> None:
    _, _, vault = engines
    memory = MemorySource()
    for metric, labels, ts, values in _workload():
        memory.add({"__name__": metric, **labels}, ts.tolist(), values.tolist())
    options = EngineOptions(left_open_windows=True)
    got = Engine(vault, options).evaluate(
        "max_over_time(gpu_util[1h])", T0 + 2 * HOUR, T0 + SPAN, HOUR
    )
    _agree(
        got,
        Engine(memory, options).evaluate(
            "max_over_time(gpu_util[1h])", T0 + 2 * HOUR, T0 + SPAN, HOUR
        ),
    )
    assert got.served_by == set()


def test_a_nan_sample_in_the_window_makes_the_engine_read_raw(tmp_path: Path) -> None:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path / "vault"))
    ts = T0 + np.arange(0, 2 * HOUR, 15_000)
    values = np.arange(ts.size, dtype=float)
    values[100] = np.nan
    vault.write([("nan_gauge", {}, int(t), float(v)) for t, v in zip(ts, values, strict=True)])
    vault.maintain(now_ms=T0 + 4 * HOUR)
    memory = MemorySource()
    memory.add({"__name__": "nan_gauge"}, ts.tolist(), values.tolist())
    for expr in ("avg_over_time(nan_gauge[1h])", "count_over_time(nan_gauge[1m])"):
        got = Engine(vault).evaluate(expr, T0 + HOUR, T0 + 2 * HOUR, MIN)
        _agree(got, Engine(memory).evaluate(expr, T0 + HOUR, T0 + 2 * HOUR, MIN))
        assert got.served_by == set()
    # A bucket holding only a NaN sample is no row to aggregate queries.
    table = vault.query("nan_gauge", start=T0, end=T0 + 2 * HOUR, step="1m", output="arrow")
    assert table.num_rows == ts.size // 4
    vault.close()


def test_before_the_raw_horizon_rollups_answer_and_say_so(tmp_path: Path) -> None:
    from metricvault.store.vault import Vault

    day = 24 * HOUR
    now = T0 + 3 * day
    vault = Vault.open_local(str(tmp_path / "vault"), retention_raw="1d")
    memory = MemorySource()
    ts = T0 + np.arange(0, 3 * day, 15_000)
    energy = np.cumsum(np.random.default_rng(3).uniform(100, 400, ts.size))
    memory.add({"__name__": "energy_total"}, ts.tolist(), energy.tolist())
    vault.write([("energy_total", {}, int(t), float(v)) for t, v in zip(ts, energy, strict=True)])
    vault.maintain(now_ms=now)
    horizon = vault.catalog_version().raw_horizon_ms
    assert horizon and horizon > T0 + day  # the first day's raw samples are gone
    engine = Engine(vault)
    start, end = T0 + 2 * HOUR, T0 + 20 * HOUR
    # Whole hours: the 1h rows answer what the raw samples would have.
    got = engine.evaluate("rate(energy_total[1h])", start, end, HOUR)
    _agree(got, Engine(memory).evaluate("rate(energy_total[1h])", start, end, HOUR))
    assert got.served_by == {"1h"} and "raw horizon" in got.warnings[0]
    # Not whole minutes: each window moves to the whole minutes before it, so the value at
    # t is exactly the raw answer for the window ending at t rounded down to a minute.
    for expr in ("rate(energy_total[10m])", "increase(energy_total[90s])"):
        got = engine.evaluate(expr, start + 30_000, end, 30 * MIN)
        assert got.served_by == {"1m"} and "rounded down" in got.warnings[0]
        assert got.series[0][1].tolist() == list(range(start + 30_000, end, 30 * MIN))
        minutes = expr.replace("90s", "2m")  # lengths go to the nearest whole minute
        want = Engine(memory).evaluate(minutes, start, end - 30_000, 30 * MIN)
        assert np.allclose(got.series[0][2], want.series[0][2], rtol=1e-9)
    # Functions rollups cannot answer have only the raw samples after the horizon.
    assert engine.evaluate("irate(energy_total[5m])", start, end, HOUR).series == []
    vault.close()


class _OldRows(MemorySource):
    """A store holding one counter's rows as rollups wrote them before issue 13 (no first
    sample, no sample times), all before the raw horizon; its planner picks the 1h tier.
    ``laid_out``: it also hands over the rows laid end to end (BucketSelection.rows)."""

    def __init__(self, laid_out: bool = False) -> None:
        super().__init__()
        self.laid_out = laid_out

    def horizons(self) -> Horizons:
        return Horizons(T0 + 30 * 24 * HOUR, None, HOUR)

    def select_buckets(self, matchers, hints):
        ts = np.arange(T0, T0 + 3 * HOUR, HOUR)
        n = ts.size
        columns = {
            "ts": ts, "count": np.full(n, 60), "sum": np.full(n, 60.0), "min": np.ones(n),
            "max": np.ones(n), "first": np.full(n, np.nan), "first_ts": np.full(n, -1),
            "last": np.ones(n), "last_ts": np.full(n, -1), "increase": np.full(n, 6.0),
            "nonfinite": np.zeros(n, np.int64),
        }  # fmt: skip
        return BucketSelection(
            [SeriesBuckets({"__name__": "old_total"}, True, columns)],
            self.horizons().raw_start_ms, HOUR, ("1h",), HOUR, False, hints.range_ms,
            dict(columns) if self.laid_out else None,
        )  # fmt: skip


@pytest.mark.parametrize("laid_out", [False, True], ids=["series by series", "all rows at once"])
def test_rows_without_first_samples_answer_over_time_but_not_rate(laid_out: bool) -> None:
    from metricvault.promql.tiers import OLD_ROWS_NOTE

    engine = Engine(_OldRows(laid_out))
    got = engine.evaluate("sum_over_time(old_total[1h])", T0 + 2 * HOUR, T0 + 3 * HOUR, HOUR)
    assert got.series[0][2].tolist() == [60.0, 60.0]
    got = engine.evaluate("rate(old_total[1h])", T0 + 2 * HOUR, T0 + 3 * HOUR, HOUR)
    assert got.series == [] and OLD_ROWS_NOTE in got.warnings


def test_a_tier_no_coarser_than_the_scrape_interval_is_not_read(tmp_path: Path) -> None:
    """At a 60 s scrape a 1m row holds one sample: reading the tier would read as many rows
    as raw, and wider ones (bench/promql.py's 30-day workload), so raw samples answer."""
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path / "vault"))
    ts = T0 + np.arange(0, 6 * HOUR, 60_000)
    vault.write([("slow_total", {}, int(t), float(i)) for i, t in enumerate(ts)])
    vault.maintain(now_ms=T0 + 8 * HOUR)
    assert vault.samples_per_row("1m", T0, T0 + 6 * HOUR) == pytest.approx(1.0)
    engine = Engine(vault)
    assert (
        engine.evaluate("rate(slow_total[5m])", T0 + HOUR, T0 + 5 * HOUR, 5 * MIN).served_by
        == set()
    )
    assert engine.evaluate("rate(slow_total[1h])", T0 + HOUR, T0 + 5 * HOUR, HOUR).served_by == {
        "1h"
    }
    vault.close()


@pytest.fixture(scope="module")
def past_horizon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Engine, int]]:
    """Three days of a 15 s gauge with one day of raw retention: the first two days are
    rollup rows only."""
    from metricvault.store.vault import Vault

    day = 24 * HOUR
    vault = Vault.open_local(str(tmp_path_factory.mktemp("horizon") / "v"), retention_raw="1d")
    memory = MemorySource()
    ts = T0 + np.arange(0, 3 * day, 15_000)
    for gpu in range(2):
        util = np.round(np.random.default_rng(gpu).uniform(0, 100, ts.size), 1)
        memory.add({"__name__": "gpu_util", "gpu": str(gpu)}, ts.tolist(), util.tolist())
        rows = zip(ts.tolist(), util.tolist(), strict=True)
        vault.write([("gpu_util", {"gpu": str(gpu)}, t, v) for t, v in rows])
    vault.maintain(now_ms=T0 + 3 * day)
    horizon = vault.catalog_version().raw_horizon_ms
    assert horizon == T0 + 2 * day
    yield Engine(vault), Engine(memory), horizon
    vault.close()


@pytest.mark.parametrize(
    ("step", "tier", "lookback"),
    [
        (5 * MIN, "1m", None),  # every step's own minute holds its first sample
        (HOUR, "1h", "60 minutes"),  # one row per step; the lookback widens to the bucket
        (2 * HOUR, "1h", "60 minutes"),
    ],
)
def test_plain_selectors_past_the_raw_horizon_answer_from_rows(
    past_horizon, step, tier, lookback
) -> None:
    """Each step takes the latest of the buckets' first and last samples before it: a real
    sample at its own time; on a bucket boundary it is exactly the raw sample there."""
    rollups, raw, _ = past_horizon
    start, end = T0 + 2 * HOUR, T0 + 3 * 24 * HOUR - 5 * MIN
    got = rollups.evaluate("gpu_util", start, end, step)
    want = raw.evaluate("gpu_util", start, end, step)
    _agree(got, want)  # steps sit on whole minutes and hours: the bucket's first sample
    assert got.served_by == {tier}
    assert "answered from the " + tier in got.warnings[0]
    assert (lookback in got.warnings[0]) if lookback else ("lookback" not in got.warnings[0])


def test_plain_selectors_between_buckets_take_the_sample_before(past_horizon) -> None:
    rollups, raw, _ = past_horizon
    t = T0 + 5 * HOUR + 17 * MIN + 40_000  # neither a bucket's first nor last sample
    got = rollups.evaluate("timestamp(gpu_util)", t)
    stamps = [float(v[0]) for _, _, v in got.series]
    assert stamps == [(T0 + 5 * HOUR + 17 * MIN) / 1000] * 2  # its minute's first sample
    got = rollups.evaluate("gpu_util", t)
    assert [v[0] for _, _, v in got.series] == [
        v[0] for _, _, v in raw.evaluate("gpu_util", T0 + 5 * HOUR + 17 * MIN).series
    ]
    # An hour step off the hour: the first sample of the hour holding it (the 1h rows).
    got = rollups.evaluate("timestamp(gpu_util)", t, t + 2 * HOUR, HOUR)
    assert got.served_by == {"1h"}
    assert got.series[0][2].tolist() == [(T0 + h * HOUR) / 1000 for h in (5, 6, 7)]


def test_plain_selectors_within_raw_retention_are_unchanged(past_horizon) -> None:
    rollups, raw, horizon = past_horizon
    start = horizon + 5 * MIN + 7_000  # the lookback stays after the horizon
    got = rollups.evaluate("gpu_util", start, start + 6 * HOUR, 61_000)
    _agree(got, raw.evaluate("gpu_util", start, start + 6 * HOUR, 61_000))
    assert got.served_by == set() and got.warnings == []


def test_plain_selectors_across_the_horizon_join_rows_and_raw(past_horizon) -> None:
    rollups, raw, horizon = past_horizon
    got = rollups.evaluate("gpu_util", horizon - HOUR, horizon + HOUR, MIN)
    _agree(got, raw.evaluate("gpu_util", horizon - HOUR, horizon + HOUR, MIN))
    assert got.served_by == {"1m"}
    no_rollups = Engine(rollups.source, EngineOptions(use_rollups=False))
    blank = no_rollups.evaluate("gpu_util", horizon - HOUR, horizon + HOUR, MIN)
    assert blank.series[0][1].min() >= horizon  # without rows the old part is blank


@pytest.mark.parametrize("expr", ["rate(energy_total[75s])", "increase(energy_total[135s])"])
def test_rate_interval_windows_read_raw_unless_rounding_is_opted_in(engines, expr) -> None:
    """Grafana's $__rate_interval (step + scrape interval) is rarely whole minutes: within
    raw retention the answer stays Prometheus's unless ``round_windows`` is on; then each
    window moves to whole minutes, exactly the raw answer for the moved window, said so."""
    rollups, raw, vault = engines
    start, end = T0 + 2 * HOUR + 15_000, T0 + 4 * HOUR
    plain = rollups.evaluate(expr, start, end, 5 * MIN)
    _agree(plain, raw.evaluate(expr, start, end, 5 * MIN))
    assert plain.served_by == set() and plain.warnings == []
    rounding = Engine(vault, EngineOptions(round_windows=True))
    got = rounding.evaluate(expr, start, end, 5 * MIN)
    assert got.served_by == {"1m"} and "promql_round_windows is on" in got.warnings[0]
    moved = expr.replace("75s", "1m").replace("135s", "2m")  # 135 s: the nearest minute is 2
    want = raw.evaluate(moved, start - 15_000, end - 15_000, 5 * MIN)
    assert got.series[0][1].tolist() == plain.series[0][1].tolist()  # the steps asked for
    for (_, _, gv), (_, _, wv) in zip(got.series, want.series, strict=True):
        assert np.allclose(gv, wv, rtol=1e-9)


def test_round_windows_follows_the_setting() -> None:
    from metricvault.config import Settings

    settings = Settings.load(env={}, promql_round_windows=True)
    assert EngineOptions.from_settings(settings).round_windows
    assert not EngineOptions.from_settings(Settings.load(env={})).round_windows
