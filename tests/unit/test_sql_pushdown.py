"""Series filters pushed down to the sample views of ``vault.sql``: the same answers as the
statement run as written, the implied ``series_id IN (...)`` added only where it is implied.
Timings: bench/sql_pushdown.py (docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from metricvault.store.introspect import run_sql
from metricvault.store.sql_pushdown import push_series_filters
from metricvault.store.vault import Vault

T0 = 1_767_225_600_000


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    path = tmp_path_factory.mktemp("sql") / "v"
    with Vault.open_local(str(path)) as v:
        rows = []
        for metric in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL", "node_load1"):
            for host in ("n1", "n2", "n3"):
                for i in range(300):
                    value = float((i % 7 == 0) * 13) if "XID" in metric else float(i % 100)
                    rows.append((metric, {"Hostname": host}, T0 + i * 15_000, value))
        v.write(rows)
        v.flush()
        v.maintain(now_ms=T0 + 10 * 86_400_000)  # 1m/1h rollups of every hour
        yield v


STATEMENTS = [
    "SELECT s.labels, r.ts, r.value FROM raw r JOIN series s ON r.series_id = s.series_id "
    "WHERE s.metric='DCGM_FI_DEV_XID_ERRORS' AND r.value>0 ORDER BY 1, 2",
    "SELECT count(*) FROM raw JOIN series USING (series_id) "
    "WHERE series.metric = 'DCGM_FI_DEV_GPU_UTIL' AND series.labels LIKE '%n2%'",
    "SELECT count(*) FROM raw r, series s WHERE r.series_id = s.series_id "
    "AND (s.metric = 'node_load1' OR s.metric LIKE 'DCGM_FI_DEV_GPU%')",
    "SELECT s.metric, max(r.max) FROM rollup_1m r JOIN series s ON s.series_id = r.series_id "
    "WHERE s.metric IN ('node_load1', 'DCGM_FI_DEV_XID_ERRORS') GROUP BY 1 ORDER BY 1",
    "SELECT count(*) FROM raw r JOIN series s ON r.series_id = s.series_id WHERE s.metric = 'x'",
    # not rewritten (outer join, OR across tables, a subquery, unqualified columns): same answer
    "SELECT count(*) FROM raw r LEFT JOIN series s ON r.series_id = s.series_id "
    "WHERE s.metric = 'node_load1'",
    "SELECT count(*) FROM raw r JOIN series s ON r.series_id = s.series_id "
    "WHERE s.metric = 'node_load1' OR r.value > 90",
    "SELECT count(*) FROM raw r JOIN series s ON r.series_id = s.series_id "
    "WHERE s.metric = (SELECT max(metric) FROM series)",
    "SELECT count(*) FROM raw r JOIN series s ON r.series_id = s.series_id WHERE metric = 'x'",
    "WITH x AS (SELECT * FROM series) SELECT count(*) FROM raw r JOIN x s "
    "ON r.series_id = s.series_id WHERE s.metric = 'node_load1'",
]


@pytest.mark.parametrize("statement", STATEMENTS)
def test_pushed_down_statements_answer_as_written(vault: Vault, statement: str) -> None:
    written = run_sql(vault, statement, "arrow", pushdown=False)
    pushed = run_sql(vault, statement, "arrow", pushdown=True)
    assert pushed.to_pylist() == written.to_pylist()


def _connection(vault: Vault) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register("series", vault.index.to_table())
    return con


@pytest.mark.parametrize(
    ("statement", "pushed"),
    [
        (STATEMENTS[0], True),
        (STATEMENTS[1], True),
        (STATEMENTS[2], True),
        (STATEMENTS[3], True),
        (STATEMENTS[4], True),
        *((s, False) for s in STATEMENTS[5:]),
        ("SELECT 1", False),
        ("SELEC nonsense", False),
        ("SELECT 1; SELECT 2", False),
    ],
)
def test_the_implied_series_filter_is_added_only_where_it_is_implied(
    vault: Vault, statement: str, pushed: bool
) -> None:
    rewritten = push_series_filters(_connection(vault), statement)
    assert ("series_id IN (" in rewritten) is pushed, rewritten
    if not pushed:
        assert rewritten == statement


def test_a_metric_filter_lists_that_metrics_series_ids(vault: Vault) -> None:
    rewritten = push_series_filters(_connection(vault), STATEMENTS[0])
    ids = sorted(i.series_id for i in vault.index.all() if i.metric == "DCGM_FI_DEV_XID_ERRORS")
    assert f'"r".series_id IN ({", ".join(map(str, ids))})' in rewritten
    no_match = push_series_filters(_connection(vault), STATEMENTS[4])
    assert '"r".series_id IN (NULL)' in no_match


def test_a_bad_statement_keeps_duckdbs_error(vault: Vault) -> None:
    from metricvault.errors import InputError

    with pytest.raises(InputError, match="SQL failed"):
        run_sql(vault, "SELECT nope FROM raw r JOIN series s USING (series_id)", "arrow")


def test_the_public_sql_answers_a_pushed_down_statement(vault: Vault) -> None:
    frame = vault.sql(STATEMENTS[0], output="arrow")
    assert frame.num_rows == 3 * len(range(0, 300, 7))  # every 7th sample of each host


@pytest.mark.parametrize("ids", [[3], [0, 9], [1, 2, 3, 4, 5, 6, 7, 8], [42], [5, 100, -1]])
def test_series_rows_reads_exactly_the_rows_of_those_series(tmp_path: Path, ids: list[int]) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from metricvault.store.sql_pushdown import series_rows

    sid = np.repeat(np.arange(10), np.arange(1, 11))  # runs of 1..10 rows, across row groups
    table = pa.table({"series_id": sid, "ts": np.arange(len(sid)), "value_f": sid * 1.5})
    path = str(tmp_path / "f.parquet")
    pq.write_table(table, path, row_group_size=4, write_page_checksum=True)
    got = series_rows(path, pafs.LocalFileSystem(), ids)
    want = table.filter(pa.compute.is_in(table["series_id"], pa.array(ids, pa.int64())))
    assert (got.to_pylist() if got is not None else []) == want.to_pylist()


def test_a_damaged_data_file_answers_nothing_with_the_pushdown_too(tmp_path: Path) -> None:
    from metricvault.errors import CorruptionError

    with Vault.open_local(str(tmp_path / "v")) as v:
        v.write([("m", {"h": str(h)}, T0 + i * 15_000, float(i)) for h in range(4)
                 for i in range(2000)])  # fmt: skip
        v.flush()
        (raw,) = v.catalog_version().tier_files("raw")
        data = bytearray(Path(raw.path).read_bytes())
        chunk = pq.ParquetFile(raw.path).metadata.row_group(0).column(1)  # ts
        at = chunk.data_page_offset + chunk.total_compressed_size // 2  # in its page's data
        data[at : at + 16] = bytes(x ^ 0xFF for x in data[at : at + 16])
        Path(raw.path).write_bytes(bytes(data))
        with pytest.raises(CorruptionError, match="damaged"):
            v.sql(STATEMENTS[0].replace("DCGM_FI_DEV_XID_ERRORS", "m"), output="arrow")


VIEW_STATEMENTS = [
    "SELECT count(*) FROM rollup_1h",
    "SELECT count(*), sum(value) FROM raw WHERE series_id IN (SELECT series_id FROM series "
    "WHERE metric = 'node_load1')",
    "WITH hot AS (SELECT * FROM raw WHERE value > 50) SELECT count(*) FROM hot",
    "SELECT (SELECT count(*) FROM rollup_1m) + (SELECT count(*) FROM raw_src)",
    "SELECT table_name FROM information_schema.tables ORDER BY 1",
    "SELECT count(*) FROM experiments",
]


@pytest.mark.parametrize("pushdown", [True, False])
@pytest.mark.parametrize("statement", [*STATEMENTS, *VIEW_STATEMENTS])
def test_statements_answer_as_with_every_view_made(
    vault: Vault, statement: str, pushdown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the sample views a statement reads are made (introspect._tables_read); the
    answer is the one every view gives."""
    from metricvault.store import introspect

    got = run_sql(vault, statement, "arrow", pushdown=pushdown)
    monkeypatch.setattr(introspect, "_tables_read", lambda con, statement: None)
    want = run_sql(vault, statement, "arrow", pushdown=pushdown)
    assert got.to_pylist() == want.to_pylist()


def test_the_views_a_statement_reads() -> None:
    from metricvault.store.introspect import _tables_read

    con = duckdb.connect()
    assert _tables_read(con, STATEMENTS[0]) == {"raw", "series"}
    assert _tables_read(con, VIEW_STATEMENTS[2]) == {"raw", "hot"}
    assert _tables_read(con, VIEW_STATEMENTS[3]) == {"rollup_1m", "raw_src"}
    assert _tables_read(con, VIEW_STATEMENTS[4]) is None  # the catalog's tables: every view
    assert _tables_read(con, "SELECT * FROM read_parquet('x.parquet')") is None
    assert _tables_read(con, "SELEC nonsense") is None
