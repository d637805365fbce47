"""``metricvault check [--repair]``: verify every file the current catalog snapshot names.

Each data file is read whole with page checksums verified, and its row count and time range
are compared with the catalog; each series file is read and counted. Nothing changes without
``repair``: the report says what is wrong, what a repair would do and exactly what would be
lost. With ``repair`` the damaged files leave the catalog in one new commit:

* a damaged rollup file whose raw data is still kept: dropped, and its hours marked for
  re-rolling, so the next ``maintain`` recomputes it exactly (nothing is lost);
* a damaged raw file: dropped; its samples are lost (its rollups, if done, still hold the
  per-minute and per-hour aggregates), and the report says how many, of which series, when;
* a damaged series file: dropped and replaced by the series rows still found elsewhere (other
  series files, older catalog snapshots' series files, the ingest buffers). Data files hold
  only series ids, not labels, so a series found nowhere else loses its labels: its samples
  stay in the data files and become visible again when the same series is written again.

A metric stored as a gauge by exposition metadata although its name says counter
(dcgm-exporter's counter fields, ``_total``) is a problem too: ``rate``/``increase`` no longer
read its rollups. Earlier agents typed dcgm-exporter's counters ``unknown`` in OpenMetrics,
and the gateway then stored them as gauges. ``repair`` sets such a metric back to counter from
then on, recorded as a kind change with source ``repair`` (``metricvault kind list --changes``);
a kind an operator set with ``metricvault kind set`` is left alone.

Damaged files are left on disk (expiry deletes them once no snapshot names them).

A catalog version newer than the one the vault reads that does not parse is a problem too
(what it committed is invisible) that no repair can undo: it needs a backup, or moving it out of
``catalog/`` once what it named is not needed. An older damaged version is only a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from metricvault.durations import HOUR_MS, ms_to_datetime, now_ms
from metricvault.errors import MetricVaultError
from metricvault.model import SERIES_SCHEMA, KindChange, explicit_metrics, kind_from_name
from metricvault.store import files as fmt
from metricvault.store.catalog import Catalog, Change, DataFile, SeriesFile, Snapshot
from metricvault.store.layout import CATALOG_DIR, VAULT_LOCK, Location, buffer_files

_SHOWN_IDS = 20  # lost series ids printed in full; the rest are counted


@dataclass
class Problem:
    path: str
    what: str  # what is wrong
    plan: str  # what --repair does
    lost: str  # what is lost by it ("nothing" when recoverable)
    repairable: bool = True  # False: --repair cannot do the plan, a person must


@dataclass
class CheckReport:
    uri: str
    snapshot: int
    data_files: int
    series_files: int
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # harmless: printed, not failed on
    repaired_version: int | None = None  # the catalog version --repair committed

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self, repair: bool) -> list[str]:
        out = [
            f"checked {self.data_files} data file(s) and {self.series_files} series file(s) "
            f"of {self.uri} (catalog snapshot {self.snapshot})"
        ]
        out += [f"warning: {w}" for w in self.warnings]
        for p in self.problems:
            out += [f"PROBLEM {p.path}", f"  {p.what}", f"  plan: {p.plan}", f"  lost: {p.lost}"]
        if self.ok:
            out.append("ok: every file matches its checksums, row count and time range")
        elif repair and self.repaired_version is not None:
            out.append(f"repaired: committed catalog snapshot {self.repaired_version}")
        elif any(p.repairable for p in self.problems):
            out.append("nothing was changed; run 'metricvault check --repair' to do the plan")
        else:
            out.append("nothing was changed: --repair cannot do this plan, see above")
        return out


def check(location: Location, repair: bool = False) -> CheckReport:
    """Verify the current snapshot's files; with ``repair``, commit the plan."""
    catalog = Catalog(location)
    snap = catalog.current()
    report = CheckReport(location.uri, snap.version, len(snap.files), len(snap.series_files))
    _check_catalog(catalog, snap, report)
    change = Change()
    damaged_data = [(f, err) for f in snap.files if (err := _verify_data(location, f))]
    for f, err in damaged_data:
        report.problems.append(_data_problem(location, snap, f, err, change))
    damaged_series = [(s, e) for s in snap.series_files if (e := _verify_series(location, s))]
    recovered: list[tuple[int, str, str, str]] = []
    if damaged_series:
        problem, recovered = _series_problem(location, snap, damaged_series, damaged_data, change)
        report.problems.append(problem)
    kind_fixes = _kind_problems(snap, report, change)
    if repair and (damaged_data or damaged_series or kind_fixes):
        with _writer_lock(location):
            if catalog.current().version != snap.version:
                report.problems.append(
                    Problem(
                        "(catalog)",
                        "another writer committed while checking",
                        "nothing was repaired",
                        "nothing; run 'metricvault check --repair' again",
                    )
                )
                return report
            _write_recovered_series(location, catalog, recovered, change)
            report.repaired_version = catalog.commit(change).version
    return report


