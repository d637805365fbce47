"""Behaviour of the embedded store: inputs, atomic bad input, exactly-once, tiers, retention."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from metricvault import Vault
from metricvault.config import RetentionOverride
from metricvault.errors import InputError, LabelError, SelectorError, ValueRangeError
from metricvault.store import maintenance
from metricvault.store import vault as vault_module
from metricvault.store.catalog import Catalog, Change, Snapshot
from metricvault.store.query import Segment, plan

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
H = 3_600_000
D = 86_400_000


def gauge_rows(n=720, series=2, start=T0, step=5000):
    return [
        (
            "gpu_util",
            {"gpu": str(g), "Hostname": "node01"},
            start + i * step,
            float((i * 7 + g) % 101),
        )
        for g in range(series)
        for i in range(n)
    ]


@pytest.fixture
def vault(tmp_path):
    with Vault.open_local(str(tmp_path / "v")) as v:
        yield v


def test_accepts_tuples_arrow_pandas_polars_and_datetimes(vault):
    rows = gauge_rows(10, 1)
    frame = pd.DataFrame(
        {
            "metric": ["m_pd"] * 3,
            "timestamp": pd.to_datetime([T0, T0 + 5000, T0 + 10000], unit="ms", utc=True),
            "value": [1, 2, 3],
            "gpu": ["0", None, ""],
        }
    )
    table = pa.table({"metric": ["m_pa"], "ts": [T0], "value": [4.5], "gpu": [7]})
    polars = pl.DataFrame({"metric": ["m_pl"], "timestamp": [T0], "value": [1.0]})
    assert vault.write(rows) == 10
    assert vault.write(frame) == 3
    assert vault.write(table) == 1
    assert vault.write(polars) == 1
    out = vault.query('{__name__=~"m_.*"}', T0, T0 + H)
    assert list(out.columns) == ["timestamp", "metric", "gpu", "value"]
    assert out["metric"].tolist() == ["m_pa", "m_pd", "m_pd", "m_pd", "m_pl"]
    # the pandas rows without a gpu label (None and "") are one series
    assert out[out.metric == "m_pd"]["gpu"].isna().tolist() == [False, True, True]
    assert out[out.metric == "m_pa"]["gpu"].tolist() == ["7"]
    assert str(out["timestamp"].dtype) == "datetime64[ms, UTC]"


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ([("m", {}, 1_000, 1.0)], ValueRangeError, "outside 1990..2200"),
        ([("m", {"bad-label": "x"}, T0, 1.0)], LabelError, "invalid label name"),
        ([("m", {}, T0, "abc")], InputError, "cannot read sample tuple"),
        (pa.table({"metric": ["m"], "value": [1.0]}), InputError, "lacks column"),
        (pa.table({"metric": ["m"], "timestamp": [1.5e12], "value": [1.0]}), InputError, "type"),
        (pa.table({"metric": [None], "timestamp": [T0], "value": [1.0]}), InputError, "null"),
        (pa.table({"metric": ["m"], "timestamp": [T0], "value": ["x"]}), InputError, "numbers"),
    ],
)
def test_bad_input_is_refused_whole_and_changes_nothing(vault, bad, error, message):
    good_then_bad = gauge_rows(5, 1) + (bad if isinstance(bad, list) else [])
    with pytest.raises(error, match=message):
        vault.write(good_then_bad if isinstance(bad, list) else bad)
    assert vault.buffer.depth() == (0, 0)
    assert len(vault.index) == 0
    assert vault.query("gpu_util", T0, T0 + H).empty


def test_flush_is_exactly_once_when_killed_between_file_write_and_commit(tmp_path, monkeypatch):
    path = str(tmp_path / "v")
    v = Vault.open_local(path)
    v.write(gauge_rows())
    real_commit = Catalog.commit
    monkeypatch.setattr(
        Catalog, "commit", lambda self, change: (_ for _ in ()).throw(OSError("killed"))
    )
    with pytest.raises(OSError):
        v.flush()
    monkeypatch.setattr(Catalog, "commit", real_commit)
    v.buffer.close()  # simulate the crash: no close(), no flush
    with Vault.open_local(path) as again:
        assert again.query("gpu_util", T0, T0 + D).shape[0] == 1440
        again.maintain(now_ms=T0 + 2 * D)
        assert again.stats()["tiers"]["raw"]["rows"] == 1440  # orphan file was not counted


def test_flush_is_exactly_once_when_killed_after_commit(tmp_path, monkeypatch):
    path = str(tmp_path / "v")
    v = Vault.open_local(path)
    v.write(gauge_rows())
    real_discard = v.buffer.discard_through

    def discard_then_die(seq):
        if seq > 0:  # the call after the catalog commit
            raise OSError("killed")
        real_discard(seq)

    monkeypatch.setattr(v.buffer, "discard_through", discard_then_die)
    with pytest.raises(OSError):
        v.flush()
    monkeypatch.undo()
    v.buffer.close()
    with Vault.open_local(path) as again:
        assert again.flush() == 0
        assert again.stats()["tiers"]["raw"]["rows"] == 1440
        assert again.buffer.depth() == (0, 0)


def test_duplicates_are_stored_once_and_the_later_write_wins(vault):
    vault.write([("m", {}, T0, 1.0), ("m", {}, T0 + 5000, 2.0)])
    vault.flush()
    vault.write([("m", {}, T0, 10.0)])
    vault.flush()
    assert vault.query("m", T0, T0 + H)["value"].tolist() == [10.0, 2.0]
    vault.maintain(now_ms=T0 + 2 * D)
    assert vault.stats()["tiers"]["raw"] == pytest.approx(vault.stats()["tiers"]["raw"])
    assert vault.stats()["tiers"]["raw"]["rows"] == 2
    assert vault.stats()["tiers"]["raw"]["files"] == 1
    assert vault.query("m", T0, T0 + H)["value"].tolist() == [10.0, 2.0]


def test_late_data_recomputes_rollups(vault):
    vault.write(gauge_rows(720, 1))
    vault.maintain(now_ms=T0 + 2 * D)
    before = vault.query("gpu_util", T0, T0 + H, step="1h", aggs=("count", "max"))
    vault.write([("gpu_util", {"gpu": "0", "Hostname": "node01"}, T0 + 2501, 1000.0)])
    vault.maintain(now_ms=T0 + 2 * D)
    after = vault.query("gpu_util", T0, T0 + H, step="1h", aggs=("count", "max"))
    assert before["count"].tolist() == [720]
    assert after["count"].tolist() == [721]
    assert after["max"].tolist() == [1000.0]
    assert vault.sql("SELECT sum(count) AS n FROM rollup_1h")["n"].tolist() == [721]


@pytest.mark.parametrize(
    ("start", "end", "width", "watermark", "expected"),
    [
        (0, 2 * H, 60_000, None, [Segment("1m", 0, 2 * H)]),
        (0, 2 * H, H, None, [Segment("1h", 0, 2 * H)]),
        (0, 2 * H, 30_000, None, [Segment("raw", 0, 2 * H)]),
        (0, 2 * H, H, H, [Segment("1h", 0, H), Segment("raw", H, 2 * H)]),
        (
            30_000,
            H + 90_000,
            None,
            None,
            [
                Segment("raw", 30_000, 60_000),
                Segment("1m", 60_000, H + 60_000),
                Segment("raw", H + 60_000, H + 90_000),
            ],
        ),
        (
            30_000,
            3 * H + 90_000,
            None,
            None,
            [
                Segment("raw", 30_000, 60_000),
                Segment("1m", 60_000, H),
                Segment("1h", H, 3 * H),
                Segment("1m", 3 * H, 3 * H + 60_000),
                Segment("raw", 3 * H + 60_000, 3 * H + 90_000),
            ],
        ),
    ],
)
def test_planner_uses_the_coarsest_fitting_tier(start, end, width, watermark, expected):
    assert plan(start, end, width, watermark) == expected


def test_retention_drops_rolled_up_raw_days_and_rollups_keep_answering(tmp_path):
    keep = RetentionOverride('{experiment="paper"}', "raw", "forever")
    with Vault.open_local(
        str(tmp_path / "v"), retention_raw="1d", retention_overrides=(keep,)
    ) as v:
        v.write(gauge_rows(720 * 24, 1))
        v.write(
            [("loss", {"experiment": "paper"}, T0 + i * 60_000, 1.0 / (i + 1)) for i in range(100)]
        )
        v.maintain(now_ms=T0 + D + H)
        hourly = v.query("gpu_util", T0, T0 + D, step="1h", aggs=("mean", "count"))
        v.maintain(now_ms=T0 + 3 * D)
        assert v.query("gpu_util", T0, T0 + D).empty  # raw gone
        assert len(v.query("loss", T0, T0 + D)) == 100  # kept by the override
        again = v.query("gpu_util", T0, T0 + D, step="1h", aggs=("mean", "count"))
        pd.testing.assert_frame_equal(hourly, again)
        assert v.stats()["raw_horizon"] == T0 + D


def test_retention_never_drops_raw_data_that_is_not_rolled_up(tmp_path, caplog):
    with Vault.open_local(str(tmp_path / "v"), retention_raw="1d") as v:
        v.write(gauge_rows(100, 1))
        v.flush()
        with caplog.at_level(logging.WARNING, logger="metricvault"):
            maintenance.apply_retention(v, T0 + 10 * D)
        assert "RETENTION BLOCKED" in caplog.text
        assert len(v.query("gpu_util", T0, T0 + D)) == 100
        assert v.stats()["rollup"]["pending_hours"] > 0


def test_stats_and_series_and_sql(vault):
    vault.write(gauge_rows(720, 2))
    vault.write([("energy_total", {"gpu": "0"}, T0 + i * 5000, float(i)) for i in range(720)])
    vault.maintain(now_ms=T0 + 2 * D)
    st = vault.stats()
    assert st["series"] == 3
    assert st["tiers"]["raw"]["rows"] == 2160
    assert st["tiers"]["1m"]["rows"] == 180
    assert st["rollup"]["pending_hours"] == 0
    series = vault.series("gpu_util")
    assert series["gpu"].tolist() == ["0", "1"]
    assert vault.series()["kind"].tolist() == ["counter", "gauge", "gauge"]
    got = vault.sql(
        "SELECT s.metric, count(*) AS n FROM raw JOIN series s USING (series_id) "
        "GROUP BY 1 ORDER BY 1"
    )
    assert got.to_dict("list") == {"metric": ["energy_total", "gpu_util"], "n": [720, 1440]}
    with pytest.raises(InputError, match="SQL failed"):
        vault.sql("SELECT nope FROM raw")


def test_query_errors_are_clear(vault):
    with pytest.raises(SelectorError):
        vault.query("gpu util", "-1h", "now")
    with pytest.raises(InputError, match="unknown aggregate"):
        vault.query("gpu_util", "-1h", "now", step="1m", aggs=("median",))
    with pytest.raises(Exception, match="not before end"):
        vault.query("gpu_util", "now", "-1h")


def test_query_times_accept_datetimes_iso_and_relative(vault):
    vault.write(gauge_rows(12, 1))
    a = vault.query("gpu_util", datetime(2026, 1, 1, tzinfo=UTC), "2026-01-01T00:01:00Z")
    b = vault.query("gpu_util", T0, T0 + 60_000)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 12
    assert vault.query("gpu_util", "-30d", "now").empty


def test_increase_is_equal_from_every_tier(vault):
    values = np.cumsum(np.random.default_rng(3).integers(0, 50, 3 * 720)).astype(float)
    values[1000:] -= values[1000] - 5  # a counter reset
    vault.write([("x_total", {}, T0 + i * 5000, v) for i, v in enumerate(values)])
    raw = vault.query("x_total", T0, T0 + 3 * H, step="all", aggs=("increase",))
    vault.maintain(now_ms=T0 + 2 * D)
    for step in ("all", "1m", "1h", "30s"):
        got = vault.query("x_total", T0, T0 + 3 * H, step=step, aggs=("increase",))
        assert got["increase"].sum() == pytest.approx(raw["increase"].iloc[0], rel=1e-12)


def test_late_samples_before_the_raw_horizon_are_refused_and_change_nothing(tmp_path):
    with Vault.open_local(str(tmp_path / "v"), retention_raw="1d") as v:
        v.write(gauge_rows(720 * 24 * 3, 1))
        v.maintain(now_ms=T0 + 3 * D + H)
        assert v.stats()["raw_horizon"] == T0 + 2 * D
        before = v.query("gpu_util", T0, T0 + 3 * D, step="1h", aggs=("count", "sum"))
        late = [("gpu_util", {"gpu": "0", "Hostname": "node01"}, T0 + 2 * D + 30 * 60_000, 5.0)]
        with pytest.raises(ValueRangeError, match="dropped by retention"):
            v.write(late)
        assert v.buffer.depth() == (0, 0)
        v.write([("gpu_util", {"gpu": "0", "Hostname": "node01"}, T0 + 2 * D + 2 * H, 5.0)])
        v.maintain(now_ms=T0 + 3 * D + H)
        after = v.query("gpu_util", T0, T0 + 3 * D, step="1h", aggs=("count", "sum"))
        assert after["count"].sum() == before["count"].sum()  # a duplicate of a kept sample
        pd.testing.assert_frame_equal(
            after[after.timestamp < "2026-01-03"], before[before.timestamp < "2026-01-03"]
        )


def test_open_days_merge_only_small_files_and_closed_days_merge_whole(tmp_path):
    rng = np.random.default_rng(5)
    with Vault.open_local(str(tmp_path / "v"), compact_small_file_bytes=8000) as v:
        big = [
            (m, labels, ts, round(rng.uniform(0, 100), 1))
            for m, labels, ts, _ in gauge_rows(2880, 4)
        ]
        v.write(big)  # one big file
        v.flush()
        for k in range(3):  # three small files, newer writes of existing samples
            v.write([("gpu_util", {"gpu": "0", "Hostname": "node01"}, T0 + k * 5000, 500.0 + k)])
            v.flush()
        maintenance.compact(v, now=T0 + H)  # the day is still open
        sizes = sorted(f.bytes for f in v.snapshot().tier_files("raw"))
        assert len(sizes) == 2 and sizes[-1] >= 8000  # big file untouched, small ones merged
        maintenance.compact(v, now=T0 + 2 * D)  # the day is closed
        assert len(v.snapshot().tier_files("raw")) == 1
        got = v.query('gpu_util{gpu="0"}', T0, T0 + 15_000)["value"].tolist()
        assert got == [500.0, 501.0, 502.0]
        assert v.stats()["tiers"]["raw"]["rows"] == 720 * 4 * 4


def test_sql_rollup_views_restore_elided_values(vault):
    rows: list[tuple[str, dict[str, str], int, float]] = [
        ("idle", {}, T0 + i * 5000, 0.0) for i in range(24)
    ]  # constant buckets
    rows += [("sparse", {}, T0 + i * 60_000, float(i) / 4) for i in range(5)]  # one per bucket
    rows += gauge_rows(24, 1)
    vault.write(rows)
    vault.maintain(now_ms=T0 + 2 * D)
    api = vault.query(
        '{__name__=~"idle|sparse|gpu_util"}',
        T0,
        T0 + H,
        step="1m",
        aggs=("min", "max", "last", "sum", "count"),
    )
    sql = vault.sql(
        "SELECT s.metric, r.timestamp, r.min, r.max, r.last, r.sum, r.count "
        "FROM rollup_1m r JOIN series s USING (series_id) ORDER BY 1, 2"
    )
    assert sql[["min", "max", "last", "sum"]].to_numpy().tolist() == (
        api.sort_values(["metric", "timestamp"])[["min", "max", "last", "sum"]].to_numpy().tolist()
    )
    assert sql[sql.metric == "sparse"]["max"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_metadata_kinds_apply_to_series_written_before_it(tmp_path):
    path = str(tmp_path / "v")
    with Vault.open_local(path) as v:
        v.write([("requests", {}, T0 + i * 5000, float(i % 100)) for i in range(720)])
        assert v.series()["kind"].tolist() == ["gauge"]
        v.set_metric_kinds({"requests": "counter"})
        v.maintain(now_ms=T0 + 2 * D)
        got = v.query("requests", T0, T0 + H, step="1h", aggs=("increase",))
        assert got["increase"].tolist() == [99.0 * 7 + 19 + 7 * 0]  # 7 resets to 0, rise 0..99
    with Vault.open_local(path) as again:  # committed with the flush
        assert again.series()["kind"].tolist() == ["counter"]


def test_maintain_flushes_the_buffers_of_other_writers(tmp_path):
    path = str(tmp_path / "v")
    worker = Vault.open_local(
        path, buffer_name="buffer-worker-999999999"
    )  # a pid that cannot exist
    worker.write(gauge_rows(100, 1))
    worker.buffer.close()  # the worker died: its samples are only in its own buffer file
    worker._lock_file.close()
    with Vault.open_local(path) as v:
        report = v.maintain(now_ms=T0 + 2 * D)
        assert report["flushed_samples"] == 100
        assert len(v.query("gpu_util", T0, T0 + D)) == 100
    state = tmp_path / "v" / "state"
    assert not list(state.glob("buffer-worker-*"))  # flushed and its owner gone: removed


class FrozenClock:
    """``metricvault.store.vault.monotonic``, moved on only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_writes_check_the_horizon_without_reading_the_catalog_each_time(tmp_path, monkeypatch):
    clock = FrozenClock()
    monkeypatch.setattr(vault_module, "monotonic", clock)
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(gauge_rows(10, 1))
        v.flush()  # a catalog version to keep
        reads: list[int] = []
        read = v.catalog.current

        def counted() -> Snapshot:
            reads.append(1)
            return read()

        monkeypatch.setattr(v.catalog, "current", counted)
        v.write(gauge_rows(10, 1, start=T0 + H))  # may read: the clock was not read yet
        reads.clear()
        for i in range(20):
            v.write(gauge_rows(10, 1, start=T0 + (i + 2) * H))
        assert reads == []
        clock.now += vault_module.HORIZON_RECHECK_S
        v.write(gauge_rows(10, 1, start=T0 + 30 * H))
        assert reads == [1]


