"""Spread past the raw horizon: each rollup row keeps ``m2`` (the sum of squared deviations
from its mean, merged with Chan's formula) and a DDSketch of its samples, so ``stddev``,
``stdvar`` and ``quantile_over_time`` and ``query --agg stddev,p50,p90,p95,p99`` answer from
the 1m/1h rows where raw samples are gone, within the documented bounds; within raw retention
PromQL still reads raw samples (Prometheus's exact answer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from metricvault.errors import UnsupportedError
from metricvault.model import (
    SKETCH_RELATIVE_ACCURACY,
    SketchMapping,
    sketch_mapping,
    sketch_quantile,
)
from metricvault.promql import Engine, MemorySource
from metricvault.store import query as q
from metricvault.store import rollup

HOUR = 3_600_000
MIN = 60_000
DAY = 24 * HOUR
T0 = (1_700_000_000_000 // DAY) * DAY
ALPHA = SKETCH_RELATIVE_ACCURACY


def _awkward(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Data on which naive sums of squares lose every digit, and other edge shapes."""
    return {
        "offset_1e9": 1e9 + rng.normal(0, 1e-3, n),  # spread 12 orders below the level
        "signed": rng.normal(0, 1, n) * np.where(rng.random(n) < 0.5, 1e-6, 1e6),
        "steps_0_1": (rng.random(n) < 0.3).astype(float),  # a 0/1 state metric
        "constant": np.full(n, 42.125),
        "ramp": np.arange(n, dtype=float) * 1e3 + 5e12,  # a counter-like level that grows
    }


@pytest.fixture(scope="module")
def vault_past_horizon(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[object, dict[str, np.ndarray], np.ndarray]]:
    """Three days of 15 s samples of each awkward series, one day of raw retention."""
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path_factory.mktemp("spread") / "v"), retention_raw="1d")
    ts = T0 + np.arange(0, 3 * DAY, 15_000)
    data = _awkward(np.random.default_rng(11), ts.size)
    rows = []
    for name, values in data.items():
        rows += [
            ("spread", {"shape": name}, t, v)
            for t, v in zip(ts.tolist(), values.tolist(), strict=True)
        ]
    vault.write(rows)
    vault.maintain(now_ms=T0 + 3 * DAY)
    assert vault.catalog_version().raw_horizon_ms == T0 + 2 * DAY
    yield vault, data, ts
    vault.close()


def test_stored_m2_matches_numpy_on_awkward_data(vault_past_horizon) -> None:
    vault, data, ts = vault_past_horizon
    for step in ("1m", "1h", "all", "7m"):  # the 1m rows, the 1h rows, merges of both
        table = vault.query(
            "spread", start=T0, end=T0 + 2 * DAY, step=step, aggs=["count", "stddev"],
            output="arrow",
        )  # fmt: skip
        width = {"1m": MIN, "1h": HOUR, "7m": 7 * MIN}.get(step)
        for name, values in data.items():
            mine = table.filter(pa.compute.equal(table["shape"], name))
            starts = mine["timestamp"].cast(pa.int64()).to_numpy()
            got = mine["stddev"].to_numpy()
            for start, value in zip(starts[:50], got[:50], strict=True):
                if width is None:
                    sel = (ts >= T0) & (ts < T0 + 2 * DAY)
                else:
                    sel = (ts >= max(start, T0)) & (ts < start + width) & (ts < T0 + 2 * DAY)
                want = np.std(values[sel])
                assert value == pytest.approx(want, rel=1e-9, abs=1e-9 * abs(values[sel]).max())


def test_the_vectorised_mapping_is_ddsketchs() -> None:
    from ddsketch.mapping import LogarithmicMapping

    mine, theirs = SketchMapping(ALPHA), LogarithmicMapping(ALPHA)
    rng = np.random.default_rng(5)
    values = np.concatenate([10 ** rng.uniform(-300, 300, 2000), rng.uniform(0, 100, 2000)])
    codes = mine.codes(values)
    keys = [theirs.key(float(v)) for v in values]
    assert (np.abs(codes) - rollup_bias() == np.array(keys)).mean() > 0.999  # ulps at edges
    back = mine.values(codes)
    assert np.allclose(back, [theirs.value(k) for k in keys], rtol=1e-12)
    assert (np.abs(back - values) <= ALPHA * values * (1 + 1e-12)).all()
    assert (mine.codes(-values) == -codes).all() and mine.codes(np.zeros(3)).tolist() == [0] * 3


def rollup_bias() -> int:
    from metricvault.model import SKETCH_BIAS

    return SKETCH_BIAS


