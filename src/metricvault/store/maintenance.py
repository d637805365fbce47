"""Maintenance: compaction, rollups, retention and snapshot expiry.

Every step is idempotent and commits atomically, so ``metricvault maintain`` may be killed at
any moment and simply run again. Each step holds the vault's writer lock for one partition at a
time: flushes wait a little, writes (which only append to the durable buffer) never do. Across
state directories (maintainers on other machines), each day's work is claimed first through
the vault (store/claims.py), so two maintainers never do the same day at once.
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricvault.durations import DAY_MS, HOUR_MS, day_closed, now_ms, parse_duration_ms
from metricvault.errors import CommitConflictError
from metricvault.model import TIER_RESOLUTION_MS, TIERS
from metricvault.selector import parse_selector
from metricvault.store import files as fmt
from metricvault.store import rollup
from metricvault.store.catalog import Change, DataFile
from metricvault.store.claims import Claims
from metricvault.store.layout import DATA_DIR, SERIES_DIR, written_by
from metricvault.store.reader import float_columns
from metricvault.store.series_index import SERIES_FILES_COMPACT

if TYPE_CHECKING:
    from metricvault.store.vault import Vault

log = logging.getLogger("metricvault")
MINUTE_MS = TIER_RESOLUTION_MS["1m"]  # the 1m tier's bucket width; model.py owns it

ProgressCallback = Callable[[str, int, int], None]
"""``progress(step, done, total)``: called with ``done`` = 0, 1, ..., ``total`` for each step
that has work (``compacting``, ``rolling up``, ``retention <tier>``). The store draws nothing
itself, so it imports no terminal library; :func:`metricvault.progressbar.console_progress`
is the rich bar the CLI and the demo pass."""


def maintain(
    vault: Vault, now: int | None = None, progress: ProgressCallback | None = None
) -> dict[str, Any]:
    now = now_ms() if now is None else now
    skipped = _claims(vault).skipped
    report: dict[str, Any] = {"flushed_samples": vault.flush() + vault.flush_other_buffers()}
    report["compacted_partitions"] = compact(vault, now, progress)
    report["compacted_series_files"] = compact_series(vault)
    report["rolled_up_hours"] = roll_up(vault, progress)
    report["retention"] = apply_retention(vault, now, progress)
    report["expired"] = expire(vault, now)
    lag = vault.snapshot().dirty_hours
    report["rollup_pending_hours"] = len(lag)
    report["claimed_elsewhere"] = _claims(vault).skipped - skipped
    return report


# One claimant per open vault (so its own claims stay its own across rounds), gone with it.
_CLAIMANTS: weakref.WeakKeyDictionary[Vault, Claims] = weakref.WeakKeyDictionary()


def _claims(vault: Vault) -> Claims:
    claims = _CLAIMANTS.get(vault)
    if claims is None:
        ttl = parse_duration_ms(vault.settings.maintain_claim_ttl)
        claims = _CLAIMANTS[vault] = Claims(vault.location, ttl)
    return claims


def claimant(vault: Vault) -> Claims:
    """This process's claimant for ``vault`` (what store/upkeep.py stops and releases)."""
    return _claims(vault)


@contextmanager
def _claimed(vault: Vault, key: str) -> Iterator[bool]:
    """Whether this maintainer has ``key``'s work (another maintainer of the vault may hold
    it: then the work is skipped this round). See store/claims.py."""
    with _claims(vault).hold(key) as lease:
        yield lease is not None


def _track(progress: ProgressCallback | None, items: list[Any], step: str) -> Iterable[Any]:
    if progress is None or not items:
        yield from items
        return
    progress(step, 0, len(items))
    for done, item in enumerate(items, 1):
        yield item
        progress(step, done, len(items))


# ---------------------------------------------------------------- compaction
def compact_series(vault: Vault) -> int:
    """Merge the series files into one sharded file (``Vault.compact_series_files``) under
    the ``series`` claim; the series files merged."""
    files = vault.snapshot().series_files
    if len(files) < SERIES_FILES_COMPACT and not any(sf.shards is None for sf in files):
        return 0
    with _claimed(vault, "series") as mine:
        if not mine:
            return 0
        try:
            return vault.compact_series_files()
        except CommitConflictError as exc:  # another maintainer merged them first
            log.info("series files not merged this round: %s", exc)
            return 0


