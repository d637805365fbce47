"""The catalog: numbered, immutable JSON snapshots of which files make up the vault.

A commit writes ``catalog/v<N+1>.json`` with create-if-absent semantics (``link(2)`` on local
disk; on S3 a put under the vault's writer lock), so readers always see either the old or the
new snapshot, never half of a flush or a compaction. Each snapshot records the data files with
their tier, day, row count and time range, the series files, the per-buffer watermarks that make
flushes exactly-once, and the hours whose rollups must be recomputed ("dirty" hours).

Why not Iceberg: see docs/decisions/0001-catalog.md.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from metricvault.errors import StorageError
from metricvault.store.layout import Location

FORMAT = 1
_VERSION_RE = re.compile(r"v(\d{12})\.json$")
HOUR_MS = 3_600_000


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


@dataclass(frozen=True)
class SeriesFile:
    path: str
    rows: int
    bytes: int


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

    def tier_files(self, tier: str) -> list[DataFile]:
        return [f for f in self.files if f.tier == tier]

    def rollup_watermark_ms(self) -> int | None:
        """Rollups are complete for all time before this (None: no stale hours)."""
        return min(self.dirty_hours) * HOUR_MS if self.dirty_hours else None

    def to_json(self) -> bytes:
        body = asdict(self)
        body["format"] = FORMAT
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Snapshot:
        body: dict[str, Any] = json.loads(data)
        if body.pop("format", None) != FORMAT:
            raise StorageError("catalog snapshot has an unknown format; upgrade metricvault")
        return cls(
            version=body["version"],
            committed_ms=body["committed_ms"],
            next_file_id=body["next_file_id"],
            files=tuple(DataFile(**f) for f in body["files"]),
            series_files=tuple(SeriesFile(**f) for f in body["series_files"]),
            buffers=dict(body["buffers"]),
            dirty_hours=tuple(body["dirty_hours"]),
            raw_horizon_ms=body.get("raw_horizon_ms", 0),
            metric_kinds=dict(body.get("metric_kinds", {})),
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

    def apply(self, base: Snapshot) -> Snapshot:
        files = [f for f in base.files if f.path not in self.remove] + self.add
        series = [s for s in base.series_files if s.path not in self.remove_series]
        dirty = (set(base.dirty_hours) - self.dirty_remove) | self.dirty_add
        return replace(
            base,
            version=base.version + 1,
            committed_ms=int(time.time() * 1000),
            next_file_id=base.next_file_id + self.file_ids_used,
            files=tuple(sorted(files, key=lambda f: (f.tier, f.day, f.file_id))),
            series_files=tuple(series + self.add_series),
            buffers={**base.buffers, **self.buffers},
            dirty_hours=tuple(sorted(dirty)),
            raw_horizon_ms=max(base.raw_horizon_ms, self.raw_horizon_ms),
            metric_kinds={**base.metric_kinds, **self.metric_kinds},
        )


class Catalog:
    def __init__(self, location: Location) -> None:
        self.loc = location
        self._cached: Snapshot | None = None

    def _versions(self) -> list[int]:
        found = []
        for info in self.loc.list_files("catalog"):
            m = _VERSION_RE.search(info.path)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def _path(self, version: int) -> str:
        return self.loc.path("catalog", f"v{version:012d}.json")

    def current(self) -> Snapshot:
        versions = self._versions()
        if not versions:
            return Snapshot()
        latest = versions[-1]
        if self._cached is None or self._cached.version != latest:
            self._cached = Snapshot.from_json(self.loc.read_bytes(self._path(latest)))
        return self._cached

    def commit(self, change: Change) -> Snapshot:
        """Apply ``change`` to the current snapshot (caller holds the writer lock)."""
        base = self.current()
        new = change.apply(base)
        if not self.loc.write_bytes_exclusive(self._path(new.version), new.to_json()):
            raise StorageError(
                f"catalog version {new.version} was committed by another writer; "
                "two writers without a shared lock use this vault — give each gateway its own"
            )
        self._cached = new
        return new

    def expire(self, keep: int) -> tuple[list[Snapshot], int]:
        """Delete all but the newest ``keep`` snapshots; returns the kept ones and the count."""
        versions = self._versions()
        doomed = versions[:-keep] if keep < len(versions) else []
        for v in doomed:
            self.loc.delete(self._path(v))
        kept = [Snapshot.from_json(self.loc.read_bytes(self._path(v))) for v in versions[-keep:]]
        return kept, len(doomed)
