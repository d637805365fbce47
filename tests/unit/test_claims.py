"""Maintenance claims through the vault: one claimant per piece of work at a time, a dead
claimant's claim expires, a released one is free at once, and a race has one winner.

Two ``Claims`` on one local vault stand for maintainers with their own state directories (on
S3 the same create-if-absent is a conditional PUT; tests/e2e/test_multi_writer.py runs it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metricvault.config import Settings
from metricvault.store.claims import Claims, Lease
from metricvault.store.layout import Location, open_location

TTL = 60_000
NOW = 1_767_225_600_000


@pytest.fixture
def loc(tmp_path: Path) -> Location:
    return open_location(str(tmp_path / "vault"), Settings())


@pytest.mark.parametrize(
    ("first_does", "later_ms", "second_gets_it"),
    [
        ("holds", 0, False),  # held and fresh: skip the work
        ("holds", TTL - 1, False),  # still fresh a moment before expiry
        ("holds", TTL, True),  # expired: a dead maintainer's day is taken over
        ("releases", 0, True),  # released: free at once
    ],
)
def test_a_claim_is_the_first_claimants_until_it_expires_or_is_released(
    loc: Location, first_does: str, later_ms: int, second_gets_it: bool
) -> None:
    a, b = Claims(loc, TTL), Claims(loc, TTL)
    lease = a.acquire("day/2026-01-01", now_ms=NOW)
    assert lease is not None and lease.owner == a.owner
    if first_does == "releases":
        a.release(lease)
    got = b.acquire("day/2026-01-01", now_ms=NOW + later_ms)
    assert (got is not None) == second_gets_it
    assert a.acquire("day/2026-01-02", now_ms=NOW) is not None, "other days stay free"


def test_of_two_claimants_that_both_saw_a_claim_free_exactly_one_wins(
    loc: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = Claims(loc, TTL), Claims(loc, TTL)
    real = b.current
    monkeypatch.setattr(b, "current", lambda key: (real(key), a.acquire(key, now_ms=NOW))[0])
    assert b.acquire("expire", now_ms=NOW) is None  # a won between b's read and b's write
    lease = a.current("expire")
    assert not isinstance(lease, bool) and lease is not None and lease.owner == a.owner
    assert b.skipped == 1


def test_old_generations_are_removed_and_only_the_newest_counts(loc: Location) -> None:
    a = Claims(loc, TTL)
    for n in range(4):
        lease = a.acquire("day/2026-01-01", now_ms=NOW + n * TTL)
        assert lease is not None
        a.release(lease)
    names = sorted(p.name for p in Path(loc.path("claims", "day", "2026-01-01")).iterdir())
    assert len(names) <= 2, names


def test_a_claim_key_that_is_not_a_plain_path_is_refused(loc: Location) -> None:
    with pytest.raises(ValueError, match="not a plain path"):
        Claims(loc, TTL).acquire("../escape")


def test_a_claim_of_a_process_gone_from_this_host_is_taken_at_once(loc: Location) -> None:
    import socket
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    dead = f"{socket.gethostname()}:{int(done.stdout)}:0000abcd"  # exited: its pid is free
    alive = f"{socket.gethostname()}:1:0000abcd"  # pid 1 always runs
    elsewhere = f"another-host-{socket.gethostname()}:{int(done.stdout)}:0000abcd"
    for day, owner, taken in (("01", dead, True), ("02", alive, False), ("03", elsewhere, False)):
        key = f"day/2026-01-{day}"
        assert Claims(loc, TTL, owner=owner).acquire(key, now_ms=NOW) is not None
        assert (Claims(loc, TTL).acquire(key, now_ms=NOW + 1) is not None) == taken, owner


def test_a_stopping_claimant_takes_no_more_claims(loc: Location) -> None:
    a = Claims(loc, TTL)
    a.stopping.set()
    assert a.acquire("day/2026-01-01", now_ms=NOW) is None
    assert a.current("day/2026-01-01") is None, "a stopping claimant wrote a lease"
    assert Claims(loc, TTL).acquire("day/2026-01-01", now_ms=NOW) is not None


def test_release_all_frees_every_claim_still_held_and_only_those(loc: Location) -> None:
    a, b = Claims(loc, TTL), Claims(loc, TTL)
    kept = a.acquire("day/2026-01-01", now_ms=NOW)
    done = a.acquire("day/2026-01-02", now_ms=NOW)
    assert kept is not None and done is not None
    a.release(done)
    assert [lease.key for lease in a.held()] == ["day/2026-01-01"]
    assert a.release_all() == 1 and a.held() == []
    for day in ("01", "02"):  # free at once for a claimant of any host
        assert b.acquire(f"day/2026-01-{day}", now_ms=NOW + 1) is not None


def test_releasing_a_lease_another_claimant_took_over_leaves_theirs(loc: Location) -> None:
    a, b = Claims(loc, TTL), Claims(loc, TTL)
    old = a.acquire("expire", now_ms=NOW)
    assert old is not None
    assert b.acquire("expire", now_ms=NOW + TTL) is not None  # a's had expired
    a.release(old)  # a late release (a shutdown) of a lease that is not the newest any more
    cur = b.current("expire")
    assert isinstance(cur, Lease) and cur.owner == b.owner and cur.held_at(NOW + TTL + 1)


def test_a_stopped_maintenance_loop_claims_nothing_more_and_releases_what_it_holds(
    tmp_path: Path,
) -> None:
    import threading

    from metricvault.store.maintenance import claimant
    from metricvault.store.upkeep import MaintenanceLoop
    from metricvault.store.vault import Vault

    with Vault.open_local(str(tmp_path / "vault")) as vault:
        mine = claimant(vault)
        cut_short = mine.acquire("day/2026-01-01")  # what a round interrupted mid-day holds
        assert cut_short is not None
        stop = threading.Event()
        stop.set()  # serve shutting down, or SIGTERM: the loop ends after its first round
        MaintenanceLoop(vault, 3600).run(stop)
        assert mine.held() == [] and mine.acquire("day/2026-01-02") is None
        other = Claims(vault.location, TTL)  # another live maintainer: no waiting out the TTL
        assert other.acquire("day/2026-01-01") is not None