def compact(vault: Vault, now: int, progress: ProgressCallback | None = None) -> int:
    """Merge the small files of each partition into one, dropping duplicate samples.

    A closed day (past one counter lookback and an hour of slack) is merged whole; a day that
    is still receiving data only has its small files merged, so its big file is not rewritten
    every round.
    """
    groups: dict[tuple[str, str], list[DataFile]] = defaultdict(list)
    for f in vault.snapshot().files:
        groups[(f.tier, f.day)].append(f)
    todo = [k for k, v in groups.items() if len(_compactable(vault, v, k[1], now)) >= 2]
    done = 0
    for tier, day in _track(progress, sorted(todo), "compacting"):
        with _claimed(vault, f"day/{day}") as mine, vault.writer_lock():
            if not mine:
                continue
            snap = vault.snapshot()
            files = [f for f in snap.files if f.tier == tier and f.day == day]
            chosen = _compactable(vault, files, day, now)
            if len(chosen) < 2:
                continue
            merged = _read_all(vault, chosen)
            new = _newest_of(
                chosen, vault.write_data_file(merged, tier, _day_no(day), _top(chosen))
            )
            removed = {f.path for f in chosen}
            vault.catalog.commit(Change(add=[new], remove=removed, based_on=snap))
            done += 1
    return done


def _compactable(vault: Vault, files: list[DataFile], day: str, now: int) -> list[DataFile]:
    lookback = parse_duration_ms(vault.settings.counter_lookback)
    if day_closed(_day_no(day), lookback, now):
        return files
    limit = vault.settings.compact_small_file_bytes
    newest_big = max((f.order for f in files if f.bytes >= limit), default=(-2, -1))
    # only small files newer than every big one: the merged file takes the newest input's
    # place, and must not jump ahead of a big file that holds newer writes of the same samples
    small = [f for f in files if f.bytes < limit and f.order > newest_big]
    return small if len(small) >= vault.settings.compact_min_files else []


def _read_all(vault: Vault, files: list[DataFile]) -> pa.Table:
    """Every row of ``files``, deduplicated with later files winning."""
    tables = [
        # verified: compaction must not launder a damaged page into a new, valid file
        fmt.decode(fmt.read_table(f.path, vault.location.fs), float_columns(f.tier))
        for f in sorted(files, key=lambda f: f.order)
    ]
    return fmt.sort_dedup(pa.concat_tables(tables))


def _top(inputs: list[DataFile]) -> int:
    return max(inputs, key=lambda f: f.order).file_id


def _newest_of(inputs: list[DataFile], merged: DataFile) -> DataFile:
    """``merged`` (rewritten from ``inputs``) in its newest input's place among the
    partition's files: duplicates against a file another writer committed after that input
    (while this rewrite ran) still go to the other writer's newer file."""
    newest = max(inputs, key=lambda f: f.order)
    return replace(merged, added_in=newest.added_in, file_id=newest.file_id)


def _day_no(day: str) -> int:
    return int(np.datetime64(day, "D").astype(np.int64))


def _day_end(day: str) -> int:
    return (_day_no(day) + 1) * DAY_MS


