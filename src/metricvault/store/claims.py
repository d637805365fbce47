"""Claims: which maintainer does which piece of work, agreed through the vault itself.

Any number of maintainers (``maintain --loop``, gateways with ``gateway_maintain``), each with its
own state directory, may run against one vault. Before compacting, rolling up or expiring a
day, a maintainer claims it: a lease object ``claims/<key>/g<generation>.json`` naming the
claimant and an expiry, created with the same create-if-absent write the catalog commits with
(``link(2)`` locally, ``If-None-Match: *`` on S3). The newest generation is the claim. Taking an
expired or released claim over is creating the next generation, so of two maintainers that
both saw it free exactly one succeeds; a maintainer killed mid-round holds its days until
its claim expires (``maintain_claim_ttl``), then the next maintainer redoes that work -- at
once when the next one runs on the same host and the killed process is gone. A maintainer
stopped by SIGTERM/SIGINT releases what it holds on the way out (``stopping``, ``release_all``;
store/upkeep.py), so the next one takes the work at once from any host.

A lease is a promise about work, not a lock on the catalog: a maintainer slower than its lease
may still commit, and then the catalog's own compare-and-swap refuses a commit whose input
files another maintainer already replaced (CommitConflictError), so no file is ever merged
twice. Claims only make that refusal rare, and spare the work it would waste.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from metricvault.errors import NotFoundError, StorageError
from metricvault.store.layout import Location

log = logging.getLogger("metricvault.maintain")

CLAIMS_DIR = "claims"
_GEN_RE = re.compile(r"/g(\d{12})\.json$")


@dataclass(frozen=True)
class Lease:
    key: str
    generation: int
    owner: str
    expires_ms: int
    released: bool = False

    def held_at(self, now_ms: int) -> bool:
        return not self.released and now_ms < self.expires_ms


def claimant_id() -> str:
    """Who claims: host, process and a random part (two maintainers in one process differ)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def gone_from_this_host(owner: str) -> bool:
    """True when ``owner`` was a process of this host that no longer runs: a maintainer
    killed here (kill -9, a crash) and restarted need not wait out its own old lease. Wrong
    only when another machine shares this host name and a PID is reused, and then two
    maintainers merely try the same day: the catalog's compare-and-swap still refuses the
    second commit."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, another user's
        return False
    return False


class Claims:
    """Leases on keys (``"day/2026-01-01"``, ``"expire"``) in one vault, for one claimant."""

    def __init__(self, location: Location, ttl_ms: int, owner: str | None = None) -> None:
        if ttl_ms <= 0:
            raise ValueError(f"a claim must last longer than 0 ms, not {ttl_ms}")
        self.loc = location
        self.ttl_ms = ttl_ms
        self.owner = owner or claimant_id()
        self.taken = 0  # claims this claimant won
        self.skipped = 0  # claims another claimant held
        # set when the claimant's process is shutting down: it takes no more leases, so its
        # round skips the rest of the work (store/upkeep.py links it to the loop's stop)
        self.stopping = threading.Event()
        self._held: dict[str, Lease] = {}  # leases taken and not released yet
        self._held_lock = threading.Lock()

    def _dir(self, key: str) -> str:
        if not re.fullmatch(r"\w[\w.=-]*(/\w[\w.=-]*)*", key, re.ASCII):
            raise ValueError(f"claim key {key!r} is not a plain path (letters, digits, _.=-)")
        return f"{CLAIMS_DIR}/{key}"

    def _path(self, key: str, generation: int) -> str:
        return self.loc.path(self._dir(key), f"g{generation:012d}.json")

    def _generations(self, key: str) -> list[int]:
        found = []
        for info in self.loc.list_files(self._dir(key)):
            m = _GEN_RE.search(info.path)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def current(self, key: str) -> Lease | bool | None:
        """The newest lease on ``key``; None when there never was one; False when it cannot
        be read just now (deleted under us, or damaged): then nobody should take it."""
        gens = self._generations(key)
        if not gens:
            return None
        try:
            body = json.loads(self.loc.read_bytes(self._path(key, gens[-1])))
            return Lease(**body)
        except NotFoundError:
            return False  # superseded and cleaned up while we listed: someone is active
        except (ValueError, TypeError) as exc:
            # A torn lease cannot exist (writes are atomic); a damaged one is taken over
            # by the next generation, as an expired one would be.
            log.warning("claim %s generation %d is unreadable (%s)", key, gens[-1], exc)
            return Lease(key, gens[-1], "", 0, released=True)

    def acquire(self, key: str, now_ms: int | None = None) -> Lease | None:
        """A lease on ``key`` for ``ttl_ms``, or None when another claimant holds it or won
        the race for it (skip the work: it is being done)."""
        if self.stopping.is_set():
            return None  # shutting down: the work is left to the next maintainer
        now = int(time.time() * 1000) if now_ms is None else now_ms
        cur = self.current(key)
        if cur is False or (
            isinstance(cur, Lease)
            and cur.held_at(now)
            and cur.owner != self.owner
            and not gone_from_this_host(cur.owner)
        ):
            self.skipped += 1
            return None
        generation = (cur.generation if isinstance(cur, Lease) else 0) + 1
        lease = Lease(key, generation, self.owner, now + self.ttl_ms)
        with self._held_lock:  # held from before the write: a shutdown releases it
            self._held[key] = lease
        if not self._write(lease):
            with self._held_lock:
                self._held.pop(key, None)
            self.skipped += 1
            return None
        self.taken += 1
        for old in self._generations(key):  # only the newest generation matters
            if old < generation:
                self.loc.delete(self._path(key, old))
        return lease

    def release(self, lease: Lease) -> None:
        """Give ``lease`` up: the next claimant need not wait for its expiry. Best effort: a
        claimant that took it over meanwhile (it had expired) keeps its own."""
        try:
            cur = self.current(lease.key)
            mine = (lease.generation, self.owner)
            if not isinstance(cur, Lease) or (cur.generation, cur.owner) == mine:
                self._write(Lease(lease.key, lease.generation + 1, self.owner, 0, released=True))
            # else not ours (any more, or our write never landed): leave it be
        except StorageError as exc:
            log.warning("claim %s not released (%s): it expires by itself", lease.key, exc)
        # only now: a shutdown that interrupts the write above still finds it held and
        # releases it again (release_all), which is a no-op once the first write landed
        with self._held_lock:
            if self._held.get(lease.key) == lease:
                del self._held[lease.key]

    def held(self) -> list[Lease]:
        """The leases this claimant holds now (taken, not released)."""
        with self._held_lock:
            return list(self._held.values())

    def release_all(self) -> int:
        """Release every lease held (a shutdown, after its round was cut short); how many.
        One whose write did not land (the shutdown came during it) is left alone, as
        ``release`` leaves any lease that is not the newest generation."""
        leases = self.held()
        for lease in leases:
            self.release(lease)
        return len(leases)

    def _write(self, lease: Lease) -> bool:
        data = json.dumps(asdict(lease), separators=(",", ":")).encode()
        return self.loc.write_bytes_exclusive(self._path(lease.key, lease.generation), data)

    @contextmanager
    def hold(self, key: str) -> Iterator[Lease | None]:
        """``with claims.hold(key) as lease:`` -- lease is None when the work is someone
        else's; released on leaving the block (an exception included)."""
        lease = self.acquire(key)
        try:
            yield lease
        finally:
            if lease is not None:
                self.release(lease)
