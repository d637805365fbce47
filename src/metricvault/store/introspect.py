"""Looking inside a vault: the series table, statistics, and the SQL escape hatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from metricvault.durations import now_ms
from metricvault.errors import CorruptionError, InputError
from metricvault.experiment import experiments_table
from metricvault.model import TIERS
from metricvault.selector import parse_selectors
from metricvault.store import files as fmt
from metricvault.store.buffer import quarantined_batches
from metricvault.store.layout import BUFFER_SUFFIX, CATALOG_DIR, DATA_DIR, SERIES_DIR
from metricvault.store.rollup import ROLLUP_SCHEMA, fetch_arrow
from metricvault.store.sql_pushdown import push_series_filters
from metricvault.tables import convert

if TYPE_CHECKING:
    from metricvault.store.vault import Vault


def series_frame(
    vault: Any,
    selector: str | None,
    output: str,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> Any:
    """The series table of anything holding a SeriesIndex (a vault, an opened snapshot),
    narrowed to a selector and to the series seen on a day overlapping ``[start_ms, end_ms]``."""
    index = vault.index
    if selector:
        sel = parse_selectors(selector)
        infos = [index.get(sid) for sid in index.match(sel)]
    else:
        infos = index.all()
    if start_ms is not None or end_ms is not None:
        lo = -(2**63) if start_ms is None else start_ms
        hi = 2**63 - 1 if end_ms is None else end_ms
        infos = [i for i in infos if index.seen_between(i.series_id, lo, hi)]
    infos.sort(key=lambda i: (i.metric, i.labels_json))
    names = sorted({k for i in infos for k in i.labels})
    cols: dict[str, pa.Array] = {
        "series_id": pa.array([i.series_id for i in infos], pa.int64()),
        "metric": pa.array([i.metric for i in infos], pa.string()),
        "kind": pa.array([vault.index.kind(i.series_id) for i in infos], pa.string()),
    }
    for name in names:
        cols[name] = pa.array([i.labels.get(name) for i in infos], pa.string())
    return convert(pa.table(cols), output)


def stats(vault: Vault, now: int | None = None) -> dict[str, Any]:
    now = now_ms() if now is None else now
    snap = vault.snapshot()
    tiers = {}
    for tier in TIERS:
        files = snap.tier_files(tier)
        rows = sum(f.rows for f in files)
        size = sum(f.bytes for f in files)
        tiers[tier] = {
            "files": len(files),
            "rows": rows,
            "bytes": size,
            "bytes_per_row": round(size / rows, 3) if rows else None,
            "first": min((f.min_ts for f in files), default=None),
            "last": max((f.max_ts for f in files), default=None),
        }
    pending_samples, pending_bytes = vault.buffer.depth()
    disk = sum(
        i.size
        for prefix in (DATA_DIR, SERIES_DIR, CATALOG_DIR)
        for i in vault.location.list_files(prefix)
    )
    buffer_files = sum(  # SQLite's -wal and -shm files too
        p.stat().st_size for p in vault.location.state_dir.glob(f"*{BUFFER_SUFFIX}*")
    )
    watermark = snap.rollup_watermark_ms()
    return {
        "uri": vault.location.uri,
        "series": len(vault.index),
        "snapshot": snap.version,
        "tiers": tiers,
        "rollup": {
            "pending_hours": len(snap.dirty_hours),
            "complete_until": watermark,
            "lag_ms": max(0, now - watermark) if watermark is not None else 0,
        },
        "buffer": {
            "samples": pending_samples,
            "bytes": pending_bytes,
            "file_bytes": buffer_files,
            "last_flush_error": vault.last_flush_error,
            # corrupt batches moved aside by a flush (docs/operations.md)
            "quarantined_batches": quarantined_batches(vault.location.state_dir),
        },
        # everything under the vault, including files that old snapshots still reference
        # (maintain deletes a replaced file orphan_grace after its replacement, once no kept
        # snapshot names it; files it cannot prove are this vault's are never deleted)
        "stored_bytes": disk,
        "raw_horizon": snap.raw_horizon_ms or None,
    }


_ROLLUP_VALUE = "coalesce({c}_f, {c}_i / pow(10, scale))"
# format 5 (files.FROM_MIN): sum, max and last may be stored as distances from (count x) min
_FROM_MIN = "coalesce({c}_f, coalesce({c}_i, {c}_j + {ref}min_i) / pow(10, scale))"
_ROLLUP_SUM = _FROM_MIN.format(c="sum", ref="count * ")
_ROLLUP_MIN = f"coalesce({_ROLLUP_VALUE.format(c='min')}, {_ROLLUP_SUM})"
_VIEW_SQL = {
    "raw": "SELECT series_id, ts, make_timestamp(ts * 1000) AS timestamp, "
    "coalesce(value_f, coalesce(value_i, value_j) / pow(10, scale)) AS value FROM {src}",
    # min/max/last are left null in storage where they follow from sum or min (storage-format.md)
    "rollup": "SELECT series_id, ts, make_timestamp(ts * 1000) AS timestamp, count, "
    f"{_ROLLUP_SUM} AS sum, {_ROLLUP_MIN} AS min, "
    f"coalesce({_FROM_MIN.format(c='max', ref='')}, {_ROLLUP_MIN}) AS max, "
    f"coalesce({_FROM_MIN.format(c='last', ref='')}, {_ROLLUP_MIN}) AS last, "
    f"{_ROLLUP_VALUE.format(c='increase')} AS increase, "
    f"{_ROLLUP_SUM} / count AS mean FROM {{src}} "
    # a bucket holding only NaN samples is kept for PromQL (rollup.py), not shown here
    "WHERE count > 0",
}


def run_sql(vault: Vault, statement: str, output: str, pushdown: bool = True) -> Any:
    """``statement`` over the views; ``pushdown``: series filters reach the data files' scans
    (store/sql_pushdown.py; False runs it as written, the benchmark's baseline)."""
    # imported here: pyarrow.dataset pulls in pandas (~0.2 s), which stats and series never need
    import duckdb

    vault.flush_for_read()
    snap = vault.snapshot()
    con = duckdb.connect()
    con.register("series_src", vault.index.to_table())
    con.execute("CREATE VIEW series AS SELECT * FROM series_src")
    con.register("experiments", experiments_table(vault.experiments.list()))
    try:
        if pushdown:  # reads the series view only (and the data files it narrows to)
            statement = push_series_filters(con, statement, _narrower(con, vault, snap))
        # Only the sample views the statement reads: a view over every data file of a tier
        # costs its listing and pyarrow.dataset's import (pandas), a second or so, which a
        # statement narrowed to a few series' rows would otherwise spend for nothing.
        wanted = _tables_read(con, statement)
        for tier in TIERS:
            view = "raw" if tier == "raw" else f"rollup_{tier}"
            if wanted is None or {view, f"{view}_src"} & wanted:
                _register_view(con, vault, snap, tier, view)
        result = fetch_arrow(con, statement)
    except duckdb.Error as exc:
        if "checksum" in str(exc).lower():
            raise CorruptionError(
                f"a data file of this vault is damaged ({exc}): nothing was answered. Run "
                "'metricvault check' to find which file and what it holds, and 'metricvault "
                "check --repair' to fix it"
            ) from exc
        raise InputError(f"SQL failed: {exc}") from exc
    finally:
        con.close()
    return convert(result, output)


def _register_view(con: Any, vault: Vault, snap: Any, tier: str, view: str) -> None:
    files = [f.path for f in snap.tier_files(tier)]
    if files:
        # an Arrow dataset, not DuckDB's read_parquet: it verifies page checksums
        con.register(f"{view}_src", fmt.dataset(files, vault.location.fs))
        sql = _VIEW_SQL["raw" if tier == "raw" else "rollup"].format(src=f"{view}_src")
    else:
        con.register(f"{view}_src", empty_view(tier))
        sql = f"SELECT * FROM {view}_src"
    con.execute(f"CREATE VIEW {view} AS {sql}")


def _tables_read(con: Any, statement: str) -> set[str] | None:
    """The names of the tables a SELECT statement reads (in every subquery and CTE), or
    None: not a statement parsed here, or one reading something else (a schema, a table
    function, the catalog's own tables), for which every view is made."""
    import json

    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [statement]).fetchall()[0][0])
    except Exception:  # not parseable here: DuckDB words the error when it runs
        return None
    if tree.get("error"):
        return None
    names: set[str] = set()
    known = {*SQL_VIEWS, *(f"{v}_src" for v in SQL_VIEWS)}
    ctes: set[str] = set()

    def walk(x: Any) -> bool:
        if isinstance(x, dict):
            for entry in (x.get("cte_map") or {}).get("map") or []:
                ctes.add(str(entry.get("key", "")).lower())
            kind = x.get("type")
            if kind == "BASE_TABLE":
                if x.get("schema_name") or x.get("catalog_name"):
                    return False
                names.add(str(x.get("table_name", "")).lower())
            elif kind == "TABLE_FUNCTION":
                return False
            return all(walk(v) for v in x.values())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True

    if not walk(tree.get("statements", [])):
        return None
    if names - known - ctes - set(_pushed_names(con)):
        return None
    return names