# ---------------------------------------------------------------- rollups
def roll_up(vault: Vault, progress: ProgressCallback | None = None) -> int:
    """Recompute the 1m and 1h rollups of every dirty hour, one day at a time."""
    by_day: dict[int, list[int]] = defaultdict(list)
    for h in vault.snapshot().dirty_hours:
        by_day[h * HOUR_MS // DAY_MS].append(h)
    total = 0
    for day_no in _track(progress, sorted(by_day), "rolling up"):
        day = str(np.datetime64(day_no, "D"))
        with _claimed(vault, f"day/{day}") as mine, vault.writer_lock():
            if not mine:
                continue
            snap = vault.snapshot()
            hours = [h for h in snap.dirty_hours if h * HOUR_MS // DAY_MS == day_no]
            final = [h for h in hours if h * HOUR_MS < vault.min_writable_ms()]
            if final:  # rollups there are final: their raw data is gone (see vault.py)
                vault.catalog.commit(Change(dirty_remove=set(final)))
                hours = sorted(set(hours) - set(final))
            if hours:
                _roll_up_day(vault, day_no, sorted(hours))
                total += len(hours)
    return total


def _roll_up_day(vault: Vault, day_no: int, hours: list[int]) -> None:
    snap = vault.snapshot()
    lookback = parse_duration_ms(vault.settings.counter_lookback)
    since, until = hours[0] * HOUR_MS, (hours[-1] + 1) * HOUR_MS
    samples = vault.reader.read(
        snap.tier_files("raw"), None, since - lookback, until, use_cache=False
    )
    counters = pa.array(vault.index.counters(), pa.int64())
    partials = rollup.raw_partials(
        samples,
        counters,
        width=MINUTE_MS,
        origin=0,
        since=since,
        until=until,
        lookback=lookback,
        sketch=True,  # stored rows keep a quantile sketch; the 1h rows merge the 1m ones
    )
    hour_set = pa.array(hours, pa.int64())
    partials = partials.filter(pc.is_in(pc.divide(partials["ts"], HOUR_MS), value_set=hour_set))
    change = Change(dirty_remove=set(hours), based_on=snap)
    new_1m = _replace_hours(vault, change, "1m", day_no, hour_set, partials)
    partials_1h = rollup.rollup_partials(
        new_1m.filter(pc.is_in(pc.divide(new_1m["ts"], HOUR_MS), value_set=hour_set)),
        width=HOUR_MS,
        origin=0,
    )
    _replace_hours(vault, change, "1h", day_no, hour_set, partials_1h)
    vault.catalog.commit(change)


def _replace_hours(
    vault: Vault,
    change: Change,
    tier: str,
    day_no: int,
    hours: pa.Array,
    partials: pa.Table,
) -> pa.Table:
    """Swap the rows of ``hours`` in the tier's day partition for ``partials``; returns the
    partition's new rows."""
    snap = vault.snapshot()
    old_files = [f for f in snap.tier_files(tier) if _day_no(f.day) == day_no]
    old = vault.reader.read(
        old_files, None, day_no * DAY_MS, (day_no + 1) * DAY_MS, tier, use_cache=False
    )
    in_hours = pc.is_in(pc.divide(old["ts"], HOUR_MS), value_set=hours)
    kept = old.filter(pc.invert(in_hours))
    rows = pa.concat_tables([kept.cast(rollup.ROLLUP_SCHEMA), rollup.to_rollup_rows(partials)])
    rows = rows.sort_by([("series_id", "ascending"), ("ts", "ascending")])
    change.remove |= {f.path for f in old_files}
    if rows.num_rows:
        file_id = vault.snapshot().next_file_id + change.file_ids_used
        change.add.append(vault.write_data_file(rows, tier, day_no, file_id))
        change.file_ids_used += 1
    return rows


# ---------------------------------------------------------------- retention
def _retention_rules(vault: Vault, tier: str) -> tuple[int | None, list[tuple[Any, int | None]]]:
    from metricvault.durations import parse_retention_ms

    rules = [
        (parse_selector(o.selector), parse_retention_ms(o.retention))
        for o in vault.settings.retention_overrides
        if o.tier == tier
    ]
    return vault.settings.retention_ms(tier), rules


def apply_retention(
    vault: Vault, now: int, progress: ProgressCallback | None = None
) -> dict[str, int]:
    """Drop (or trim) day partitions past their tier's retention; never unrolled raw data."""
    dropped: dict[str, int] = {}
    for tier in TIERS:
        default, rules = _retention_rules(vault, tier)
        shortest = min(
            [r for r in [default, *(r for _, r in rules)] if r is not None], default=None
        )
        if shortest is None:
            continue
        days = sorted({f.day for f in vault.snapshot().tier_files(tier)})
        due = [d for d in days if _day_end(d) <= now - shortest]
        count = 0
        for day in _track(progress, due, f"retention {tier}"):
            with _claimed(vault, f"day/{day}") as mine, vault.writer_lock():
                if mine:
                    count += _expire_day(vault, tier, day, now, default, rules)
        dropped[tier] = count
    return dropped


def _expire_day(
    vault: Vault,
    tier: str,
    day: str,
    now: int,
    default: int | None,
    rules: list[tuple[Any, int | None]],
) -> int:
    snap = vault.snapshot()
    files = [f for f in snap.tier_files(tier) if f.day == day]
    if not files:
        return 0
    if tier == "raw":
        # Rolling up a dirty hour reads one counter lookback before it: keep that raw too.
        lookback = parse_duration_ms(vault.settings.counter_lookback)
        start, end = _day_no(day) * DAY_MS, _day_end(day) + lookback
        pending = [h for h in snap.dirty_hours if start <= h * HOUR_MS < end]
        if pending:
            log.warning(
                "RETENTION BLOCKED: raw data of %s is past retention but %d hour(s) of it are "
                "not rolled up yet; it is kept until 'metricvault maintain' rolls them up",
                day,
                len(pending),
            )
            return 0
    ids = pc.unique(
        pa.concat_arrays(
            [
                pq.read_table(
                    f.path,
                    columns=["series_id"],
                    filesystem=vault.location.fs,
                    partitioning=None,
                    **fmt.VERIFY,
                )["series_id"].combine_chunks()
                for f in files
            ]
        )
    ).to_numpy()
    expired = [s for s in ids if _expired(vault, int(s), day, now, default, rules)]
    if not expired:
        return 0
    change = Change(remove={f.path for f in files}, based_on=snap)
    if len(expired) < len(ids):
        rows = _read_all(vault, files)
        keep = rows.filter(pc.invert(pc.is_in(rows["series_id"], pa.array(expired, pa.int64()))))
        change.add.append(
            _newest_of(files, vault.write_data_file(keep, tier, _day_no(day), _top(files)))
        )
    if tier == "raw":
        change.raw_horizon_ms = _day_end(day)
    vault.catalog.commit(change)
    return 1


def _expired(
    vault: Vault,
    series_id: int,
    day: str,
    now: int,
    default: int | None,
    rules: list[tuple[Any, int | None]],
) -> bool:
    retention = default
    if rules and series_id in vault.index:
        info = vault.index.get(series_id)
        for selector, rule in rules:
            if selector.matches(info.metric, info.labels):
                retention = rule
                break
    return retention is not None and _day_end(day) <= now - retention


# ---------------------------------------------------------------- expiry
def expire(vault: Vault, now: int) -> dict[str, int]:
    """Keep the newest snapshots; delete files that left the vault over ``orphan_grace`` ago.

    A file is deleted only when this vault's own history proves it is garbage: a commit of
    this vault replaced it (compaction, rollup, retention) at least ``orphan_grace`` ago and no
    kept snapshot references it, or its name carries this vault's id (a flush that crashed
    before its commit) and it is older than the grace. Anything else unreferenced (a file
    copied in from another vault, written before vault ids, or while a damaged catalog version
    exists) is kept and counted in ``unproven``. ``now`` is the data clock (tests move it);
    the grace is real time, because a reader holding a snapshot lives in real time.
    """
    grace = parse_duration_ms(vault.settings.orphan_grace)
    keep = vault.settings.keep_snapshots
    with _claimed(vault, "expire") as mine, vault.writer_lock():
        if not mine:
            return {"snapshots": 0, "files": 0, "unproven": 0}
        kept, removed = vault.catalog.expire(keep)
        current = vault.snapshot()
        in_use = set().union(*(s.paths() for s in [current, *kept]))
        on_disk = {
            i.path: i
            for i in [*vault.location.list_files(DATA_DIR), *vault.location.list_files(SERIES_DIR)]
            if i.path.endswith(".parquet")
        }
        wall = now_ms()
        due = {
            r.path
            for r in current.replaced
            if wall - r.replaced_ms >= grace and r.path not in in_use
        }
        replaced = {r.path for r in current.replaced}
        strays = [i for p, i in on_disk.items() if p not in in_use and p not in replaced]
        crashed, unproven = _crash_orphans(vault, strays, current.vault_id, grace, wall)
        for path in sorted(due | set(crashed)):
            vault.location.delete(path)
        if due:  # forget them, then keep the snapshot count at keep_snapshots
            vault.catalog.commit(Change(forget=due))
            removed += vault.catalog.expire(keep)[1]
    deleted = len(due & on_disk.keys()) + len(crashed)
    return {"snapshots": removed, "files": deleted, "unproven": unproven}


def _crash_orphans(
    vault: Vault, strays: list[Any], owner: str, grace: int, wall: int
) -> tuple[list[str], int]:
    """Unreferenced files of crashed writes that may go, and how many others are kept."""
    damaged = vault.catalog.unreadable()
    doomed: list[str] = []
    unproven = 0
    for info in strays:
        if damaged or not written_by(info.path, owner):
            unproven += 1
            continue
        mtime = info.mtime.timestamp() * 1000 if info.mtime else wall
        if wall - mtime >= grace:  # younger: a writer without our lock may be committing it
            doomed.append(info.path)
    if unproven:
        why = (
            f"catalog version(s) {sorted(damaged)} are unreadable and may name them"
            if damaged
            else "they were not written by this vault (its id is not in their names)"
        )
        log.warning(
            "%d unreferenced file(s) under %s are kept: %s. Delete them by hand once you know "
            "they are not needed",
            unproven,
            vault.location.uri,
            why,
        )
    return doomed, unproven