def _kind_problems(snap: Snapshot, report: CheckReport, change: Change) -> int:
    """Metrics metadata stored as gauges whose names say counter: the plan sets them back."""
    pinned = explicit_metrics(snap.kind_changes)
    when = {c.metric: c.at_ms for c in snap.kind_changes}
    found = 0
    for metric, kind in sorted(snap.metric_kinds.items()):
        if kind != "gauge" or kind_from_name(metric) != "counter" or metric in pinned:
            continue
        since = f" since {_when(when[metric])}" if metric in when else ""
        report.problems.append(
            Problem(
                f"(metric kinds) {metric}",
                f"{metric} is stored as a gauge{since} (exposition metadata) although its name "
                "says counter: rate and increase do not read its rollups",
                "set it back to counter from now on, recorded as a kind change (source "
                "repair); rollup rows written while it was a gauge keep their columns",
                "nothing",
            )
        )
        change.metric_kinds[metric] = "counter"
        change.kind_changes.append(KindChange(metric, "gauge", "counter", now_ms(), "repair"))
        found += 1
    return found


# ------------------------------------------------------------------ verifying
def _check_catalog(catalog: Catalog, snap: Snapshot, report: CheckReport) -> None:
    """Damaged catalog versions: newer than the one read is a problem, older a warning."""
    catalog.history()  # reads every version, so that older damaged ones are seen too
    for version, why in sorted(catalog.unreadable().items()):
        path = catalog.version_path(version)
        if version < snap.version:
            report.warnings.append(
                f"older catalog version {path} is unreadable ({why}); the vault reads version "
                f"{snap.version}, which is fine: delete the damaged file when you like"
            )
            continue
        report.problems.append(
            Problem(
                path,
                f"catalog version {version} is unreadable ({why}): the vault reads version "
                f"{snap.version}, so what version {version} committed is not visible",
                "none that --repair can do (it never edits catalog files): restore the file "
                "from a backup, or move it out of catalog/ once you no longer need what it "
                "named",
                f"until then, what version {version} committed: the files it named stay on "
                "disk, and maintain deletes no unreferenced file while it exists",
                repairable=False,
            )
        )


def _verify_data(location: Location, f: DataFile) -> str | None:
    """What is wrong with a data file, or None."""
    try:
        table = fmt.read_table(f.path, location.fs)
    except (OSError, pa.ArrowException) as exc:
        return f"cannot be read: {exc}"
    if table.num_rows != f.rows:
        return f"holds {table.num_rows:,} rows, the catalog says {f.rows:,}"
    if table.num_rows:
        lo, hi = int(pc.min(table["ts"]).as_py()), int(pc.max(table["ts"]).as_py())
        if (lo, hi) != (f.min_ts, f.max_ts):
            return f"spans ts {lo}..{hi}, the catalog says {f.min_ts}..{f.max_ts}"
    return None


