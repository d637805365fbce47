"""Deduplication of HA Prometheus pairs at ingest, with Grafana Mimir's HA tracker semantics.

Two Prometheus replicas scraping the same targets both remote-write; each carries the same
cluster label (``ha_cluster_label``, default ``cluster``) and its own replica label
(``ha_replica_label``, default ``__replica__``) as external labels. Per tenant and cluster one
replica is *elected*: its samples are stored, with the replica label removed and the cluster
label kept, so both replicas' copies land on one series; the other replica's samples are
dropped, answered 202 (as Mimir does: a 2xx, so the sender does not resend them, and not a
204, so that a person looking sees they were not stored) and counted in
``metricvault_ha_dropped_samples_total{cluster,replica}``. When the vault has seen no sample of
the elected replica for ``ha_failover_timeout`` (default 30 s), the next request of another
replica elects that replica. This is Mimir's design, described in "Configure Grafana Mimir
high-availability deduplication" (grafana.com/docs/mimir/latest/configure/
configure-high-availability-deduplication/): ``-distributor.ha-tracker.failover-timeout``
(30 s) and ``-distributor.ha-tracker.update-timeout`` (15 s, how often the elected replica's
last-seen time is written to the KV store), a request whose first series lacks either label
is not deduplicated, and a non-elected replica's samples are answered 202.

The election is shared by every gateway of a vault (Mimir keeps it in Consul/etcd; we keep it
in the vault itself): one small JSON record per (tenant, cluster) under ``ha/``, each new
version a new file ``ha/<tenant hash>/<cluster hash>/<generation>.json`` created with the
store's conditional write (:meth:`Location.write_bytes_exclusive`: ``link(2)`` on local disk,
``If-None-Match: *`` on S3). Exactly one writer creates generation *g + 1*, so two gateways that
both see an expired replica cannot both elect theirs: the loser re-reads and follows the
winner. The directory names are hashes, so no label value can name a path; the record holds
the values themselves. Each gateway caches a record for ``ha_cache_ttl`` and writes the
elected replica's last-seen time only every ``ha_update_timeout``, not per request.

No sample is lost twice. A sample a non-elected replica sends is dropped only while the
election record says the elected replica was seen within the failover timeout, i.e. while the
elected replica's own copy of that sample is still arriving. A gateway never drops on a
cached record that shows the elected replica expired: it re-reads the vault first, and either
takes over (the request that finds the leader expired is the first one stored) or finds that
another gateway already elected this replica, and stores. So after a failover no gateway keeps
dropping the new leader's samples on a stale view, and what a failover loses is bounded by
the failover window (plus up to ``ha_update_timeout`` earlier detection, as in Mimir).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from metricvault.config import Settings
from metricvault.durations import parse_duration_ms
from metricvault.errors import (
    CorruptionError,
    LabelError,
    NotFoundError,
    RetryLater,
    TooLargeError,
)
from metricvault.protocols import ServingStore
from metricvault.store.layout import HA_DIR, Location
from metricvault.store.vault import Vault

__all__ = ["Election", "HADecision", "HATracker", "local_location", "tracker_for"]

GENERATION_DIGITS = 12
KEEP_GENERATIONS = 50  # older records are history, deleted so a listing stays small; kept
# long enough that no cache (ha_cache_ttl) can be that many generations behind
MAX_ATTEMPTS = 8  # conditional writes lost in a row before the request is answered 503


@dataclass(frozen=True)
class Election:
    """One version of a (tenant, cluster)'s election record, as stored in the vault."""

    tenant: str
    cluster: str
    replica: str
    received_at_ms: int  # the last time (written every ha_update_timeout) it was seen
    elected_at_ms: int
    generation: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "tenant": self.tenant,
                "cluster": self.cluster,
                "replica": self.replica,
                "received_at_ms": self.received_at_ms,
                "elected_at_ms": self.elected_at_ms,
                "generation": self.generation,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Election:
        try:
            doc = json.loads(data)
            return cls(
                tenant=str(doc["tenant"]),
                cluster=str(doc["cluster"]),
                replica=str(doc["replica"]),
                received_at_ms=int(doc["received_at_ms"]),
                elected_at_ms=int(doc["elected_at_ms"]),
                generation=int(doc["generation"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(
                f"HA election record {where} does not parse ({exc}): delete the directory "
                "holding it; the next request of the cluster elects a replica again"
            ) from exc


@dataclass
class _Cached:
    election: Election | None
    fetched_ms: int


@dataclass
class HADecision:
    """What :meth:`HATracker.filter` did to one request's table."""

    table: pa.Table
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, replica) -> n
    elected: dict[str, str] = field(default_factory=dict)  # cluster -> elected replica
    failovers: list[str] = field(default_factory=list)  # clusters this request took over

    @property
    def dropped_samples(self) -> int:
        return sum(self.dropped.values())

    def message(self) -> str:
        parts = [
            f"{n} sample(s) of replica {replica!r} of cluster {cluster!r} (elected: "
            f"{self.elected.get(cluster, '?')!r})"
            for (cluster, replica), n in sorted(self.dropped.items())
        ]
        return (
            "HA deduplication: not stored, as the elected replica's copies are: "
            + "; ".join(parts)
            + ". The elected replica changes after ha_failover_timeout without its samples\n"
        )


def tracker_for(vault: ServingStore, settings: Settings) -> HATracker:
    """The tracker of a gateway over ``vault``: records in the vault (shared by every gateway
    of it, on local disk or S3), or for a store without vault files in its state directory."""
    if isinstance(vault, Vault):
        return HATracker(vault.location, settings)
    return HATracker(local_location(vault.state_dir), settings)


def local_location(state_dir: Path) -> Location:
    """Where a store without a vault directory (InfluxDB) keeps its election records: its
    local state directory, shared by the gateways of one machine only."""
    root = Path(state_dir).resolve()
    return Location(str(root), pafs.LocalFileSystem(), str(root), root, remote=False)


class HATracker:
    """The election of one replica per (tenant, cluster), shared through ``location``.

    ``clock`` returns wall-clock seconds; every gateway of a vault compares times written by
    the others, so it is the wall clock (keep the machines' clocks in sync, as Mimir needs)."""

    def __init__(
        self,
        location: Location,
        settings: Settings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.location = location
        self.cluster_label = settings.ha_cluster_label
        self.replica_label = settings.ha_replica_label
        self.failover_ms = parse_duration_ms(settings.ha_failover_timeout)
        self.update_ms = parse_duration_ms(settings.ha_update_timeout)
        self.cache_ms = parse_duration_ms(settings.ha_cache_ttl)
        self.max_clusters = settings.ha_max_clusters
        self.clock = clock
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self.failovers = 0  # elections that replaced another replica (for tests and logs)

    @property
    def enabled(self) -> bool:
        return bool(self.replica_label and self.cluster_label)

    # ------------------------------------------------------------------ the request path
    def filter(self, table: pa.Table, tenant: str) -> HADecision:
        """Keep the rows of elected replicas (and rows without both HA labels), the replica
        label removed from the rows that were deduplicated. Blocking (it may read and write
        the vault): run it in a worker thread."""
        names = table.column_names
        if not self.enabled or self.replica_label not in names:
            return HADecision(table)
        if self.cluster_label not in names:
            self._check_lone_replicas(table, pc.is_valid(table.column(self.replica_label)))
            return HADecision(table)
        clusters = table.column(self.cluster_label)
        replicas = table.column(self.replica_label)
        both = pc.and_kleene(pc.is_valid(clusters), pc.is_valid(replicas))
        self._check_lone_replicas(table, pc.and_kleene(pc.is_valid(replicas), pc.invert(both)))
        pairs = _distinct_pairs(clusters, replicas, both)
        if not pairs:
            return HADecision(table)
        decision = HADecision(table)
        keep = pc.invert(both)  # rows without both labels are stored as sent
        for cluster, replica in pairs:
            rows = pc.and_kleene(
                both, pc.and_kleene(pc.equal(clusters, cluster), pc.equal(replicas, replica))
            )
            elected, took_over = self._elect(tenant, cluster, replica)
            decision.elected[cluster] = elected
            if took_over:
                decision.failovers.append(cluster)
            if elected == replica:
                keep = pc.or_kleene(keep, rows)
            else:
                decision.dropped[(cluster, replica)] = pc.sum(rows.cast(pa.int64())).as_py() or 0
        kept = table.filter(keep)
        # the replica label goes from deduplicated rows only (a row with a replica label but
        # no cluster label is not deduplicated, and keeps it, as in Mimir)
        kept_both = pc.and_kleene(
            pc.is_valid(kept.column(self.cluster_label)),
            pc.is_valid(kept.column(self.replica_label)),
        )
        column = pc.if_else(
            kept_both, pa.scalar(None, pa.string()), kept.column(self.replica_label)
        )
        index = kept.column_names.index(self.replica_label)
        if column.null_count == len(column):
            kept = kept.remove_column(index)
        else:
            kept = kept.set_column(index, self.replica_label, column)
        decision.table = kept
        return decision

    def _check_lone_replicas(self, table: pa.Table, lone: pa.ChunkedArray) -> None:
        """A row with the replica label but no cluster label is not deduplicated (Mimir stores
        it as sent); a reserved replica label (``__replica__``) cannot be stored, so refuse it
        clearly instead of storing half a request."""
        if not self.replica_label.startswith("__"):
            return
        rows = table.filter(pc.and_kleene(lone, pc.is_valid(table.column(self.replica_label))))
        if rows.num_rows:
            metric = rows.column("metric")[0].as_py()
            replica = rows.column(self.replica_label)[0].as_py()
            raise LabelError(
                f"{rows.num_rows} sample(s) (e.g. of {metric!r}) carry the HA replica label "
                f"{self.replica_label}={replica!r} but no {self.cluster_label!r} label; nothing "
                f"was stored: set both as external labels of each Prometheus replica "
                f"(external_labels: {{{self.cluster_label}: ..., {self.replica_label}: ...}}), "
                "or drop the replica label"
            )

    def elected(self, tenant: str, cluster: str, replica: str) -> str:
        """The replica elected for (tenant, cluster) after a request from ``replica`` was
        received now: ``replica`` itself when its samples are to be stored."""
        return self._elect(tenant, cluster, replica)[0]

    def _elect(self, tenant: str, cluster: str, replica: str) -> tuple[str, bool]:
        """The elected replica, and whether this call elected ``replica`` in another's place."""
        key = (tenant, cluster)
        with self._lock_for(key):
            now = int(self.clock() * 1000)
            cached = self._cache.get(key)
            fresh = False
            if cached is None or now - cached.fetched_ms >= self.cache_ms:
                cached, fresh = self._refresh(key, now), True
            for _ in range(MAX_ATTEMPTS):
                current = cached.election
                if current is None:
                    if not fresh:
                        cached, fresh = self._refresh(key, now), True
                        continue
                    self._check_cluster_limit(tenant, cluster)
                    new = Election(tenant, cluster, replica, now, now, 1)
                elif current.replica == replica:
                    if now - current.received_at_ms < self.update_ms:
                        return replica, False
                    new = replace(current, received_at_ms=now, generation=current.generation + 1)
                elif now - current.received_at_ms <= self.failover_ms:
                    return current.replica, False  # dropped: the elected one's copy arrives
                elif not fresh:  # never fail over (nor drop) on a cached view: re-read first
                    cached, fresh = self._refresh(key, now), True
                    continue
                else:
                    new = Election(tenant, cluster, replica, now, now, current.generation + 1)
                if self._create(key, new):
                    self._cache[key] = _Cached(new, now)
                    took_over = current is not None and current.replica != replica
                    self.failovers += took_over
                    return replica, took_over
                cached, fresh = self._refresh(key, now), True  # another gateway wrote first
            raise RetryLater(
                f"the HA election of cluster {cluster!r} changed under this gateway "
                f"{MAX_ATTEMPTS} times in a row (other gateways writing it at once); "
                "nothing was stored: send the request again"
            )

    # ------------------------------------------------------------------ the vault records
    def _directory(self, key: tuple[str, str]) -> str:
        tenant, cluster = key
        return self.location.path(HA_DIR, _digest(tenant, 16), _digest(cluster, 32))

    def _refresh(self, key: tuple[str, str], now: int) -> _Cached:
        directory = self._directory(key)
        generations = _generations(self.location, directory)
        election = None
        for generation in sorted(generations, reverse=True):
            path = f"{directory}/{generation:0{GENERATION_DIGITS}d}.json"
            try:
                election = Election.from_json(self.location.read_bytes(path), path)
                break
            except NotFoundError:  # pruned between the listing and the read: an older one
                continue
        cached = _Cached(election, now)
        self._cache[key] = cached
        return cached

    def _create(self, key: tuple[str, str], election: Election) -> bool:
        directory = self._directory(key)
        path = f"{directory}/{election.generation:0{GENERATION_DIGITS}d}.json"
        if not self.location.write_bytes_exclusive(path, election.to_json()):
            return False
        old = election.generation - KEEP_GENERATIONS
        if old >= 1:
            self.location.delete(f"{directory}/{old:0{GENERATION_DIGITS}d}.json")
        return True

    def _check_cluster_limit(self, tenant: str, cluster: str) -> None:
        tenant_dir = self.location.path(HA_DIR, _digest(tenant, 16))
        known = _subdirectories(self.location, tenant_dir)
        if len(known) >= self.max_clusters:
            raise TooLargeError(
                f"tenant {tenant or '(default)'!r} already has {len(known)} HA clusters, the "
                f"limit is {self.max_clusters} (ha_max_clusters); cluster {cluster!r} is new, "
                "and nothing of this request was stored: check the senders' "
                f"{self.cluster_label!r} external label, or raise ha_max_clusters"
            )

    def _lock_for(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(key, threading.Lock())


def _digest(value: str, chars: int) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:chars]


def _generations(location: Location, directory: str) -> list[int]:
    selector = pafs.FileSelector(directory, allow_not_found=True)
    found = []
    for info in location.fs.get_file_info(selector):
        stem = info.base_name.removesuffix(".json")
        if info.type == pafs.FileType.File and stem.isdigit() and info.base_name != stem:
            found.append(int(stem))
    return found


def _subdirectories(location: Location, directory: str) -> list[str]:
    selector = pafs.FileSelector(directory, allow_not_found=True)
    return [i.base_name for i in location.fs.get_file_info(selector)]


def _distinct_pairs(
    clusters: pa.ChunkedArray, replicas: pa.ChunkedArray, both: pa.ChunkedArray
) -> list[tuple[str, str]]:
    """The distinct (cluster, replica) values of the rows that carry both labels."""
    c = clusters.filter(both)
    r = replicas.filter(both)
    if len(c) == 0:
        return []
    unique_c, unique_r = pc.unique(c), pc.unique(r)
    if len(unique_c) == 1 and len(unique_r) == 1:  # a Prometheus request: one of each
        return [(unique_c[0].as_py(), unique_r[0].as_py())]
    pairs = pa.table({"c": c, "r": r}).group_by(["c", "r"]).aggregate([])
    return sorted(zip(pairs.column("c").to_pylist(), pairs.column("r").to_pylist(), strict=True))