def test_retention_by_another_process_reaches_writes_within_the_recheck(tmp_path, monkeypatch):
    clock = FrozenClock()
    monkeypatch.setattr(vault_module, "monotonic", clock)
    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write(gauge_rows(10, 1, start=T0 + 3 * D))
        assert v.min_writable_ms() == 0
        other = Catalog(v.location)  # another process's view of the same vault
        other.commit(Change(raw_horizon_ms=T0 + D))
        late = gauge_rows(1, 1, start=T0 + D + 30 * 60_000)
        clock.now += vault_module.HORIZON_RECHECK_S
        with pytest.raises(ValueRangeError, match="dropped by retention"):
            v.write(late)
        assert v.min_writable_ms() > T0 + D


def test_retention_by_this_vault_reaches_its_next_write_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(vault_module, "monotonic", FrozenClock())  # no re-read of the catalog
    with Vault.open_local(str(tmp_path / "v"), retention_raw="1d") as v:
        v.write(gauge_rows(720 * 24 * 3, 1))
        assert v.min_writable_ms() == 0
        v.maintain(now_ms=T0 + 3 * D + H)
        late = [("gpu_util", {"gpu": "0", "Hostname": "node01"}, T0 + 2 * D + 30 * 60_000, 5.0)]
        with pytest.raises(ValueRangeError, match="dropped by retention"):
            v.write(late)