@pytest.mark.parametrize("q_", [0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 1.0])
def test_sketch_quantiles_are_ddsketchs(q_: float) -> None:
    from ddsketch import LogCollapsingLowestDenseDDSketch

    rng = np.random.default_rng(int(q_ * 100))
    values = np.concatenate([rng.normal(0, 50, 3000), np.zeros(40), rng.uniform(1, 1e4, 500)])
    theirs = LogCollapsingLowestDenseDDSketch(ALPHA, bin_limit=100_000)
    for v in values:
        theirs.add(float(v))
    codes, counts = np.unique(sketch_mapping().codes(values), return_counts=True)
    assert sketch_quantile(codes, counts, q_) == pytest.approx(
        theirs.get_quantile_value(q_), rel=1e-12, abs=1e-300
    )


@pytest.mark.parametrize("agg", ["p50", "p90", "p95", "p99"])
@pytest.mark.parametrize("step", ["1m", "1h", "all", "7m"])
def test_query_quantiles_are_within_the_bound_on_every_tier(vault_past_horizon, agg, step) -> None:
    """Within 1 % of the sample at rank q (n - 1), before and after the raw horizon."""
    vault, data, ts = vault_past_horizon
    qv = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}[agg]
    start, end = T0 + 2 * DAY - 3 * HOUR, T0 + 2 * DAY + 3 * HOUR  # across the horizon
    table = vault.query("spread", start=start, end=end, step=step, aggs=[agg], output="arrow")
    width = {"1m": MIN, "1h": HOUR, "7m": 7 * MIN}.get(step)
    checked = 0
    for name, values in data.items():
        mine = table.filter(pa.compute.equal(table["shape"], name))
        for bucket, got in zip(
            mine["timestamp"].cast(pa.int64()).to_numpy()[:40],
            mine[agg].to_numpy()[:40],
            strict=True,
        ):
            # buckets are whole steps aligned to the epoch, as the query planner reads them
            lo, hi = (start, end) if width is None else (bucket, bucket + width)
            window = np.sort(values[(ts >= lo) & (ts < hi)])
            want = window[int(np.floor(qv * (window.size - 1)))]
            assert abs(got - want) <= ALPHA * abs(want) * (1 + 1e-9), (name, bucket, got, want)
            checked += 1
    assert checked >= len(data) * (1 if width is None else 5)


def test_p95_over_28_days_reads_the_hour_rows(tmp_path: Path) -> None:
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path / "v"), retention_raw="1d")
    ts = T0 + np.arange(0, 29 * DAY, 60_000)
    util = np.random.default_rng(2).gamma(4.0, 10.0, ts.size)
    vault.write([("util", {}, t, v) for t, v in zip(ts.tolist(), util.tolist(), strict=True)])
    vault.maintain(now_ms=T0 + 29 * DAY)
    table = vault.query(
        "util", start=T0, end=T0 + 28 * DAY, step="all", aggs=["p95", "p99"], output="arrow"
    )
    for agg, qv in (("p95", 0.95), ("p99", 0.99)):
        window = np.sort(util[ts < T0 + 28 * DAY])
        want = window[int(np.floor(qv * (window.size - 1)))]
        assert abs(table[agg][0].as_py() - want) <= ALPHA * want
    vault.close()


@pytest.mark.parametrize(
    "expr",
    [
        "stddev_over_time(spread[1h])",
        "stdvar_over_time(spread[10m])",
        "stddev_over_time(spread[75s])",  # not whole minutes: moved to whole minutes
    ],
)
def test_stddev_and_stdvar_past_the_horizon_match_raw(vault_past_horizon, expr) -> None:
    vault, data, ts = vault_past_horizon
    memory = MemorySource()
    for name, values in data.items():
        memory.add({"__name__": "spread", "shape": name}, ts.tolist(), values.tolist())
    start, end = T0 + 2 * HOUR, T0 + 30 * HOUR
    got = Engine(vault).evaluate(expr, start, end, HOUR)
    want = Engine(memory).evaluate(expr.replace("75s", "1m"), start, end, HOUR)
    assert got.served_by and "raw horizon" in got.warnings[0]
    assert [s[0] for s in got.series] == [s[0] for s in want.series]
    for (labels, _, gv), (_, _, wv) in zip(got.series, want.series, strict=True):
        scale = np.abs(data[labels["shape"]]).max()
        power = 2 if "stdvar" in expr else 1
        assert np.allclose(gv, wv, rtol=1e-7, atol=1e-12 * scale**power), labels


def test_quantile_over_time_past_the_horizon_is_within_the_bound(vault_past_horizon) -> None:
    vault, data, ts = vault_past_horizon
    got = Engine(vault).evaluate(
        "quantile_over_time(0.95, spread[1h])", T0 + 2 * HOUR, T0 + 30 * HOUR, HOUR
    )
    assert got.served_by == {"1h"} and any("1 % of" in w for w in got.warnings)
    for labels, steps, values in got.series:
        series = data[labels["shape"]]
        for t, value in zip(steps.tolist(), values.tolist(), strict=True):
            window = np.sort(series[(ts >= t - HOUR) & (ts <= t)])
            want = window[int(np.floor(0.95 * (window.size - 1)))]
            assert abs(value - want) <= ALPHA * abs(want) * (1 + 1e-9), (labels, t)


