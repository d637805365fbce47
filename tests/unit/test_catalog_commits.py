"""Catalog commits by writers that share no lock: a version is never replaced, a change computed
against an older snapshot is rebased onto the newer one, and void maintenance is refused.

Two ``Catalog`` objects on one local vault stand for two writers with their own state dirs
(on S3 the create-if-absent is a conditional PUT; tests/e2e/test_s3.py runs it there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.errors import CommitConflictError
from metricvault.store.catalog import HOUR_MS, Catalog, Change, DataFile, Snapshot
from metricvault.store.layout import Location, open_location


def raw_file(loc: Location, name: str, file_id: int, min_ts: int = 0) -> DataFile:
    path = loc.path("data", "raw", "day=1970-01-01", f"{name}.parquet")
    return DataFile(path, "raw", "1970-01-01", 10, 100, min_ts, min_ts + 1000, file_id)


@pytest.fixture
def loc(tmp_path: Path) -> Location:
    return open_location(str(tmp_path / "vault"), Settings())


def flush(catalog: Catalog, loc: Location, name: str, buffer: str, base: Snapshot) -> Change:
    """A flush's change as vault.py builds it: ids from the snapshot it read."""
    f = raw_file(loc, name, base.next_file_id)
    return Change(add=[f], buffers={buffer: 1}, file_ids_used=1, based_on=base)


def test_a_change_computed_against_an_older_snapshot_lands_on_top_with_new_ids(
    loc: Location,
) -> None:
    a, b = Catalog(loc), Catalog(loc)
    a.commit(Change())
    seen_by_a = a.current()
    theirs = b.commit(flush(b, loc, "theirs", "b", b.current()))
    mine = a.commit(flush(a, loc, "mine", "a", seen_by_a))
    assert mine.version == theirs.version + 1
    assert {f.path.rsplit("/", 1)[1] for f in mine.files} == {"theirs.parquet", "mine.parquet"}
    assert sorted(f.file_id for f in mine.files) == [1, 2], "ids must stay unique and ordered"
    assert mine.buffers == {"a": 1, "b": 1}
    assert Catalog(loc).current() == mine


def test_a_lost_race_for_the_version_number_is_retried_above_the_winner(
    loc: Location, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = Catalog(loc), Catalog(loc)
    a.commit(Change())
    real = loc.write_bytes_exclusive
    raced: list[str] = []

    def b_first(path: str, data: bytes) -> bool:
        if not raced:
            raced.append(path)
            b.commit(flush(b, loc, "theirs", "b", b.current()))  # takes the version a wants
        return real(path, data)

    monkeypatch.setattr(loc, "write_bytes_exclusive", b_first)
    with caplog.at_level("WARNING", logger="metricvault"):
        mine = a.commit(Change(metric_kinds={"up": "gauge"}))
    assert "committed by another writer first" in caplog.text
    assert raced == [a.version_path(2)] and mine.version == 3
    assert len(mine.files) == 1 and mine.metric_kinds == {"up": "gauge"}
    won = Catalog(loc).current()
    assert won.version == 3 and b.history()[1].buffers == {"b": 1}  # b's version 2 stands


def test_maintenance_whose_inputs_another_writer_replaced_is_refused(loc: Location) -> None:
    a, b = Catalog(loc), Catalog(loc)
    small = [raw_file(loc, f"small{i}", i + 1) for i in range(2)]
    base = a.commit(Change(add=small, file_ids_used=2))
    merged_by_b = raw_file(loc, "merged-b", 2)
    b.commit(Change(add=[merged_by_b], remove={f.path for f in small}))
    merged_by_a = raw_file(loc, "merged-a", 2)
    with pytest.raises(CommitConflictError, match="another writer replaced 2 file"):
        a.commit(Change(add=[merged_by_a], remove={f.path for f in small}, based_on=base))
    assert [f.path for f in Catalog(loc).current().files] == [merged_by_b.path]


@pytest.mark.parametrize(
    ("new_raw_at", "still_dirty"),
    [
        (None, set()),  # nothing new: the rolled-up hours are clean
        (5 * HOUR_MS, {5, 6}),  # new samples at hour 5 reach hours 5 and 6 (lookback)
        (6 * HOUR_MS, {6}),  # new samples at hour 6 leave hour 5's rollup exact
        (9 * HOUR_MS, set()),  # after every rolled-up hour
    ],
)
def test_a_rebased_rollup_leaves_dirty_the_hours_new_raw_data_may_touch(
    loc: Location, new_raw_at: int | None, still_dirty: set[int]
) -> None:
    a, b = Catalog(loc), Catalog(loc)
    base = a.commit(Change(add=[raw_file(loc, "old", 1)], dirty_add={5, 6}, file_ids_used=1))
    if new_raw_at is not None:
        b.commit(Change(add=[raw_file(loc, "new", 2, new_raw_at)], file_ids_used=1))
    else:
        b.commit(Change(metric_kinds={"up": "gauge"}))
    done = a.commit(Change(dirty_remove={5, 6}, based_on=base))
    assert set(done.dirty_hours) == still_dirty


def test_files_are_ordered_by_the_version_that_committed_them_not_by_their_ids(
    loc: Location,
) -> None:
    a, b = Catalog(loc), Catalog(loc)
    # a picked a high id from some snapshot; b commits after it with a lower one
    a.commit(Change(add=[raw_file(loc, "first", 50)]))
    b.commit(Change(add=[raw_file(loc, "second", 3)]))
    files = sorted(Catalog(loc).current().files, key=lambda f: f.order)
    assert [f.path.rsplit("/", 1)[1] for f in files] == ["first.parquet", "second.parquet"]
    assert [f.added_in for f in files] == [1, 2]


def test_a_warm_catalog_probes_the_next_version_instead_of_listing(loc: Location) -> None:
    writer, reader = Catalog(loc), Catalog(loc)
    writer.commit(Change(metric_kinds={"up": "gauge"}))
    assert reader.current().version == 1  # cold: from catalog/NEWEST, no listing
    for n in range(3):
        writer.commit(Change(add=[raw_file(loc, f"f{n}", n + 1)]))
    assert reader.current().version == 4
    assert reader.listings == 0 and reader.probes >= 2


def test_a_reader_whose_cached_version_was_expired_lists_to_find_the_newest(
    loc: Location,
) -> None:
    writer, reader = Catalog(loc), Catalog(loc)
    writer.commit(Change())
    assert reader.current().version == 1
    for n in range(4):
        writer.commit(Change(add=[raw_file(loc, f"f{n}", n + 1)]))
    writer.expire(keep=1)  # versions 1..4 deleted: probing from 1 proves nothing
    assert reader.current().version == 5
    assert reader.listings >= 1


def test_a_pointer_that_names_an_expired_version_is_only_a_hint(loc: Location) -> None:
    writer = Catalog(loc)
    for n in range(3):
        writer.commit(Change(add=[raw_file(loc, f"f{n}", n + 1)]))
    Path(loc.path("catalog", "NEWEST")).write_text('{"version": 1}')  # went backwards
    writer.expire(keep=1)
    assert Catalog(loc).current().version == 3


def test_every_version_records_the_version_it_was_computed_from(loc: Location) -> None:
    a, b = Catalog(loc), Catalog(loc)
    a.commit(Change())
    seen_by_a = a.current()
    b.commit(flush(b, loc, "theirs", "b", b.current()))
    a.commit(flush(a, loc, "mine", "a", seen_by_a))  # rebased: its parent is b's version
    assert [(s.version, s.parent) for s in Catalog(loc).history()] == [(1, 0), (2, 1), (3, 2)]
