"""The vault's tiers as Apache Iceberg tables (pyiceberg), for engines that do not run our code.

``publish(vault)`` mirrors each tier (``raw``, ``1m``, ``1h``) into one Iceberg table
(``raw``, ``rollup_1m``, ``rollup_1h`` in ``iceberg_namespace``) of a SQL catalog
(``iceberg_catalog``: SQLite for one machine, PostgreSQL for many), with the data decoded:
timestamps as Iceberg ``timestamptz`` (µs, UTC), values as doubles, the labels as a
``map<string,string>`` plus promoted columns for the common DCGM/Prometheus labels, the rollup
aggregates; partitioned by ``day(ts)`` (docs/iceberg.md, docs/storage-format.md).

Exactly once per committed vault file: every Iceberg row carries the ``vault_file_id`` it came
from, and every Iceberg snapshot this module commits records in its summary the full set of
vault file ids the table holds after it (``metricvault.published-files``, as id ranges). A
publish compares that set with the vault's current catalog: files the vault added are appended,
files it replaced (compaction, a recomputed rollup hour, retention) are deleted by
``vault_file_id``, in the same Iceberg transaction. The record and the rows are one commit, so
a publish killed at any moment leaves either the old or the new table, and the next one starts
from what the table says it holds: nothing is appended twice. A commit that loses a race with
another publisher (the catalog's compare-and-swap) re-reads the table and recomputes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from metricvault.config import Settings
from metricvault.errors import ConfigError, MissingDependencyError, StorageError
from metricvault.model import TIERS
from metricvault.store.catalog import DataFile

if TYPE_CHECKING:
    from metricvault.store.vault import Vault

log = logging.getLogger("metricvault.iceberg")

TABLE_NAMES = {"raw": "raw", "1m": "rollup_1m", "1h": "rollup_1h"}
# Labels that get a column of their own (also kept in `labels`): dcgm-exporter's, Kubernetes'
# and Prometheus's target labels, and the ones metricvault's cost report groups by.
PROMOTED_LABELS = (
    "Hostname",
    "gpu",
    "UUID",
    "modelName",
    "device",
    "pci_bus_id",
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "team",
    "experiment",
    "cluster",
)
PUBLISHED = "metricvault.published-files"  # vault file ids in the table after this snapshot
VAULT_ID = "metricvault.vault-id"
CATALOG_VERSION = "metricvault.catalog-version"
# pyiceberg retries a commit that lost the compare-and-swap by re-applying the append on top
# of the winner's snapshot: right for blind appends, wrong here, where the winner may have
# appended the same vault files and our snapshot record would then be stale. With no retries
# the loss surfaces as CommitFailedException and the publish recomputes from the new table.
TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
COMMIT_ATTEMPTS = 10  # lost compare-and-swap races in a row before a publish gives up
ROWS_PER_COMMIT = 4_000_000  # decoded rows held in memory per Iceberg commit
_EARLIEST, _LATEST = -(2**62), 2**62
ROLLUP_DOUBLES = ("sum", "min", "max", "first", "last", "increase", "m2")


@dataclass(frozen=True)
class TablePublish:
    """What one publish did to one table."""

    table: str
    added_files: int
    removed_files: int
    rows_added: int
    files: int  # vault files the table holds now
    snapshot_id: int | None


def sqlite_path(settings: Settings) -> Path | None:
    """The database file of a SQLite catalog (``sqlite:///rel`` or ``sqlite:////abs``)."""
    uri = settings.iceberg_catalog
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def warehouse_uri(settings: Settings) -> str:
    """Where table files go: ``iceberg_warehouse`` as a URI (a path becomes file://); empty
    with a SQLite catalog: a ``warehouse`` directory beside the database file."""
    where = settings.iceberg_warehouse
    db = sqlite_path(settings)
    if not where and db is not None:
        where = str(db.parent / "warehouse")
    if "://" in where:
        return where
    path = Path(where).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def open_catalog(settings: Settings) -> Any:
    """The pyiceberg SQL catalog the settings name (its tables are created on first use)."""
    if not settings.iceberg_catalog:
        raise ConfigError(
            "setting iceberg_catalog is empty: set it to a SQLAlchemy URI, e.g. "
            "--set iceberg_catalog=sqlite:////var/lib/metricvault/iceberg.db (docs/iceberg.md)"
        )
    try:
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError as exc:
        raise MissingDependencyError(
            f"Iceberg tables need pyiceberg ({exc}): pip install 'metricvault[iceberg]'"
        ) from exc
    props: dict[str, str] = {"uri": settings.iceberg_catalog, "warehouse": warehouse_uri(settings)}
    if settings.s3_endpoint:
        props["s3.endpoint"] = settings.s3_endpoint
    props["s3.region"] = settings.s3_region
    if settings.s3_access_key:
        props["s3.access-key-id"] = settings.s3_access_key
        props["s3.secret-access-key"] = settings.s3_secret_key
    db = sqlite_path(settings)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(CATALOG_OPEN_ATTEMPTS):
        try:
            return SqlCatalog("metricvault", **props)
        except Exception as exc:  # SQLAlchemy's errors: unreachable, refused, unknown database
            # Two processes opening a new catalog at once both create its tables, and the
            # second CREATE TABLE fails on PostgreSQL ("relation iceberg_tables already
            # exists", or a duplicate pg_type key): opened again, the tables are there.
            if attempt + 1 < CATALOG_OPEN_ATTEMPTS and _created_meanwhile(exc):
                time.sleep(0.1 * (attempt + 1))
                continue
            raise StorageError(
                f"cannot open the Iceberg catalog {_redacted(settings.iceberg_catalog)}: {exc}; "
                "check iceberg_catalog (the database must exist and accept this user)"
            ) from exc
    raise AssertionError("unreachable")


CATALOG_OPEN_ATTEMPTS = 5


def _created_meanwhile(exc: Exception) -> bool:
    """Whether opening failed because another process created the catalog's tables first."""
    text = str(exc).lower()
    return "already exists" in text or "duplicate key" in text


def _redacted(uri: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", uri)


# --------------------------------------------------------------------------- schema
def iceberg_schema(tier: str) -> Any:
    """The Iceberg schema of ``tier``'s table (docs/storage-format.md, "Iceberg tables")."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        DoubleType,
        IntegerType,
        ListType,
        LongType,
        MapType,
        NestedField,
        StringType,
        TimestamptzType,
    )

    ids = iter(range(1, 1000))
    fields: list[NestedField] = [
        NestedField(next(ids), "ts", TimestamptzType(), required=True),
        NestedField(next(ids), "metric", StringType(), required=True),
    ]
    if tier == "raw":
        fields.append(NestedField(next(ids), "value", DoubleType(), required=False))
    else:
        fields += [
            NestedField(next(ids), "count", LongType(), required=True),
            NestedField(next(ids), "mean", DoubleType(), required=False),
        ]
        for name in ROLLUP_DOUBLES:
            fields.append(NestedField(next(ids), name, DoubleType(), required=False))
            if name in ("first", "last"):
                fields.append(NestedField(next(ids), f"{name}_ts", TimestamptzType(), False))
        fields.append(NestedField(next(ids), "nonfinite", LongType(), required=True))
        for name in ("sketch_keys", "sketch_counts"):
            element = next(ids)
            fields.append(
                NestedField(next(ids), name, ListType(element, IntegerType(), False), False)
            )
    key, value = next(ids), next(ids)
    fields.append(
        NestedField(
            next(ids), "labels", MapType(key, StringType(), value, StringType(), False), True
        )
    )
    for label in PROMOTED_LABELS:
        fields.append(NestedField(next(ids), label, StringType(), required=False))
    fields += [
        NestedField(next(ids), "kind", StringType(), required=True),
        NestedField(next(ids), "series_id", LongType(), required=True),
        NestedField(next(ids), "vault_file_id", LongType(), required=True),
    ]
    return Schema(*fields)


def _partition_spec(schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    ts = schema.find_field("ts").field_id
    return PartitionSpec(
        PartitionField(source_id=ts, field_id=1000, transform=DayTransform(), name="ts_day")
    )


def _table(catalog: Any, namespace: str, tier: str) -> Any:
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:  # another publisher made it
        pass
    except Exception:
        # pyiceberg's SQL catalog tests for the namespace, then inserts its rows: a publisher
        # racing it between the two gets the database's unique-key error (SQLAlchemy's
        # IntegrityError), not NamespaceAlreadyExistsError (seen in a loaded test run)
        if not catalog.namespace_exists(namespace):
            raise
    name = f"{namespace}.{TABLE_NAMES[tier]}"
    if catalog.table_exists(name):
        table = catalog.load_table(name)
    else:
        schema = iceberg_schema(tier)
        try:
            table = catalog.create_table(
                name,
                schema=schema,
                partition_spec=_partition_spec(schema),
                properties=TABLE_PROPERTIES,
            )
        except TableAlreadyExistsError:  # another publisher created it first
            table = catalog.load_table(name)
    if any(table.properties.get(k) != v for k, v in TABLE_PROPERTIES.items()):
        with table.transaction() as tx:  # a table made by someone else: make it ours to commit
            tx.set_properties(TABLE_PROPERTIES)
    return table


# --------------------------------------------------------------------------- id sets
def encode_ids(ids: Iterable[int]) -> str:
    """``1-5,7,9-12``: file ids are handed out in order, so live ones come in long runs."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[1] + 1:
            run[1] = i
            continue
        if run:
            out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
        run = [i, i]
    if run:
        out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
    return ",".join(out)


def decode_ids(text: str) -> set[int]:
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return found


def published_ids(table: Any) -> tuple[set[int], str]:
    """The vault file ids the table holds (its newest snapshot's record) and the vault id."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return set(), ""
    props = snapshot.summary.additional_properties
    return decode_ids(props.get(PUBLISHED, "")), props.get(VAULT_ID, "")


# --------------------------------------------------------------------------- decoding
def decoded_rows(vault: Vault, files: Sequence[DataFile], tier: str, schema: pa.Schema) -> pa.Table:
    """The rows of ``files`` in the table's Arrow schema: decoded values, labels joined in."""
    parts = []
    for f in files:
        rows = vault.reader.read([f], None, _EARLIEST, _LATEST, tier, use_cache=False)
        parts.append(_with_labels(vault, rows, tier, f.file_id, schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _with_labels(
    vault: Vault, rows: pa.Table, tier: str, file_id: int, schema: pa.Schema
) -> pa.Table:
    sid = rows.column("series_id").to_numpy()
    uniq, inverse = np.unique(sid, return_inverse=True)
    infos = []
    for s in uniq:
        try:
            infos.append(vault.index.get(int(s)))
        except KeyError as exc:
            raise StorageError(
                f"vault file id {file_id} holds series {int(s)}, which no series file of the "
                "vault names: run 'metricvault check' before publishing"
            ) from exc
    take = pa.array(inverse.astype(np.int64))

    def per_series(values: list[Any], kind: pa.DataType) -> pa.Array:
        return pa.array(values, kind).take(take)

    def ts_us(name: str) -> pa.Array:
        ms = rows.column(name).combine_chunks()
        return pa.compute.multiply(ms.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))

    cols: dict[str, pa.Array] = {
        "ts": ts_us("ts"),
        "metric": per_series([i.metric for i in infos], pa.string()),
    }
    if tier == "raw":
        cols["value"] = rows.column("value").combine_chunks()
    else:
        count = rows.column("count").combine_chunks()
        cols["count"] = count
        total = rows.column("sum").combine_chunks()
        cols["mean"] = pa.compute.if_else(
            pa.compute.greater(count, 0), pa.compute.divide(total, count.cast(pa.float64())), None
        )
        for name in ROLLUP_DOUBLES:
            cols[name] = rows.column(name).combine_chunks()
            if name in ("first", "last"):
                cols[f"{name}_ts"] = ts_us(f"{name}_ts")
        cols["nonfinite"] = rows.column("nonfinite").combine_chunks()
        for name in ("sketch_keys", "sketch_counts"):
            cols[name] = rows.column(name).combine_chunks()
    cols["labels"] = _label_maps(infos, inverse, schema.field("labels").type)
    for label in PROMOTED_LABELS:
        cols[label] = per_series([i.labels.get(label) for i in infos], pa.string())
    cols["kind"] = per_series([vault.index.kind(int(s)) for s in uniq], pa.string())
    cols["series_id"] = rows.column("series_id").combine_chunks()
    cols["vault_file_id"] = pa.array(np.full(len(sid), file_id, np.int64))
    return pa.table(
        [cols[f.name] if f.name == "labels" else cols[f.name].cast(f.type) for f in schema],
        schema=schema,
    )


def _label_maps(infos: Sequence[Any], inverse: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Each row's labels as a map<string,string>, gathered from one entry list per series
    (built with offsets: ``take`` on a MapArray does not keep its keys valid)."""
    items = [sorted(i.labels.items()) for i in infos]
    lengths = np.array([len(x) for x in items], np.int64)
    series_start = np.cumsum(lengths) - lengths
    row_len = lengths[inverse]
    offsets = np.concatenate([[0], np.cumsum(row_len)]).astype(np.int32)
    total = int(offsets[-1])
    index = np.repeat(series_start[inverse] - offsets[:-1], row_len) + np.arange(total)
    at = pa.array(index, pa.int64())
    keys = pa.array([k for x in items for k, _ in x], kind.key_type).take(at)
    values = pa.array([v for x in items for _, v in x], kind.item_type).take(at)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=kind)


# --------------------------------------------------------------------------- publishing
def publish(
    vault: Vault, settings: Settings | None = None, tiers: Sequence[str] = TIERS
) -> list[TablePublish]:
    """Mirror the vault's committed files of each tier into its Iceberg table (module doc).
    Idempotent: a second call with no new vault commit changes nothing."""
    settings = settings or vault.settings
    for tier in tiers:
        if tier not in TABLE_NAMES:
            raise ConfigError(f"tier {tier!r} is not one of {', '.join(TIERS)}")
    catalog = open_catalog(settings)
    vault.refresh()  # series registered by other writers: their labels are joined in
    return [_publish_tier(vault, catalog, settings.iceberg_namespace, t) for t in tiers]


def _publish_tier(vault: Vault, catalog: Any, namespace: str, tier: str) -> TablePublish:
    from pyiceberg.exceptions import CommitFailedException

    added = removed = rows = 0
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = _table(catalog, namespace, tier)
        try:
            step = _publish_step(vault, table, tier)
        except CommitFailedException as exc:
            log.info(
                "Iceberg commit to %s lost a race (attempt %d): %s", table.name(), attempt, exc
            )
            continue
        if step is None:  # the table holds the vault's files
            table.refresh()
            held, _ = published_ids(table)
            snap = table.current_snapshot()
            return TablePublish(
                TABLE_NAMES[tier],
                added,
                removed,
                rows,
                len(held),
                None if snap is None else snap.snapshot_id,
            )
        added, removed, rows = added + step[0], removed + step[1], rows + step[2]
    raise StorageError(
        f"Iceberg table {namespace}.{TABLE_NAMES[tier]}: {COMMIT_ATTEMPTS} commits in a row "
        "lost to other publishers; nothing of the last one was committed, the next publish "
        "carries on from what the table holds"
    )


def _publish_step(vault: Vault, table: Any, tier: str) -> tuple[int, int, int] | None:
    """One Iceberg commit towards the vault's current files: (files added, removed, rows), or
    None when there is nothing left to do. Removals go with the last batch of additions, so a
    reader never sees a compaction's rows missing (at worst, between commits of one large
    publish, present twice)."""
    from pyiceberg.expressions import In

    snap = vault.catalog_version()
    held, owner = published_ids(table)
    if held and owner and snap.vault_id and owner != snap.vault_id:
        raise StorageError(
            f"Iceberg table {table.name()} was published from vault {owner}, not from this "
            f"vault ({snap.vault_id}): give each vault its own iceberg_namespace"
        )
    wanted = {f.file_id: f for f in snap.tier_files(tier)}
    todo = sorted((i for i in wanted if i not in held), key=lambda i: wanted[i].order)
    gone = held - set(wanted)
    if not todo and not gone:
        return None
    batch: list[DataFile] = []
    batch_rows = 0
    for i in todo:
        if batch and batch_rows + wanted[i].rows > ROWS_PER_COMMIT:
            break
        batch.append(wanted[i])
        batch_rows += wanted[i].rows
    last = len(batch) == len(todo)
    after = (held | {f.file_id for f in batch}) - (gone if last else set())
    props = {
        PUBLISHED: encode_ids(after),
        VAULT_ID: snap.vault_id,
        CATALOG_VERSION: str(snap.version),
    }
    arrow_schema = table.schema().as_arrow()
    data = decoded_rows(vault, batch, tier, arrow_schema)
    with table.transaction() as tx:
        if last and gone:
            # pyiceberg's pydantic model hides In(term, literals) from mypy
            where = In("vault_file_id", sorted(gone))  # type: ignore[call-arg, arg-type]
            tx.delete(where, snapshot_properties=props)
        if batch:
            tx.append(data, snapshot_properties=props)
    return len(batch), len(gone) if last else 0, data.num_rows


def publish_configured(vault: Any) -> list[TablePublish] | None:
    """The maintenance round's hook: publish when the vault's settings name a catalog."""
    settings = getattr(vault, "settings", None)
    if not isinstance(settings, Settings) or not settings.iceberg_catalog:
        return None
    from metricvault.store.vault import Vault

    if not isinstance(vault, Vault):
        return None
    return publish(vault, settings)


def report(results: Sequence[TablePublish]) -> dict[str, Any]:
    """The maintain report's ``iceberg`` entry."""
    return {
        r.table: {
            "added_files": r.added_files,
            "removed_files": r.removed_files,
            "rows_added": r.rows_added,
            "files": r.files,
            "snapshot_id": r.snapshot_id,
        }
        for r in results
    }