def test_within_raw_retention_spread_functions_read_raw(vault_past_horizon) -> None:
    """Steps whose windows start after the horizon are Prometheus's exact answers."""
    vault, data, ts = vault_past_horizon
    memory = MemorySource()
    for name, values in data.items():
        memory.add({"__name__": "spread", "shape": name}, ts.tolist(), values.tolist())
    horizon = T0 + 2 * DAY
    expr = "quantile_over_time(0.9, spread[1h])"
    within = Engine(vault).evaluate(expr, horizon + HOUR, horizon + 6 * HOUR, HOUR)
    assert within.served_by == set() and within.warnings == []
    # Across the horizon: the old steps from rows, the new ones exactly the raw answer.
    across = Engine(vault).evaluate(expr, horizon - 2 * HOUR, horizon + 6 * HOUR, HOUR)
    want = Engine(memory).evaluate(expr, horizon - 2 * HOUR, horizon + 6 * HOUR, HOUR)
    for (_, gt, gv), (_, wt, wv) in zip(across.series, want.series, strict=True):
        assert gt.tolist() == wt.tolist()
        new = gt >= horizon + HOUR
        assert gv[new].tolist() == wv[new].tolist()
        assert np.allclose(gv[~new], wv[~new], rtol=2 * ALPHA)


class _NoSketches:
    """A reader whose rows keep no m2 or sketch (InfluxDB's continuous queries)."""

    def partials(self, *args: object) -> pa.Table:
        return rollup.empty_partials()


def test_stores_without_sketches_refuse_spread_aggregates() -> None:
    with pytest.raises(UnsupportedError, match="p95"):
        q.read_partials(_NoSketches(), [1], 0, HOUR, MIN, ["mean", "p95"])
    assert q.read_partials(_NoSketches(), [1], 0, HOUR, MIN, ["mean"]).num_rows == 0


def test_rows_without_m2_or_sketch_are_left_out_and_said(tmp_path: Path) -> None:
    """Rows an older version wrote (no m2, no sketch): the spread functions leave those
    steps out, with a warning, rather than answer from part of the data."""
    from metricvault.promql.tiers import SPREAD_NOTE
    from metricvault.protocols import BucketSelection, Horizons, SeriesBuckets

    class OldRows(MemorySource):
        def horizons(self) -> Horizons:
            return Horizons(T0 + 30 * DAY, None, HOUR)

        def select_buckets(self, matchers, hints):
            ts = np.arange(T0, T0 + 3 * HOUR, HOUR)
            n = ts.size
            columns = {
                "ts": ts, "count": np.full(n, 60), "sum": np.full(n, 60.0), "min": np.ones(n),
                "max": np.ones(n), "first": np.ones(n), "first_ts": ts, "last": np.ones(n),
                "last_ts": ts + HOUR - 60_000, "increase": np.full(n, np.nan),
                "nonfinite": np.zeros(n, np.int64), "m2": np.full(n, np.nan),
                "sketch_start": np.zeros(n, np.int64), "sketch_end": np.zeros(n, np.int64),
                "sketch_held": np.zeros(n, bool), "sketch_codes": np.zeros(0, np.int64),
                "sketch_counts": np.zeros(0, np.int64),
            }  # fmt: skip
            return BucketSelection(
                [SeriesBuckets({"__name__": "old"}, False, columns)],
                self.horizons().raw_start_ms, HOUR, ("1h",), HOUR, False, hints.range_ms,
            )  # fmt: skip

    for expr in ("stddev_over_time(old[1h])", "quantile_over_time(0.5, old[1h])"):
        got = Engine(OldRows()).evaluate(expr, T0 + 2 * HOUR, T0 + 3 * HOUR, HOUR)
        assert got.series == [] and SPREAD_NOTE in got.warnings


def test_a_label_named_like_a_new_aggregate_is_written_and_only_that_aggregate_refused(
    tmp_path: Path,
) -> None:
    """Senders whose series carry a ``p99`` or ``stddev`` label keep writing; asking for the
    aggregate of that name over them is refused, as its column would hide the label."""
    from metricvault import Vault
    from metricvault.errors import InputError

    with Vault.open_local(str(tmp_path / "v")) as vault:
        rows = [("lat", {"p99": "yes", "stddev": "x"}, T0 + i * 5_000, float(i)) for i in range(24)]
        assert vault.write(rows) == 24
        means = vault.query("lat", T0, T0 + 120_000, step="1m", aggs=["mean"], output="arrow")
        assert means.column("p99").to_pylist() == ["yes", "yes"]
        with pytest.raises(InputError, match="p99 would hide the label"):
            vault.query("lat", T0, T0 + 120_000, step="1m", aggs=["p99"], output="arrow")