def _verify_series(location: Location, s: SeriesFile) -> str | None:
    try:
        table = fmt.read_table(s.path, location.fs)
    except (OSError, pa.ArrowException) as exc:
        return f"cannot be read: {exc}"
    if table.num_rows != s.rows:
        return f"holds {table.num_rows:,} series, the catalog says {s.rows:,}"
    return None


# ------------------------------------------------------------------ damaged data files
def _data_problem(
    location: Location, snap: Snapshot, f: DataFile, err: str, change: Change
) -> Problem:
    change.remove.add(f.path)
    span = f"{_when(f.min_ts)} to {_when(f.max_ts)} UTC"
    unit = "samples" if f.tier == "raw" else "rollup rows"
    held = f"{f.rows:,} {unit} of {_series_in(location, f)}"
    what = f"{f.tier} data file (day {f.day}): {err}; it holds {held}, {span}"
    if f.tier != "raw" and _raw_covers(snap, f):
        hours = set(range(f.min_ts // HOUR_MS, f.max_ts // HOUR_MS + 1))
        change.dirty_add |= hours
        plan = (
            f"drop it from the catalog and mark its {len(hours)} hour(s) for re-rolling; "
            "the next 'metricvault maintain' recomputes them from raw"
        )
        return Problem(f.path, what, plan, "nothing: the raw samples are still kept")
    if f.tier == "raw":
        rolled = [r for r in snap.files if r.tier != "raw" and r.path not in change.remove]
        covered = any(r.min_ts <= f.max_ts and r.max_ts >= f.min_ts for r in rolled)
        pending = any(f.min_ts // HOUR_MS <= h <= f.max_ts // HOUR_MS for h in snap.dirty_hours)
        rollups = (
            "their 1m/1h rollups are kept (count, sum, min, max, last per minute and hour)"
            if covered and not pending
            else "hours of it not rolled up yet will be rolled up from the remaining samples only"
        )
        lost = f"{held} at raw resolution, {span}; {rollups}"
    else:
        lost = f"{held}, {span} (raw data there was already dropped by retention)"
    return Problem(f.path, what, "drop it from the catalog", lost)


def _series_in(location: Location, f: DataFile) -> str:
    """'N series' from the file's series_id column, if that column is still readable."""
    try:
        table = fmt.read_table_columns(f.path, location.fs, ["series_id"])
    except (OSError, pa.ArrowException):
        return "an unknown number of series (the series_id column is damaged too)"
    return f"{len(pc.unique(table['series_id']))} series"


def _raw_covers(snap: Snapshot, f: DataFile) -> bool:
    """Raw samples for the rollup file's whole span are still kept (not dropped by retention)."""
    return f.min_ts >= snap.raw_horizon_ms and bool(snap.tier_files("raw"))


# ------------------------------------------------------------------ damaged series files
def _series_problem(
    location: Location,
    snap: Snapshot,
    damaged: list[tuple[SeriesFile, str]],
    damaged_data: list[tuple[DataFile, str]],
    change: Change,
) -> tuple[Problem, list[tuple[int, str, str, str]]]:
    """The problem, and the series rows found elsewhere that a repair writes to a new file."""
    broken = {s.path for s, _ in damaged}
    change.remove_series |= broken
    known = _series_rows(location, [s.path for s in snap.series_files if s.path not in broken])
    readable = [f for f in snap.files if f.path not in {d.path for d, _ in damaged_data}]
    needed = _ids_in(location, readable) - set(known)
    elsewhere = _rows_elsewhere(location, snap, broken)
    found = {sid: row for sid, row in elsewhere.items() if sid in needed}
    lost = sorted(needed - set(found))
    rows = [found[sid] for sid in sorted(found)]
    total = sum(s.rows for s, _ in damaged)
    recovered = max(0, total - len(lost))
    errors = "; ".join(f"{s.path}: {e}" for s, e in damaged)
    what = f"{len(damaged)} damaged series file(s) holding {total} series: {errors}"
    plan = (
        f"drop the damaged file(s) from the catalog; {recovered} series recovered (labels found "
        "in other series files, older catalog snapshots or the ingest buffers"
        + (f"; {len(found)} of them written to a new series file)" if found else ")")
    )
    if not lost:
        return Problem(", ".join(sorted(broken)), what, plan, "nothing"), rows
    shown = ", ".join(str(i) for i in lost[:_SHOWN_IDS])
    more = f" and {len(lost) - _SHOWN_IDS} more" if len(lost) > _SHOWN_IDS else ""
    lost_text = (
        f"{len(lost)} series lost: the labels of series id(s) {shown}{more} are nowhere else "
        "(data files hold only ids). Their samples stay in the data files and come back as "
        "soon as the same series is written again"
    )
    return Problem(", ".join(sorted(broken)), what, plan, lost_text), rows


def _write_recovered_series(
    location: Location, catalog: Catalog, rows: list[tuple[int, str, str, str]], change: Change
) -> None:
    if not rows:
        return
    table = pa.table([pa.array(list(c)) for c in zip(*rows, strict=True)], schema=SERIES_SCHEMA)
    owner = catalog.owner()
    path = location.new_series_path(catalog.current().next_file_id, owner)
    data = fmt.write_plain_parquet(table)
    location.write_file(path, data)
    change.add_series.append(SeriesFile(path, table.num_rows, len(data)))
    change.file_ids_used = 1


def _series_rows(location: Location, paths: list[str]) -> dict[int, tuple[int, str, str, str]]:
    rows: dict[int, tuple[int, str, str, str]] = {}
    for path in paths:
        try:
            table = fmt.read_table(path, location.fs)
        except (OSError, pa.ArrowException):
            continue  # damaged too: reported by the check of its own snapshot
        cols = [table.column(n).to_pylist() for n in SERIES_SCHEMA.names]
        for sid, metric, labels, kind in zip(*cols, strict=True):
            rows.setdefault(int(sid), (int(sid), str(metric), str(labels), str(kind)))
    return rows


def _rows_elsewhere(
    location: Location, snap: Snapshot, broken: set[str]
) -> dict[int, tuple[int, str, str, str]]:
    """Series rows outside the current snapshot's good files: older snapshots' series files
    that still exist, and the series tables of the local ingest buffers."""
    older: list[str] = []
    for snapshot in _history(location):
        older += [s.path for s in snapshot.series_files if s.path not in broken]
    rows = _series_rows(location, sorted(set(older) - {s.path for s in snap.series_files}))
    for buffer in buffer_files(location.state_dir):
        for row in _buffer_series(buffer):
            rows.setdefault(row[0], row)
    return rows


def _buffer_series(path: object) -> list[tuple[int, str, str, str]]:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = db.execute("SELECT series_id, metric, labels, kind FROM series").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [(int(a), str(b), str(c), str(d)) for a, b, c, d in found]


def _ids_in(location: Location, files: list[DataFile]) -> set[int]:
    ids: set[int] = set()
    for f in files:
        table = fmt.read_table_columns(f.path, location.fs, ["series_id"])
        ids.update(int(s) for s in pc.unique(table["series_id"]).to_pylist())
    return ids


# ------------------------------------------------------------------ helpers
def _history(location: Location) -> Iterator[Snapshot]:
    """Every catalog snapshot still on disk (unreadable ones are skipped: this is salvage)."""
    for info in location.list_files(CATALOG_DIR):
        if info.path.endswith(".json"):
            try:
                yield Snapshot.from_json(location.read_bytes(info.path), location)
            except (MetricVaultError, ValueError, KeyError, TypeError):
                continue


@contextlib.contextmanager
def _writer_lock(location: Location) -> Iterator[None]:
    """The lock every catalog commit takes (see Vault.writer_lock), across processes."""
    with open(location.state_dir / VAULT_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _when(ms: int) -> str:
    return f"{ms_to_datetime(ms):%Y-%m-%d %H:%M:%S}"
