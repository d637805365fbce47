"""Property tests: the vault answers as a plain-pandas reference computed from what was written.

Workloads are random (hypothesis): gauges and counters (``*_total``), irregular timestamps over
three days from 2026-01-01 with gaps around the counter lookback, out-of-order writes split over
several ``write`` calls in three input forms, duplicates (the later write wins), counter resets,
decimal and arbitrary float values, and flushes/maintenance between writes. The reference below
implements the documented semantics independently of ``metricvault.store``:

- raw query: the deduplicated samples in ``[start, end)``, values bit-exact;
- step ``S``: bucket ``floor(ts/S)*S`` over ``[floor(start/S)*S, ceil(end/S)*S)``; ``"all"``: one
  bucket ``[start, end)`` stamped ``start``;
- ``count, sum, min, max, mean = sum/count, last`` (value at the bucket's latest ts);
- ``increase`` (counters only): per sample, ``v - prev`` (or ``v`` after a reset) where ``prev`` is
  the series' previous sample at most ``lookback`` (1 h) older, anywhere in time; else 0.

Properties: answers before and after ``maintain`` (raw, mixed, rollups), retention (raw dropped
only once rolled up; the 1m/1h tiers answer the same afterwards), stitching of rollups and raw
across the raw-retention horizon, bit-exact round trips. Deterministic cases pin late writes at
the raw horizon (refused, or answered exactly) and a two-gateway case (rollups stay final;
the late sample is kept in raw).
Set ORACLE_EXAMPLES=N for more examples, ORACLE_SHRINK=1 to minimise a failure.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from metricvault.errors import ValueRangeError
from metricvault.store import maintenance
from metricvault.store.buffer import IngestBuffer
from metricvault.store.vault import Vault

MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPAN = 3 * DAY
LOOKBACK = HOUR  # default counter_lookback
NOW_KEEP = T0 + 5 * DAY  # maintenance "now" at which raw retention (30 d) keeps everything
NOW_DROP_ALL = T0 + 40 * DAY  # ... at which every raw day of the workload is past retention
NOW_DROP_2 = T0 + 32 * DAY  # ... at which the first two days (day_end <= T0 + 2 d) are past it
SELECT_ALL = '{__name__=~".+"}'
AGGS = ("mean", "min", "max", "count", "sum", "last", "increase")
STEPS = ("30s", "1m", "5m", "1h", "1d", "all")
STEP_MS = {"30s": 30_000, "1m": MINUTE, "5m": 5 * MINUTE, "1h": HOUR, "1d": DAY}
ROLLUP_STEPS = ("1m", "5m", "1h", "1d", "all")  # served by the 1m/1h tiers when aligned
REL = 1e-9

# (metric, labels); a name ending in _total is a counter.
SERIES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("gpu_temp", (("host", "a"),)),
    ("gpu_temp", (("gpu", "0"), ("host", "b"))),
    ("mem_used", ()),
    ("req_total", (("host", "a"),)),
    ("bytes_total", (("gpu", "1"), ("host", "b"))),
)
KEY_OF = {(m, labels): i for i, (m, labels) in enumerate(SERIES)}
COUNTERS = frozenset(i for i, (m, _) in enumerate(SERIES) if m.endswith("_total"))
LABEL_NAMES = ("gpu", "host")


# ---------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    rows: list[tuple[int, int, float]]  # (series index, ts ms, value) in write order
    cuts: list[int]  # write() boundaries: rows[cuts[i]:cuts[i+1]]
    actions: list[str]  # after each chunk: "", "flush" or "maintain"
    forms: list[str]  # input form of each chunk: "tuples", "pandas" or "arrow"

    def chunks(self) -> Iterator[tuple[list[tuple[int, int, float]], str, str]]:
        bounds = [0, *self.cuts, len(self.rows)]
        for i in range(len(bounds) - 1):
            yield self.rows[bounds[i] : bounds[i + 1]], self.forms[i], self.actions[i]


decimal_values = st.builds(
    round, st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), st.integers(0, 4)
)
any_floats = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, allow_infinity=False)
values = st.one_of(decimal_values, decimal_values, any_floats)
gaps = st.one_of(
    st.integers(1, 2_000),
    st.integers(1_000, 120_000),
    st.integers(LOOKBACK - 3, LOOKBACK + 3),  # around the counter lookback
    st.integers(LOOKBACK - 5_000, LOOKBACK + 5_000),
    st.integers(10 * MINUTE, 6 * HOUR),
)
snaps = st.sampled_from([0, 0, 0, 0, MINUTE, HOUR, DAY])


@st.composite
def series_samples(
    draw: st.DrawFn, counter: bool, lo: int, hi: int, max_n: int
) -> list[tuple[int, float]]:
    """Samples of one series in ``[lo, hi)``: an irregular walk, wrapped around (so writes go
    back in time), sometimes snapped next to minute/hour/day boundaries."""
    n = draw(st.integers(1, max_n))
    t = lo + draw(st.integers(0, hi - lo - 1))
    v = draw(decimal_values.map(abs))
    out = []
    for _ in range(n):
        t += draw(gaps)
        ts = lo + (t - lo) % (hi - lo)
        snap = draw(snaps)
        if snap:
            ts = min(max(ts // snap * snap + draw(st.sampled_from([-1, 0, 1])), lo), hi - 1)
        if counter:
            how = draw(st.sampled_from(["inc", "inc", "inc", "inc", "reset", "any"]))
            if how == "inc":
                v = v + draw(decimal_values.map(abs))
            elif how == "reset":
                v = draw(st.sampled_from([0.0, 1.0, 0.5]))
            else:
                v = draw(values)
        else:
            v = draw(values)
        out.append((ts, v))
    return out


@st.composite
def workloads(
    draw: st.DrawFn, lo: int = T0, hi: int = T0 + SPAN, max_n: int = 60, maintain: bool = True
) -> Workload:
    chosen = draw(st.sets(st.integers(0, len(SERIES) - 1), min_size=1))
    rows: list[tuple[int, int, float]] = []
    for s in sorted(chosen):
        samples = draw(series_samples(s in COUNTERS, lo, hi, max_n))
        rows += [(s, ts, v) for ts, v in samples]
        for i in draw(st.lists(st.integers(0, len(samples) - 1), max_size=len(samples) // 3)):
            rows.append((s, samples[i][0], draw(values)))  # same key again: later write wins
    order = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in order]
    n_chunks = draw(st.integers(1, min(5, len(rows))))
    cuts = (
        sorted(draw(st.sets(st.integers(1, len(rows) - 1), max_size=n_chunks - 1)))
        if len(rows) > 1
        else []
    )
    kinds = ["", "", "flush", "maintain"] if maintain else ["", "flush"]
    actions = [draw(st.sampled_from(kinds)) for _ in range(len(cuts) + 1)]
    forms = [draw(st.sampled_from(["tuples", "pandas", "arrow"])) for _ in range(len(cuts) + 1)]
    return Workload(rows, cuts, actions, forms)


def to_input(rows: Sequence[tuple[int, int, float]], form: str) -> Any:
    if form == "tuples":
        return [(SERIES[s][0], dict(SERIES[s][1]), ts, v) for s, ts, v in rows]
    labels = {n: [dict(SERIES[s][1]).get(n) for s, _, _ in rows] for n in LABEL_NAMES}
    metric = [SERIES[s][0] for s, _, _ in rows]
    ts = [t for _, t, _ in rows]
    value = [v for _, _, v in rows]
    if form == "pandas":
        return pd.DataFrame({"metric": metric, "timestamp": ts, "value": value, **labels})
    return pa.table(
        {
            "metric": pa.array(metric, pa.string()),
            "timestamp": pa.array(ts, pa.timestamp("ms", tz="UTC")),
            "value": pa.array(value, pa.float64()),
            **{n: pa.array(v, pa.string()) for n, v in labels.items()},
        }
    )


def apply(vault: Vault, workload: Workload, now: int = NOW_KEEP) -> None:
    for rows, form, action in workload.chunks():
        assert vault.write(to_input(rows, form)) == len(rows)
        if action == "flush":
            vault.flush()
        elif action == "maintain":
            vault.maintain(now_ms=now)


@contextmanager
def fresh_vault(**overrides: Any) -> Iterator[Vault]:
    with tempfile.TemporaryDirectory(prefix="mv-oracle-") as tmp:
        vault = Vault.open_local(str(tmp), **overrides)
        try:
            yield vault
        finally:
            vault.close()


# ---------------------------------------------------------------------------- reference
def reference_samples(rows: Sequence[tuple[int, int, float]]) -> pd.DataFrame:
    """Last-write-wins dedup, sorted by (key, ts), with each counter sample's ``delta``."""
    df = pd.DataFrame(rows, columns=["key", "ts", "value"])
    df = df.drop_duplicates(["key", "ts"], keep="last").sort_values(["key", "ts"])
    df = df.reset_index(drop=True)
    grouped = df.groupby("key", sort=False)
    prev_v = grouped["value"].shift()
    prev_ts = grouped["ts"].shift()
    fresh = prev_v.isna() | (df["ts"] - prev_ts > LOOKBACK)
    rise = np.where(df["value"] >= prev_v, df["value"] - prev_v, df["value"])
    delta = np.where(fresh, 0.0, rise)
    df["delta"] = np.where(df["key"].isin(list(COUNTERS)), delta, np.nan)
    return df


