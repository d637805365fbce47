"""The catalog: numbered, immutable JSON snapshots of which files make up the vault.

A commit writes ``catalog/v<N+1>.json`` with create-if-absent semantics (``link(2)`` on local
disk, a conditional PUT with ``If-None-Match: *`` on S3), so readers always see either the old
or the new snapshot, never half of a flush or a compaction, and no writer ever replaces another
writer's version. Writers sharing a state directory also share its lock; writers that do not
(two gateways with their own state dirs on one S3 vault) can race for a version number: the
loser re-reads the winner's version and re-applies its change on top (:meth:`Change.rebase`),
so a flush is never lost, and maintenance whose inputs the winner replaced is discarded with a
:class:`~metricvault.errors.CommitConflictError`. Duplicate samples are resolved by commit
order: each data file records the version that added it (``DataFile.added_in``). Readers find
the newest version by probing ``v<N+1>`` from the one they have, or from ``catalog/NEWEST``,
never by listing per query (docs/scale-out.md). Each snapshot records the data files with
their tier, day, row count and time range, the series files, the per-buffer watermarks that make
flushes exactly-once, and the hours whose rollups must be recomputed ("dirty" hours).

Paths are stored relative to the vault root (format 2) and resolved against wherever the vault
is opened, so a moved or copied vault names its own files; in memory they are full paths. Each
snapshot also carries the vault's id and, for every file a commit removed, when it was replaced:
maintenance deletes a file only after ``orphan_grace`` from that moment, so a reader holding an
older snapshot keeps its files. A format-1 catalog (absolute paths) is read as if relative and
upgraded by :meth:`Catalog.upgrade` when a vault opens it.

A newest version that does not parse (truncated, empty) is skipped with a warning naming it: the
newest readable one is used, the next commit gets a number above every version on disk (never
reusing the damaged one's), and the damaged file is never deleted.

Why not Iceberg: see docs/decisions/0001-catalog.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from metricvault.errors import CommitConflictError, NotFoundError, StorageError
from metricvault.model import TIER_RESOLUTION_MS, KindChange
from metricvault.store.layout import CATALOG_DIR, Location

FORMAT = 3  # 3: series files name their shards (SeriesFile.shards)
LEGACY_FORMAT = 1  # absolute paths, no vault id, no replacement times
READABLE_FORMATS = (LEGACY_FORMAT, 2, FORMAT)  # 2: relative paths, no series shards
log = logging.getLogger("metricvault")
_VERSION_RE = re.compile(r"v(\d{12})\.json$")
HOUR_MS = TIER_RESOLUTION_MS["1h"]  # dirty hours are the 1h tier's buckets (model.py)
UNCOMMITTED = -1  # DataFile.added_in until its commit numbers it
POINTER = "NEWEST"  # catalog/NEWEST: the newest version's number, a hint for cold readers
COMMIT_ATTEMPTS = 30  # lost races in a row before a commit gives up (each re-reads first)
MANY_WRITERS = (
    "another writer (a process with its own state directory) is committing to this vault: "
    "expected with several gateways on one vault (docs/scale-out.md); if it is frequent, "
    "commits are too: raise flush_interval, or give each gateway its own vault"
)


@dataclass(frozen=True)
class DataFile:
    path: str
    tier: str
    day: str
    rows: int
    bytes: int
    min_ts: int
    max_ts: int
    file_id: int
    # The catalog version whose commit added this file's samples (a file maintenance rewrote
    # inherits its newest input's): duplicate samples are resolved by it, so the writer that
    # committed last wins, whatever ids writers picked from the snapshots they had read.
    added_in: int = UNCOMMITTED

    @property
    def order(self) -> tuple[int, int]:
        """Oldest first: the sort key under which later files win on duplicate samples."""
        return (self.added_in, self.file_id)


@dataclass(frozen=True)
class SeriesFile:
    path: str
    rows: int
    bytes: int
    # the series shards the file holds (series_index.py); None: not recorded (a file written
    # before shards, read whole)
    shards: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Replaced:
    """A file a commit took out of the vault (compaction, rollup, retention), and when."""

    path: str
    replaced_ms: int


@dataclass(frozen=True)
class Snapshot:
    version: int = 0
    committed_ms: int = 0
    next_file_id: int = 1
    files: tuple[DataFile, ...] = ()
    series_files: tuple[SeriesFile, ...] = ()
    buffers: dict[str, int] = field(default_factory=dict)
    dirty_hours: tuple[int, ...] = ()  # epoch hour numbers whose rollups are stale
    raw_horizon_ms: int = 0  # retention has dropped raw data before this time
    metric_kinds: dict[str, str] = field(default_factory=dict)  # from exposition metadata
    vault_id: str = ""  # "" only before the first commit and in format-1 catalogs
    replaced: tuple[Replaced, ...] = ()  # removed files not deleted yet
    kind_changes: tuple[KindChange, ...] = ()  # every change of metric_kinds, oldest first
    # The version this one was computed from (after any rebase): version - 1 in a linear
    # history; higher gaps only where a damaged version was skipped. 0 before it was recorded.
    parent: int = 0

    def tier_files(self, tier: str) -> list[DataFile]:
        return [f for f in self.files if f.tier == tier]

    def paths(self) -> set[str]:
        """Every data and series file this snapshot references."""
        return {f.path for f in self.files} | {s.path for s in self.series_files}

    def rollup_watermark_ms(self) -> int | None:
        """Rollups are complete for all time before this (None: no stale hours)."""
        return min(self.dirty_hours) * HOUR_MS if self.dirty_hours else None

    def to_json(self, loc: Location) -> bytes:
        body = asdict(self)
        body["format"] = FORMAT
        for entry in [*body["files"], *body["series_files"], *body["replaced"]]:
            entry["path"] = loc.relative(entry["path"])
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, loc: Location) -> Snapshot:
        """Parse a snapshot, resolving its paths under ``loc``. ``ValueError``, ``KeyError``,
        ``TypeError`` or ``AttributeError`` mean a damaged file; StorageError a newer format."""
        body: dict[str, Any] = json.loads(data)
        fmt = body.pop("format", None)
        if fmt not in READABLE_FORMATS:
            raise StorageError(
                f"catalog snapshot has format {fmt!r}, this metricvault reads formats "
                f"{LEGACY_FORMAT} to {FORMAT}: upgrade metricvault"
            )
        return cls(
            version=body["version"],
            committed_ms=body["committed_ms"],
            next_file_id=body["next_file_id"],
            files=tuple(
                # files of catalogs older than added_in were ordered by id alone: version 0
                DataFile(**{"added_in": 0, **f, "path": loc.resolve(f["path"])})
                for f in body["files"]
            ),
            series_files=tuple(
                SeriesFile(
                    **{
                        **f,
                        "path": loc.resolve(f["path"]),
                        "shards": None if f.get("shards") is None else tuple(f["shards"]),
                    }
                )
                for f in body["series_files"]
            ),
            buffers=dict(body["buffers"]),
            dirty_hours=tuple(body["dirty_hours"]),
            raw_horizon_ms=body.get("raw_horizon_ms", 0),
            metric_kinds=dict(body.get("metric_kinds", {})),
            vault_id=str(body.get("vault_id", "")),
            replaced=tuple(
                Replaced(loc.resolve(r["path"]), int(r["replaced_ms"]))
                for r in body.get("replaced", [])
            ),
            kind_changes=tuple(KindChange(**c) for c in body.get("kind_changes", [])),
            parent=int(body.get("parent", 0)),
        )


@dataclass
class Change:
    """An edit to apply on top of the current snapshot in one commit."""

    add: list[DataFile] = field(default_factory=list)
    remove: set[str] = field(default_factory=set)
    add_series: list[SeriesFile] = field(default_factory=list)
    remove_series: set[str] = field(default_factory=set)
    buffers: dict[str, int] = field(default_factory=dict)
    dirty_add: set[int] = field(default_factory=set)
    dirty_remove: set[int] = field(default_factory=set)
    file_ids_used: int = 0
    raw_horizon_ms: int = 0
    metric_kinds: dict[str, str] = field(default_factory=dict)
    kind_changes: list[KindChange] = field(default_factory=list)  # why metric_kinds changed
    forget: set[str] = field(default_factory=set)  # replaced files maintenance has deleted
    # The snapshot this change was computed from, when the caller has it: a commit that finds
    # a newer one rebases the change onto it (ids renumbered, void work refused).
    based_on: Snapshot | None = field(default=None, repr=False, compare=False)

    def rebase(self, since: Snapshot, onto: Snapshot, uri: str) -> Change:
        """This change, computed against ``since``, made valid on top of ``onto`` (which other
        writers' commits produced from it). Files it adds keep their paths; the ids it took
        from ``since`` move above the ids ``onto`` has given out, so "later files win" still
        orders them after the winner's. Hours it would mark rolled up stay dirty where new raw
        files may touch them. Raises CommitConflictError when a file it replaces is gone."""
        gone = (self.remove | self.remove_series) & since.paths() - onto.paths()
        if gone:
            raise CommitConflictError(
                f"catalog of {uri}: between version {since.version} and {onto.version} "
                f"another writer replaced {len(gone)} file(s) this commit replaces (e.g. "
                f"{sorted(gone)[0]}); this commit's work is discarded and the next maintain "
                f"redoes it. {MANY_WRITERS}"
            )
        known = since.paths()
        new_raw = [f for f in onto.tier_files("raw") if f.path not in known]
        newly_dirty = set(onto.dirty_hours) - set(since.dirty_hours)
        stale = {
            h
            for h in self.dirty_remove
            if h in newly_dirty or any(f.min_ts < (h + 1) * HOUR_MS for f in new_raw)
        }
        lo, hi = since.next_file_id, since.next_file_id + self.file_ids_used
        shift = max(0, onto.next_file_id - since.next_file_id)
        return replace(
            self,
            add=[
                replace(f, file_id=f.file_id + shift) if lo <= f.file_id < hi else f
                for f in self.add
            ],
            dirty_remove=self.dirty_remove - stale,
            based_on=onto,
        )

    def apply(self, base: Snapshot, version: int | None = None) -> Snapshot:
        """The snapshot after this change, numbered ``version`` (default: the base's + 1)."""
        committed_ms = int(time.time() * 1000)
        version = base.version + 1 if version is None else version
        added = [replace(f, added_in=version) if f.added_in == UNCOMMITTED else f for f in self.add]
        files = [f for f in base.files if f.path not in self.remove] + added
        series = [s for s in base.series_files if s.path not in self.remove_series]
        dirty = (set(base.dirty_hours) - self.dirty_remove) | self.dirty_add
        still = {f.path for f in files} | {s.path for s in series}
        replaced = [r for r in base.replaced if r.path not in self.forget and r.path not in still]
        known = {r.path for r in replaced}
        replaced += [
            Replaced(p, committed_ms)
            for p in sorted(self.remove | self.remove_series)
            if p not in still and p not in known
        ]
        return replace(
            base,
            version=version,
            parent=base.version,
            committed_ms=committed_ms,
            vault_id=base.vault_id or uuid.uuid4().hex,
            replaced=tuple(replaced),
            next_file_id=base.next_file_id + self.file_ids_used,
            files=tuple(sorted(files, key=lambda f: (f.tier, f.day, f.file_id))),
            series_files=tuple(series + self.add_series),
            buffers={**base.buffers, **self.buffers},
            dirty_hours=tuple(sorted(dirty)),
            raw_horizon_ms=max(base.raw_horizon_ms, self.raw_horizon_ms),
            metric_kinds={**base.metric_kinds, **self.metric_kinds},
            kind_changes=base.kind_changes + tuple(self.kind_changes),
        )


class Catalog:
    def __init__(self, location: Location) -> None:
        self.loc = location
        self._cached: Snapshot | None = None
        self._unreadable: dict[int, str] = {}  # version -> why it could not be read
        self._newest_on_disk = 0  # readable or not: the next commit must be above it
        # What this catalog did, for bench/scale.py and the gateway's logs: listings of
        # catalog/ (the expensive S3 request), versions probed, commit races lost.
        self.listings = 0
        self.probes = 0
        self.lost_races = 0
        self._pins = threading.local()  # a thread's pinned snapshot (:meth:`pinned`)
        self._commits = 0  # commits by this object, any thread: a pinned thread sees them

    def _versions(self) -> list[int]:
        self.listings += 1
        found = []
        for info in self.loc.list_files(CATALOG_DIR):
            m = _VERSION_RE.search(info.path)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def version_path(self, version: int) -> str:
        return self.loc.path(CATALOG_DIR, f"v{version:012d}.json")

    def _load(self, version: int) -> Snapshot | None:
        """The snapshot of ``version``, or None (warned once) when its file is damaged."""
        if version in self._unreadable:
            return None
        return self._parse(version, self.loc.read_bytes(self.version_path(version)))

    def _parse(self, version: int, data: bytes) -> Snapshot | None:
        try:
            return Snapshot.from_json(data, self.loc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._unreadable[version] = f"{type(exc).__name__}: {exc}"
            log.warning(
                "catalog file %s is unreadable (%s): it is skipped, and an older version is "
                "used. Files only it names are kept (maintain deletes no unreferenced file "
                "while a damaged version exists). Restore it from a backup if you have one, "
                "else move it out of catalog/ once you no longer need what it named",
                self.version_path(version),
                self._unreadable[version],
            )
            return None

    def cached(self) -> Snapshot | None:
        """The snapshot this catalog last read or committed (None before any), without I/O."""
        return self._cached

    def current(self) -> Snapshot:
        """The newest readable snapshot (within :meth:`pinned`, this thread's pinned one). A
        warm catalog probes the versions after the one it has (``v<N+1>`` absent: one GET)
        instead of listing catalog/, whose cost grows with the versions kept; a cold one
        starts from catalog/NEWEST. Only a vault without the pointer, or a cached version
        that expiry deleted, falls back to listing."""
        pin: tuple[Snapshot, int] | None = getattr(self._pins, "pin", None)
        suspended: int = getattr(self._pins, "suspended", 0)
        if pin is None or suspended:
            return self._newest()
        if pin[1] != self._commits and self._cached is not None:
            # this process committed since (a flush of samples it acknowledged): read it
            pin = self._pins.pin = (self._cached, self._commits)
        return pin[0]

    @contextlib.contextmanager
    def pinned(self) -> Iterator[Snapshot]:
        """Within the block, :meth:`current` on this thread answers the snapshot read on entry,
        moved on only by this process's own commits (its flushes: samples it acknowledged
        stay readable at once): one query's reads see one version of what other processes
        commit, and probe the catalog once, not once per read (~15 us each on a local disk,
        a GET on S3). Writers never read a pin (:meth:`unpinned`). Nested blocks keep the
        outer pin."""
        outer: tuple[Snapshot, int] | None = getattr(self._pins, "pin", None)
        if outer is None:
            commits = self._commits
            self._pins.pin = (self._newest(), commits)
        try:
            yield self.current()
        finally:
            self._pins.pin = outer

    @contextlib.contextmanager
    def unpinned(self) -> Iterator[None]:
        """Within the block this thread reads the newest snapshot even where it is pinned:
        what a writer bases a change on (a flush's buffer watermark) must be the newest."""
        self._pins.suspended = getattr(self._pins, "suspended", 0) + 1
        try:
            yield
        finally:
            self._pins.suspended -= 1

    def _newest(self) -> Snapshot:
        start, fresh = self._cached, False
        if start is None:
            start, fresh = self._from_pointer(), True
        if start is not None:
            found = self._probe_from(start, fresh)
            if found is not None:
                return found
        return self._current_by_listing()

    def _read_optional(self, path: str) -> bytes | None:
        if self.loc.s3 is not None:
            found = self.loc.s3.get(path)
            return None if found is None else found[0]
        try:
            return self.loc.read_bytes(path)
        except NotFoundError:
            return None

    def _from_pointer(self) -> Snapshot | None:
        data = self._read_optional(self.loc.path(CATALOG_DIR, POINTER))
        try:
            version = int(json.loads(data)["version"]) if data else 0
        except (ValueError, KeyError, TypeError):
            return None  # a damaged hint: list instead
        if version <= 0:
            return None
        data = self._read_optional(self.version_path(version))
        return None if data is None else self._parse(version, data)

    def _probe_from(self, start: Snapshot, fresh: bool = False) -> Snapshot | None:
        """The newest version at or after ``start``, or None when that cannot be proven by
        probing (``start`` was expired meanwhile: versions above it may have been too).
        ``fresh``: ``start`` was just read, so it is known to exist."""
        newest, last = start, start.version
        while True:
            self.probes += 1
            data = self._read_optional(self.version_path(last + 1))
            if data is None:
                break
            last += 1
            snap = self._parse(last, data)
            if snap is not None:
                newest = snap
        if last != newest.version:
            return None  # stopped at a damaged version: let the listing decide
        if newest is start and not fresh:
            exists = self.loc.s3.exists if self.loc.s3 is not None else self.loc.exists
            if not exists(self.version_path(start.version)):
                return None
        self._newest_on_disk = max(self._newest_on_disk, last)
        self._cached = newest
        return newest

    def _current_by_listing(self) -> Snapshot:
        versions = self._versions()
        if not versions:
            return Snapshot()
        self._newest_on_disk = max(self._newest_on_disk, versions[-1])
        for version in reversed(versions):
            if self._cached is not None and self._cached.version == version:
                return self._cached
            snap = self._load(version)
            if snap is not None:
                self._cached = snap
                return snap
        raise StorageError(
            f"no catalog version of vault {self.loc.uri} is readable ({len(versions)} damaged, "
            f"newest {self.version_path(versions[-1])}): restore catalog/ from a backup"
        )

    def history(self) -> list[Snapshot]:
        """Every readable snapshot still on disk, oldest first (damaged ones are warned of)."""
        return [s for v in self._versions() if (s := self._load(v)) is not None]

    def unreadable(self) -> dict[int, str]:
        """Damaged catalog versions seen so far (version -> reason)."""
        return dict(self._unreadable)

    def commit(self, change: Change) -> Snapshot:
        """Apply ``change`` to the newest snapshot as the next version (caller holds the writer
        lock). A version another writer created first is never replaced: the change is rebased
        onto it and committed above it, or CommitConflictError says why it cannot be."""
        since = change.based_on
        for attempt in range(COMMIT_ATTEMPTS):
            base = self._newest()  # never a pinned snapshot: the next version is above all
            if since is not None and since.version != base.version:
                change = change.rebase(since, base, self.loc.uri)
            new = change.apply(base, version=max(base.version, self._newest_on_disk) + 1)
            path = self.version_path(new.version)
            if self.loc.write_bytes_exclusive(path, new.to_json(self.loc)):
                self._cached = new
                self._commits += 1  # after _cached: a pinned thread then reads ``new``
                self._newest_on_disk = new.version
                self._advance_pointer(new.version)
                return new
            self.lost_races += 1
            log.warning(
                "catalog version %d of %s was committed by another writer first; re-reading "
                "it and committing this change on top (attempt %d of %d). %s",
                new.version,
                self.loc.uri,
                attempt + 1,
                COMMIT_ATTEMPTS,
                MANY_WRITERS,
            )
            since = base
            time.sleep(random.uniform(0, min(1.0, 0.01 * 2**attempt)))  # racers drift apart
        raise CommitConflictError(
            f"catalog of {self.loc.uri}: lost the race for the next version {COMMIT_ATTEMPTS} "
            f"times in a row; nothing was committed (buffered samples stay buffered and are "
            f"retried). {MANY_WRITERS}"
        )

    def _advance_pointer(self, version: int) -> None:
        """Point catalog/NEWEST at ``version`` unless it already names a newer one. On S3 the
        pointer is replaced with If-Match on the ETag read, so it never moves backwards; on
        local disk it is replaced atomically (two racing writers may leave the older number:
        readers probe forward from it). It is a hint: a failure here only costs readers a
        listing, never a commit, so it is logged, not raised."""
        path = self.loc.path(CATALOG_DIR, POINTER)
        body = json.dumps({"version": version}).encode()
        try:
            if self.loc.s3 is None:
                self.loc.replace_file(path, body)
                return
            for _ in range(5):
                found = self.loc.s3.get(path)
                if found is not None:
                    try:
                        if int(json.loads(found[0])["version"]) >= version:
                            return
                    except (ValueError, KeyError, TypeError):
                        pass  # damaged: replace it
                if self.loc.s3.replace_if_match(path, body, None if found is None else found[1]):
                    return
        except StorageError as exc:
            log.warning("catalog pointer %s not updated (%s): readers list instead", path, exc)

    def owner(self) -> str:
        """This vault's id, for the names of files about to be written (caller holds the
        writer lock). A new vault commits an empty first version to get one, so that even the
        files of a flush that crashes before its commit carry it."""
        if self._cached is not None and self._cached.vault_id:
            return self._cached.vault_id  # never changes once committed: spare a listing
        snap = self._newest()
        if not snap.vault_id:
            snap = self.upgrade() if snap.version else self.commit(Change())
        return snap.vault_id

    def upgrade(self) -> Snapshot:
        """Rewrite a format-1 catalog as a new version with relative paths and a vault id
        (caller holds the writer lock). Files that older snapshots named and the current one
        does not are recorded as replaced now: they are provably this vault's own."""
        snap = self._newest()
        if snap.vault_id or not snap.version:
            return snap
        history = set().union(*(old.paths() for old in self.history()))
        new = self.commit(Change(remove=history - snap.paths()))
        log.info(
            "catalog of %s upgraded to format %d (paths relative to the vault) as version %d",
            self.loc.uri,
            FORMAT,
            new.version,
        )
        return new

    def expire(self, keep: int) -> tuple[list[Snapshot], int]:
        """Delete all but the newest ``keep`` snapshots; returns the kept ones and the count.
        A damaged version is never deleted: it may name files no readable version does."""
        versions = self._versions()
        doomed = versions[:-keep] if keep < len(versions) else []
        removed = 0
        for v in doomed:
            if self._load(v) is not None:
                self.loc.delete(self.version_path(v))
                removed += 1
        kept = [s for v in versions[-keep:] if (s := self._load(v)) is not None]
        return kept, removed
