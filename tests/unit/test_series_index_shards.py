"""The series index loads per shard: a process reads the series files' rows of the shards
(metrics) it needs, not every series file on open (store/series_index.py, "Shards").

File reads are counted by a filesystem wrapper around the vault's real local filesystem: the
files are really read, the wrapper only records which.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec.implementations.local  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from metricvault import Vault
from metricvault.config import Settings
from metricvault.store import files as fmt
from metricvault.store.claims import Claims
from metricvault.store.layout import open_location
from metricvault.store.maintenance import maintain
from metricvault.store.series_index import SERIES_FILES_COMPACT, SHARD_COLUMN, shard_of
from metricvault.store.vault import Vault as StoreVault

T0 = 1_767_225_600_000  # 2026-01-01
NOW = T0 + 7_200_000  # what maintenance's retention sees: the data is fresh
A, B = "DCGM_FI_DEV_GPU_UTIL", "node_load1"  # metrics of two different shards


class CountingFS(fsspec.implementations.local.LocalFileSystem):  # type: ignore[misc]
    """The local filesystem, recording each file opened for reading."""

    cachable = False  # fsspec would hand back an earlier instance (and its list)

    def __init__(self, opened: list[str]) -> None:
        super().__init__()
        self.opened = opened

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode:
            self.opened.append(str(path))
        return super()._open(path, mode, *args, **kwargs)


def _open_counting(path: str) -> tuple[StoreVault, list[str]]:
    opened: list[str] = []
    settings = Settings()
    loc = open_location(path, settings, create=False)
    fs = pafs.PyFileSystem(pafs.FSSpecHandler(CountingFS(opened)))
    return StoreVault(replace(loc, fs=fs), settings), opened


def _series_opened(opened: list[str]) -> set[str]:
    return {p for p in opened if "/series/" in p}


def _write(path: str, metric: str, hosts: range) -> None:
    with Vault.open_local(path) as vault:
        vault.write([(metric, {"host": f"h{h}"}, T0 + h, float(h)) for h in hosts])


@pytest.fixture
def two_metrics(tmp_path: Path) -> str:
    """Series files of A alone, of B alone, and of both: one flush (one process) each."""
    assert shard_of(A) != shard_of(B)
    path = str(tmp_path / "v")
    _write(path, A, range(0, 5))
    _write(path, B, range(0, 7))
    with Vault.open_local(path) as vault:
        vault.write([(A, {"host": "h9"}, T0, 1.0), (B, {"host": "h9"}, T0, 1.0)])
    return path


def test_a_query_for_one_metric_opens_only_the_series_files_holding_its_shard(
    two_metrics: str,
) -> None:
    vault, opened = _open_counting(two_metrics)
    with vault:
        files = vault.catalog_version().series_files
        assert len(files) == 3 and all(f.shards is not None for f in files)
        holding_a = {f.path for f in files if f.shards and shard_of(A) in f.shards}
        assert len(holding_a) == 2
        assert not _series_opened(opened), "opening the vault read series files"

        got = vault.query(A, T0, T0 + 60_000, output="arrow")

        assert sorted(set(got.column("host").to_pylist())) == [*(f"h{h}" for h in range(5)), "h9"]
        assert _series_opened(opened) == holding_a  # B's own file was never opened
        assert vault.index.files_read == 2
        assert {i.metric for i in vault.index._by_id.values()} == {A}, "B's rows were read"

        # a selector without a metric name needs every shard; each file is read once more
        # at most (only the shards not read yet)
        assert len(vault.series('{host="h9"}', output="arrow")) == 2
        assert _series_opened(opened) == {f.path for f in files}
        assert vault.index.files_read == 3 + 1  # B's file, and B's shard of the shared one


def test_counting_series_reads_ids_only_and_agrees_with_loading_them_all(
    two_metrics: str,
) -> None:
    vault, _ = _open_counting(two_metrics)
    with vault:
        assert vault.series_count() == 5 + 7 + 2
        assert vault.index.files_read == 0  # the ids, not the series
        vault.index.need_all()
        assert vault.series_count() == 14 == len(vault.index.all())


def test_a_writer_knows_series_another_process_flushed_without_reading_other_shards(
    two_metrics: str,
) -> None:
    vault, opened = _open_counting(two_metrics)
    with vault:
        # h0 of A is known (flushed by another process), h100 of A is new
        vault.write([(A, {"host": "h0"}, T0 + 1_000, 2.0), (A, {"host": "h100"}, T0, 2.0)])
        vault.flush()
        assert all(shard_of(A) in (f.shards or ()) for f in _files_read(vault, opened))
        newest = vault.catalog_version().series_files[-1]
    rows = fmt.read_table(newest.path, pa.fs.LocalFileSystem())
    assert rows.column("labels").to_pylist() == [json.dumps({"host": "h100"})], (
        "a series another process flushed was registered again"
    )


def _files_read(vault: StoreVault, opened: list[str]) -> list[Any]:
    by_path = {f.path: f for f in vault.catalog_version().series_files}
    return [by_path[p] for p in _series_opened(opened) if p in by_path]


def test_a_series_file_holds_one_row_group_per_shard_sorted_by_shard(two_metrics: str) -> None:
    with Vault.open_local(two_metrics) as vault:
        both = vault.catalog_version().series_files[-1]
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(both.path)
    shards = parquet.read().column(SHARD_COLUMN).to_pylist()
    assert shards == sorted(shards) and both.shards == tuple(sorted(set(shards)))
    assert parquet.metadata.num_row_groups == len(set(shards)) == 2
    assert parquet.schema_arrow.metadata[b"metricvault.series_layout"] == b"2"


def test_a_series_files_footer_holds_statistics_of_its_shard_column_only(two_metrics: str) -> None:
    """What read_shards picks row groups by, and nothing else (the labels' JSON as minimum
    and maximum of every row group was most of a small file's footer); no dictionary
    pages. A query of one metric still reads only its shard's row group."""
    import pyarrow.parquet as pq

    with Vault.open_local(two_metrics) as vault:
        both = vault.catalog_version().series_files[-1]
    meta = pq.ParquetFile(both.path).metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            kept = column.path_in_schema == SHARD_COLUMN
            assert (column.statistics is not None and column.statistics.has_min_max) == kept
            assert not column.has_dictionary_page
    fresh, _ = _open_counting(two_metrics)
    with fresh:
        got = fresh.query(A, T0, T0 + 60_000, output="arrow")
        assert {i.metric for i in fresh.index._by_id.values()} == {A}
    assert sorted(set(got.column("host").to_pylist())) == [*(f"h{h}" for h in range(5)), "h9"]


def test_maintain_merges_series_files_into_one_sharded_file_under_the_series_claim(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v")
    for i in range(SERIES_FILES_COMPACT):  # one series file per flush
        _write(path, A if i % 2 else B, range(i * 10, i * 10 + 3))
    with Vault.open_local(path) as vault:
        assert len(vault.catalog_version().series_files) == SERIES_FILES_COMPACT
        other = Claims(vault.location, 60_000)
        lease = other.acquire("series")
        assert lease is not None
        assert maintain(vault, NOW)["compacted_series_files"] == 0  # another maintainer's work
        other.release(lease)
        assert maintain(vault, NOW)["compacted_series_files"] == SERIES_FILES_COMPACT
        (merged,) = vault.catalog_version().series_files
        assert merged.shards == tuple(sorted({shard_of(A), shard_of(B)}))
        assert maintain(vault, NOW)["compacted_series_files"] == 0  # nothing left to merge
    reader, opened = _open_counting(path)
    with reader:
        assert len(reader.series(A, output="arrow")) == 3 * (SERIES_FILES_COMPACT // 2)
        assert _series_opened(opened) == {merged.path}
        assert reader.series_count() == 3 * SERIES_FILES_COMPACT


def test_a_vault_written_before_shards_reads_and_maintain_rewrites_it_sharded(
    two_metrics: str,
) -> None:
    """What a vault of catalog format 2 looks like: series files without a shard column,
    catalog entries without shards."""
    root = Path(two_metrics)
    for f in (root / "series").glob("*.parquet"):
        table = fmt.read_table(str(f), pa.fs.LocalFileSystem())
        f.write_bytes(fmt.write_plain_parquet(table.drop_columns([SHARD_COLUMN])))
    for version in (root / "catalog").glob("v*.json"):
        body = json.loads(version.read_text())
        body["format"] = 2
        for sf in body["series_files"]:
            sf.pop("shards", None)
        version.write_text(json.dumps(body))
    with Vault.open_local(two_metrics) as vault:
        assert all(f.shards is None for f in vault.catalog_version().series_files)
        assert len(vault.series(A, output="arrow")) == 6
        assert vault.series_count() == 14
        assert maintain(vault, NOW)["compacted_series_files"] == 3
        (merged,) = vault.catalog_version().series_files
        assert merged.shards == tuple(sorted({shard_of(A), shard_of(B)}))
    with Vault.open_local(two_metrics) as vault:
        assert len(vault.series(B, output="arrow")) == 8
        assert vault.query(A, T0, T0 + 60_000, output="arrow").num_rows == 6


@pytest.mark.parametrize(
    ("threaded_rows", "threaded"),
    [(4, [True, False]), (1 << 16, [False, False])],
    ids=["6 rows over the bound", "under the default bound"],
)
def test_read_shards_takes_the_rows_of_the_shards_asked_from_mixed_and_sharded_files(
    threaded_rows: int, threaded: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row groups holding several shards are filtered to the shards asked; one group per
    shard is taken whole; more rows than ``THREADED_ROWS`` decode on Arrow's thread pool,
    fewer on the caller's thread. The same rows either way."""
    import io

    import pyarrow.parquet as pq

    from metricvault.store import series_index

    table = pa.table(
        {"series_id": pa.array(range(7), pa.int64()), SHARD_COLUMN: [0, 0, 1, 2, 2, 2, 5]}
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=3)  # groups of shards {0, 1}, {2}, {5}
    monkeypatch.setattr(series_index, "THREADED_ROWS", threaded_rows)
    used: list[bool] = []
    read_row_groups = pq.ParquetFile.read_row_groups

    def recorded(self: Any, groups: Any, columns: Any = None, **kwargs: Any) -> Any:
        used.append(kwargs.get("use_threads", True))
        return read_row_groups(self, groups, columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recorded)
    parquet = pq.ParquetFile(io.BytesIO(sink.getvalue()))
    got = series_index.read_shards(parquet, (0, 2), ["series_id"])  # 6 rows of 2 groups
    assert got.column("series_id").to_pylist() == [0, 1, 3, 4, 5]
    assert series_index.read_shards(parquet, (5,)).column("series_id").to_pylist() == [6]
    assert used == threaded