Bucket = dict[str, Any]  # count, sum, min, max, last, mean, increase (+ abs scales)


def reference_buckets(
    ref: pd.DataFrame, start: int, end: int, step: str
) -> dict[tuple[int, int], Bucket]:
    if step == "all":
        lo, hi = start, end
    else:
        width = STEP_MS[step]
        lo, hi = start // width * width, -(-end // width) * width
    sel = ref[(ref["ts"] >= lo) & (ref["ts"] < hi)].copy()
    sel["bucket"] = lo if step == "all" else sel["ts"] // width * width
    out: dict[tuple[int, int], Bucket] = {}
    for (key, bucket), grp in sel.groupby(["key", "bucket"], sort=True):
        vals = grp["value"].to_numpy()
        row: Bucket = {
            "count": len(vals),
            "sum": math.fsum(vals),
            "min": float(vals.min()),
            "max": float(vals.max()),
            "last": float(vals[np.argmax(grp["ts"].to_numpy())]),
            "abs": math.fsum(np.abs(vals)),
        }
        row["mean"] = row["sum"] / row["count"]
        if key in COUNTERS:
            deltas = grp["delta"].to_numpy()
            row["increase"] = math.fsum(deltas)
            row["inc_abs"] = math.fsum(np.abs(deltas))
        else:
            row["increase"] = None
        out[(int(key), int(bucket))] = row  # type: ignore[call-overload]
    return out