def _pushed_names(con: Any) -> list[str]:
    """The views push_series_filters' narrowing registered (``raw_pushed_<n>``)."""
    rows = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE view_name LIKE '%_pushed_%'"
    ).fetchall()
    return [str(r[0]).lower() for r in rows]


def _narrower(con: Any, vault: Vault, snap: Any) -> Any:
    """``narrow(view, ids)`` for push_series_filters: registers a view with the same columns
    holding the rows of ``view``'s files whose series is in ``ids`` (read by row runs)."""
    from metricvault.store.sql_pushdown import series_rows

    made: list[str] = []

    def narrow(view: str, ids: list[int]) -> str | None:
        # raw only: rollup tiers are many small day files, where opening each costs more
        # than the rows it saves (bench/sql_pushdown.py); they get the IN filter alone
        tier = "raw"
        files = snap.tier_files(tier)
        if view != "raw" or not files or not ids:
            return None
        try:
            read = [series_rows(f.path, vault.location.fs, ids) for f in files]
        except (OSError, pa.ArrowException):  # a damaged file: the statement as written says
            return None  # so, through the checks of the scan it then runs
        parts = [t for t in read if t is not None]
        name = f"{view}_pushed_{len(made)}"
        made.append(name)
        if parts:
            con.register(f"{name}_src", pa.concat_tables(parts, promote_options="permissive"))
            sql = _VIEW_SQL["raw"].format(src=f"{name}_src")
        else:
            con.register(f"{name}_src", empty_view(tier))
            sql = f"SELECT * FROM {name}_src"
        con.execute(f"CREATE VIEW {name} AS {sql}")
        return name

    return narrow


SQL_VIEWS = ("raw", "rollup_1m", "rollup_1h", "series", "experiments")


def empty_view(tier: str) -> pa.Table:
    """The columns of the SQL view of ``tier`` (``raw``, ``rollup_1m``, ...), no rows."""
    ts = pa.timestamp("us")
    if tier == "raw":
        schema = pa.schema(
            [
                ("series_id", pa.int64()),
                ("ts", pa.int64()),
                ("timestamp", ts),
                ("value", pa.float64()),
            ]
        )
    else:
        schema = pa.schema(
            [
                *list(ROLLUP_SCHEMA)[:2],
                ("timestamp", ts),
                *[ROLLUP_SCHEMA.field(c) for c in ("count", "sum", "min", "max", "last")],
                ROLLUP_SCHEMA.field("increase"),
                ("mean", pa.float64()),
            ]
        )
    return schema.empty_table()
