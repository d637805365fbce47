"""A thread's pinned catalog version (``Catalog.pinned``, ``Vault.pinned``): one query's reads see
the version current when it started, its own commits move the pin, other threads and writers are
not held back, and a commit inside a pin still lands above every version on disk."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.store.catalog import Catalog, Change, DataFile
from metricvault.store.layout import Location, open_location


@pytest.fixture
def loc(tmp_path: Path) -> Location:
    return open_location(str(tmp_path / "vault"), Settings())


def raw_file(loc: Location, name: str, file_id: int) -> DataFile:
    path = loc.path("data", "raw", "day=1970-01-01", f"{name}.parquet")
    return DataFile(path, "raw", "1970-01-01", 10, 100, 0, 1000, file_id)


def test_a_pinned_thread_reads_one_version_while_another_writer_commits(loc: Location) -> None:
    reader, writer = Catalog(loc), Catalog(loc)
    start = writer.commit(Change())
    with reader.pinned() as pinned:
        newer = writer.commit(Change(add=[raw_file(loc, "a", 1)], file_ids_used=1))
        assert pinned.version == start.version
        assert reader.current().version == start.version  # every read of the query
    assert reader.current().version == newer.version  # the next query sees the commit


def test_a_commit_inside_a_pin_lands_above_other_writers_and_moves_the_pin(
    loc: Location,
) -> None:
    mine, theirs = Catalog(loc), Catalog(loc)
    mine.commit(Change())
    with mine.pinned():
        other = theirs.commit(Change(add=[raw_file(loc, "theirs", 1)], file_ids_used=1))
        based_on = mine.current()  # stale: the pin is older than ``other``
        committed = mine.commit(
            Change(add=[raw_file(loc, "mine", 2)], file_ids_used=1, based_on=based_on)
        )
        assert committed.version == other.version + 1
        assert mine.current() == committed  # a read's own flush is seen by the rest of it
        assert {f.path.rsplit("/", 1)[1] for f in committed.files} == {
            "theirs.parquet",
            "mine.parquet",
        }


def test_other_threads_and_nested_pins_keep_their_own_view(loc: Location) -> None:
    catalog, writer = Catalog(loc), Catalog(loc)
    catalog.commit(Change())
    seen: list[int] = []
    with catalog.pinned() as outer:
        newer = writer.commit(Change(add=[raw_file(loc, "a", 1)], file_ids_used=1))
        with catalog.pinned() as inner:
            assert inner.version == outer.version
        thread = threading.Thread(target=lambda: seen.append(catalog.current().version))
        thread.start()
        thread.join(timeout=10)
        assert catalog.current().version == outer.version
    assert seen == [newer.version]


def test_a_commit_by_another_thread_of_this_process_moves_the_pin(loc: Location) -> None:
    """A flush by the gateway's flusher thread commits samples this process acknowledged: a
    query pinned before it must still read them."""
    catalog = Catalog(loc)
    catalog.commit(Change())
    with catalog.pinned() as pinned:
        flusher = threading.Thread(
            target=lambda: catalog.commit(Change(add=[raw_file(loc, "a", 1)], file_ids_used=1))
        )
        flusher.start()
        flusher.join(timeout=10)
        assert catalog.current().version == pinned.version + 1
        assert [f.path.rsplit("/", 1)[1] for f in catalog.current().files] == ["a.parquet"]


def test_a_writer_inside_a_pin_reads_the_newest_version(loc: Location) -> None:
    catalog, other = Catalog(loc), Catalog(loc)
    catalog.commit(Change())
    with catalog.pinned() as pinned:
        newer = other.commit(Change(add=[raw_file(loc, "b", 1)], file_ids_used=1))
        with catalog.unpinned():
            assert catalog.current().version == newer.version  # what a flush bases on
        assert catalog.current().version == pinned.version


def test_a_pinned_query_reads_samples_a_background_flush_committed(tmp_path: Path) -> None:
    """Acknowledged, then flushed by another thread after the query pinned its version and
    before it read: the query still sees the samples (read after write)."""
    from metricvault.store.vault import Vault

    vault = Vault.open_local(str(tmp_path / "v"))
    t0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    vault.write([("gpu_util", {"gpu": "0"}, t0 + 1_000 * i, float(i)) for i in range(1, 11)])
    with vault.pinned():
        flusher = threading.Thread(target=vault.flush)
        flusher.start()
        flusher.join(timeout=30)
        assert not flusher.is_alive()
        found = vault.select_series("gpu_util", t0, t0 + 20_000)
    assert [values.tolist() for _, _, values in found] == [[float(i) for i in range(1, 11)]]
    vault.close()