# ---------------------------------------------------------------------------- checks
def _keys(df: pd.DataFrame) -> list[int]:
    labels = [c for c in df.columns if c in LABEL_NAMES]
    keys = []
    for rec in df[["metric", *labels]].itertuples(index=False):
        found = tuple(
            sorted((n, v) for n, v in zip(labels, rec[1:], strict=True) if isinstance(v, str))
        )
        keys.append(KEY_OF[(rec[0], found)])
    return keys


def _ms(df: pd.DataFrame) -> np.ndarray:
    col = df["timestamp"]
    assert isinstance(col.dtype, pd.DatetimeTZDtype), col.dtype
    assert str(col.dtype.tz) == "UTC", col.dtype
    return ((col - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")).to_numpy(np.int64)


def _check_shape(df: pd.DataFrame, keys: list[int], value_cols: Sequence[str]) -> None:
    present = sorted({n for k in set(keys) for n, _ in SERIES[k][1]})
    assert list(df.columns) == ["timestamp", "metric", *present, *value_cols]
    ts = _ms(df)
    for k in set(keys):
        mine = ts[np.asarray(keys) == k]
        assert (np.diff(mine) > 0).all(), f"series {SERIES[k]} rows not sorted by time"


def check_raw(vault: Vault, ref: pd.DataFrame, start: int, end: int) -> None:
    got = vault.query(SELECT_ALL, start, end)
    want = ref[(ref["ts"] >= start) & (ref["ts"] < end)]
    keys = _keys(got)
    _check_shape(got, keys, ["value"])
    got_set = {
        (k, int(t)): float(v)
        for k, t, v in zip(keys, _ms(got), got["value"].to_numpy(), strict=True)
    }
    assert len(got_set) == len(got), "raw query returned a (series, ts) twice"
    want_set = {
        (int(k), int(t)): float(v)
        for k, t, v in zip(want["key"], want["ts"], want["value"], strict=True)
    }
    assert got_set.keys() == want_set.keys(), (
        f"missing {sorted(want_set.keys() - got_set.keys())[:5]}, "
        f"extra {sorted(got_set.keys() - want_set.keys())[:5]}"
    )
    for key, v in want_set.items():
        bits_got = np.float64(got_set[key]).view(np.int64)
        assert bits_got == np.float64(v).view(np.int64), f"{key}: {got_set[key]!r} != {v!r}"


def _close(got: float, want: float, scale: float) -> bool:
    return math.isclose(got, want, rel_tol=REL, abs_tol=REL * scale)


def check_step(vault: Vault, ref: pd.DataFrame, start: int, end: int, step: str) -> None:
    got = vault.query(SELECT_ALL, start, end, step=step, aggs=AGGS)
    want = reference_buckets(ref, start, end, step)
    keys = _keys(got) if len(got) else []
    _check_shape(got, keys, AGGS)
    where = f"step={step} [{start}, {end})"
    got_rows = {
        (k, int(t)): rec for k, t, rec in zip(keys, _ms(got), got.to_dict("records"), strict=True)
    }
    assert len(got_rows) == len(got), f"{where}: a (series, bucket) appears twice"
    assert got_rows.keys() == want.keys(), (
        f"{where}: missing {sorted(want.keys() - got_rows.keys())[:5]}, "
        f"extra {sorted(got_rows.keys() - want.keys())[:5]}"
    )
    for key, w in want.items():
        g = got_rows[key]
        label = f"{where} series={SERIES[key[0]]} bucket={key[1]}"
        assert g["count"] == w["count"], f"{label}: count {g['count']} != {w['count']}"
        for agg in ("min", "max", "last"):  # selections: must be exact
            assert g[agg] == w[agg], f"{label}: {agg} {g[agg]!r} != {w[agg]!r}"
        assert _close(g["sum"], w["sum"], w["abs"]), f"{label}: sum {g['sum']!r} != {w['sum']!r}"
        assert _close(g["mean"], w["mean"], w["abs"] / w["count"]), (
            f"{label}: mean {g['mean']!r} != {w['mean']!r}"
        )
        if w["increase"] is None:
            assert pd.isna(g["increase"]), f"{label}: gauge has increase {g['increase']!r}"
        else:
            assert _close(g["increase"], w["increase"], w["inc_abs"]), (
                f"{label}: increase {g['increase']!r} != {w['increase']!r}"
            )


def check_all_steps(
    vault: Vault, ref: pd.DataFrame, ranges: Sequence[tuple[int, int]], steps: Sequence[str]
) -> None:
    for start, end in ranges:
        for step in steps:
            check_step(vault, ref, start, end, step)


# random query ranges: unaligned ms edges around the data
edges = st.integers(T0 - HOUR, T0 + SPAN + HOUR)
ranges = st.tuples(edges, edges).filter(lambda r: r[0] != r[1]).map(sorted).map(tuple)
minute_ranges = ranges.map(lambda r: (r[0] // MINUTE * MINUTE, -(-r[1] // MINUTE) * MINUTE))
ALIGNED = (T0, T0 + 4 * DAY)
# Shrinking re-runs whole vault workloads and can take many minutes, so it is off unless
# ORACLE_SHRINK=1 (a failure then prints the unshrunk example; rerun with shrinking to minimise).
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
if os.environ.get("ORACLE_SHRINK"):
    PHASES.append(Phase.shrink)
# workloads a property: 12 under the suite's ``ci`` profile, 250 under ``thorough``
# (tests/conftest.py); ORACLE_EXAMPLES=N sets it
DEFAULT_EXAMPLES = "250" if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else "12"
HYPO = settings(
    max_examples=int(os.environ.get("ORACLE_EXAMPLES", DEFAULT_EXAMPLES)),
    deadline=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------------------- properties
@HYPO
@given(workload=workloads(), span=ranges)
def test_queries_match_reference_before_and_after_maintain(
    workload: Workload, span: tuple[int, int]
) -> None:
    ref = reference_samples(workload.rows)
    with fresh_vault() as vault:
        apply(vault, workload)
        # before the final maintain: partly rolled up (if a chunk maintained), partly raw
        check_raw(vault, ref, *ALIGNED)
        check_raw(vault, ref, *span)
        check_all_steps(vault, ref, [ALIGNED, span], STEPS)
        vault.maintain(now_ms=NOW_KEEP)
        assert vault.snapshot().dirty_hours == ()
        check_raw(vault, ref, *span)
        check_all_steps(vault, ref, [ALIGNED, span], STEPS)


@HYPO
@given(workload=workloads(maintain=False), span=minute_ranges)
def test_retention_drops_raw_only_after_rollup(workload: Workload, span: tuple[int, int]) -> None:
    ref = reference_samples(workload.rows)
    with fresh_vault() as vault:
        apply(vault, workload)
        with pytest.MonkeyPatch.context() as mp:
            # a maintain whose rollup step did nothing must not drop the unrolled raw data
            mp.setattr(maintenance, "roll_up", lambda vault, bar=None: 0)
            vault.maintain(now_ms=NOW_DROP_ALL)
        assert vault.snapshot().dirty_hours, "the no-op rollup should leave dirty hours"
        check_raw(vault, ref, *ALIGNED)
        vault.maintain(now_ms=NOW_DROP_ALL)
        snap = vault.snapshot()
        assert snap.tier_files("raw") == [], "raw past retention should be gone once rolled up"
        assert snap.raw_horizon_ms > 0
        assert len(vault.query(SELECT_ALL, *ALIGNED)) == 0
        # steps that are whole minutes, on minute-aligned ranges, come from the 1m/1h tiers
        check_all_steps(vault, ref, [ALIGNED, span], ROLLUP_STEPS)


# new data for the stitching test: from the first writable time on (raw horizon + counter
# lookback, hour-aligned); older writes are refused, see the *_is_refused_or_exact tests
STITCH_LO = T0 + 2 * DAY + HOUR


@HYPO
@given(
    old=workloads(max_n=40),
    new=workloads(lo=STITCH_LO, hi=T0 + 4 * DAY, max_n=30, maintain=False),
    span=minute_ranges,
)
def test_tiers_stitch_across_raw_horizon(
    old: Workload, new: Workload, span: tuple[int, int]
) -> None:
    with fresh_vault() as vault:
        apply(vault, old)
        vault.maintain(now_ms=NOW_KEEP)
        vault.maintain(now_ms=NOW_DROP_2)  # raw of days 0 and 1 is now gone
        assert all(f.day >= "2026-01-03" for f in vault.snapshot().tier_files("raw"))
        apply(vault, new)  # not rolled up yet: the newer part is served from raw
        ref = reference_samples(old.rows + new.rows)
        whole = (T0, T0 + 4 * DAY)
        check_raw(vault, ref, T0 + 2 * DAY, T0 + 4 * DAY)
        check_all_steps(vault, ref, [whole, span], ROLLUP_STEPS)
        vault.maintain(now_ms=NOW_DROP_2)
        assert vault.snapshot().dirty_hours == ()
        check_all_steps(vault, ref, [whole, span], ROLLUP_STEPS)


@HYPO
@given(
    vals=st.lists(
        st.floats(allow_nan=False, allow_infinity=False) | decimal_values, min_size=1, max_size=50
    )
)
def test_raw_values_round_trip_bit_exact(vals: list[float]) -> None:
    """Any finite double (subnormals, -0.0, 1e308, decimals) comes back with the same bits,
    from the flushed file and from the compacted one."""
    rows = [(0, T0 + i * 1000, v) for i, v in enumerate(vals)]
    ref = reference_samples(rows)
    with fresh_vault() as vault:
        vault.write(to_input(rows[: len(rows) // 2], "tuples"))
        vault.flush()
        vault.write(to_input(rows[len(rows) // 2 :], "arrow"))
        check_raw(vault, ref, T0, T0 + DAY)
        vault.maintain(now_ms=NOW_KEEP)
        check_raw(vault, ref, T0, T0 + DAY)


# ---------------------------------------------------------------------------- deterministic cases
def _counter_rows(
    start: int, n: int, every: int, first: float = 0.0
) -> list[tuple[int, int, float]]:
    return [(3, start + i * every, first + 10.0 * i) for i in range(n)]


def test_reference_sanity() -> None:
    """The reference itself, on a hand-checked counter with a reset and a lookback gap."""
    rows = [(3, T0, 5.0), (3, T0 + MINUTE, 8.0), (3, T0 + 2 * MINUTE, 2.0)]
    rows += [(3, T0 + 2 * MINUTE + LOOKBACK, 4.0), (3, T0 + 2 * MINUTE + 2 * LOOKBACK + 1, 9.0)]
    rows += [(3, T0 + MINUTE, 7.0)]  # rewrite: later wins
    ref = reference_samples(rows)
    assert ref["delta"].tolist() == [0.0, 2.0, 2.0, 2.0, 0.0]
    buckets = reference_buckets(ref, T0, T0 + DAY, "all")
    assert buckets[(3, T0)]["increase"] == 6.0
    assert buckets[(3, T0)]["count"] == 5
    assert buckets[(3, T0)]["last"] == 9.0
    with fresh_vault() as vault:
        vault.write(to_input(rows, "tuples"))
        check_all_steps(vault, ref, [(T0, T0 + DAY)], STEPS)
        vault.maintain(now_ms=NOW_KEEP)
        check_all_steps(vault, ref, [(T0, T0 + DAY)], STEPS)


def _write_or_refused(vault: Vault, rows: list[tuple[int, int, float]]) -> bool:
    """Write ``rows``; False if the vault refused them (then it must be unchanged)."""
    before = vault.snapshot().version, vault.buffer.depth()
    try:
        vault.write(to_input(rows, "tuples"))
    except ValueRangeError as exc:
        assert "retention" in str(exc), exc
        assert (vault.snapshot().version, vault.buffer.depth()) == before
        return False
    return True


def _rows_every(series: int, start: int, n: int, every: int) -> list[tuple[int, int, float]]:
    return [(series, start + i * every, float(i % 7)) for i in range(n)]


def test_counter_write_next_to_raw_horizon_is_refused_or_exact() -> None:
    """A counter sampled every 10 min across the day-1/day-2 boundary; raw of day 1 expires.
    A late sample in day 2's first hour would make that hour be re-rolled without the sample
    before it (in expired raw): the vault must refuse it, or keep the answers exact. A sample
    at the first writable hour must be taken, and answered exactly."""
    old = _counter_rows(T0 + DAY + 20 * HOUR, 30, 10 * MINUTE)  # day 1 20:00 .. day 2 00:50
    with fresh_vault() as vault:
        vault.write(to_input(old, "tuples"))
        vault.maintain(now_ms=NOW_KEEP)
        vault.maintain(now_ms=NOW_DROP_2)
        assert vault.snapshot().raw_horizon_ms == T0 + 2 * DAY
        late = [(3, T0 + 2 * DAY + 5 * MINUTE, 245.0)]  # between 00:00 (240) and 00:10 (250)
        taken = old + (late if _write_or_refused(vault, late) else [])
        first_ok = [(3, T0 + 2 * DAY + LOOKBACK, 400.0)]  # horizon + lookback: writable
        assert _write_or_refused(vault, first_ok)
        ref = reference_samples(taken + first_ok)
        check_all_steps(vault, ref, [(T0, T0 + 4 * DAY)], ("1m", "1h", "1d"))
        vault.maintain(now_ms=NOW_DROP_2)
        check_all_steps(vault, ref, [(T0, T0 + 4 * DAY)], ("1m", "1h", "1d"))


@pytest.mark.parametrize("resend", [False, True], ids=["new-key", "duplicate-delivery"])
def test_write_before_raw_horizon_is_refused_or_exact(resend: bool) -> None:
    """After every raw day expired, a late sample (a new key, or a re-sent one) into day 0
    must be refused, or counted exactly (not twice) both before and after maintain."""
    rows = _rows_every(0, T0, 3 * 24 * 12, 5 * MINUTE)
    late = rows[:12] if resend else [(0, T0 + 2 * MINUTE + 1, 3.5)]
    with fresh_vault() as vault:
        vault.write(to_input(rows, "tuples"))
        vault.maintain(now_ms=NOW_DROP_ALL)
        taken = rows + (late if _write_or_refused(vault, late) else [])
        ref = reference_samples(taken)
        check_all_steps(vault, ref, [(T0, T0 + 4 * DAY)], ("1h", "1d"))
        vault.maintain(now_ms=NOW_DROP_ALL)
        check_all_steps(vault, ref, [(T0, T0 + 4 * DAY)], ("1h", "1d"))


def _second_gateway(vault_dir: str) -> Vault:
    """Another gateway on the same vault with its own ingest buffer on another machine — what
    several gateways on object storage are (each has its own ``state_dir``), so the first
    gateway cannot see (and flush) it. Locally the buffer is swapped in by hand, outside
    ``state/`` (buffers there are flushed by every maintain)."""
    other = Vault.open_local(vault_dir)
    other.buffer.close()
    elsewhere = Path(vault_dir).parent / (Path(vault_dir).name + "-machine-b")
    elsewhere.mkdir()
    other.buffer = IngestBuffer(elsewhere / "buffer.sqlite")
    return other


@pytest.mark.parametrize("where", ["before-horizon", "within-lookback"])
def test_sample_buffered_by_other_gateway_across_retention_leaves_rollups_intact(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Gateway B acknowledges a sample (writable at that moment); gateway A's maintain then
    expires raw days; B flushes. Rollups there are final and must lose nothing; the late sample
    is kept in raw (not rolled up) and a warning says so."""
    if where == "before-horizon":
        old = _rows_every(0, T0, 3 * 24 * 12, 5 * MINUTE)
        late, now = [(0, T0 + 2 * MINUTE + 1, 3.5)], NOW_DROP_ALL
    else:
        old = _counter_rows(T0 + DAY + 20 * HOUR, 30, 10 * MINUTE)
        late, now = [(3, T0 + 2 * DAY + 5 * MINUTE, 245.0)], NOW_DROP_2
    ref = reference_samples(old)
    with tempfile.TemporaryDirectory(prefix="mv-oracle-") as tmp:
        # B's buffer goes beside the vault, inside the temporary directory, so it is removed too
        vault_dir = str(Path(tmp) / "vault")
        gateway_a, gateway_b = Vault.open_local(vault_dir), _second_gateway(vault_dir)
        try:
            gateway_a.write(to_input(old, "tuples"))
            gateway_a.maintain(now_ms=NOW_KEEP)
            gateway_b.write(to_input(late, "tuples"))  # acknowledged: durable in B's buffer
            gateway_a.maintain(now_ms=now)  # expires raw; B's sample is not flushed yet
            with caplog.at_level("WARNING", logger="metricvault"):
                gateway_b.flush()
            assert "not rolled up" in caplog.text
            kept = gateway_a.query(SELECT_ALL, late[0][1], late[0][1] + 1)
            assert kept["value"].tolist() == [late[0][2]]  # in raw until retention drops it
            gateway_a.maintain(now_ms=now)
            check_all_steps(gateway_a, ref, [(T0, T0 + 4 * DAY)], ("1h", "1d"))
        finally:
            gateway_b.close()
            gateway_a.close()
