"""Series filters pushed down to the sample views of ``vault.sql``.

A statement such as ``SELECT ... FROM raw r JOIN series s ON r.series_id = s.series_id WHERE
s.metric = 'DCGM_FI_DEV_XID_ERRORS' AND r.value > 0`` filters the samples by a join: DuckDB
cannot hand that filter to the Arrow scans of the data files, so it decodes and probes every
sample of the vault. Here the WHERE clause's conditions that read only the series view are run
on that (small) view first, and the statement gets the implied condition ``r.series_id IN
(<those ids>)`` added to its WHERE. DuckDB pushes that into the scan, where the files' row-group
statistics on ``series_id`` (files are sorted by it) skip every row group of other series.

The rewrite only adds a condition every answer row already satisfies, so answers do not change:
it is made only for a top-level SELECT whose FROM is a tree of inner (or comma) joins of base
tables, where a sample view and ``series`` are joined on ``series_id`` equality, and the
conditions moved are top-level AND terms of the WHERE that name only the series table's columns
(qualified). Anything else runs as written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

SAMPLE_VIEWS = ("raw", "rollup_1m", "rollup_1h")
MAX_PUSHED_IDS = 20_000  # a longer IN list costs DuckDB more to plan than the scan it saves


Narrow = Callable[[str, list[int]], "str | None"]


def push_series_filters(con: Any, statement: str, narrow: Narrow | None = None) -> str:
    """``statement`` with ``<view>.series_id IN (...)`` added where it is implied (see the
    module docstring), or unchanged. ``narrow(view, ids)`` may name a view holding exactly
    the rows of ``view`` whose series_id is in ``ids``: the statement then reads that one."""
    try:
        tree = json.loads(_fetch(con, "SELECT json_serialize_sql(?)", [statement])[0][0])
    except Exception:  # not parseable here: DuckDB words the error when it runs
        return statement
    if tree.get("error") or len(tree.get("statements", [])) != 1:
        return statement
    node = tree["statements"][0]["node"]
    if node.get("type") != "SELECT_NODE" or node.get("cte_map", {}).get("map"):
        return statement
    where = node.get("where_clause")
    if not where:
        return statement
    tables: dict[str, str] = {}  # alias (or name) -> table name
    joins: list[dict[str, Any]] = []
    if not _inner_joins(node.get("from_table"), tables, joins):
        return statement
    refs_by_alias = _base_refs(node["from_table"])
    terms = _conjuncts(where)
    series = [a for a, t in tables.items() if t == "series"]
    samples = [a for a, t in tables.items() if t in SAMPLE_VIEWS]
    if len(series) != 1 or not samples:
        return statement
    s = series[0]
    own = [t for t in terms if (refs := _refs(t)) and all(q == s for q in refs)]
    joined = [a for a in samples if any(_joins_on_series_id(c, a, s) for c in [*joins, *terms])]
    if not own or not joined:
        return statement
    text = statement.encode()
    # a term whose text cannot be cut out exactly is left out: fewer terms, more ids, still
    # implied by the rest
    conditions = [c for c in (_source(con, text, t) for t in own) if c is not None]
    clause = _source(con, text, where)
    if clause is None or not conditions:
        return statement
    ids = _series_ids(con, s, conditions)
    if ids is None:
        return statement
    listed = ", ".join(map(str, ids)) if ids else "NULL"
    implied = " AND ".join(f"{_quote(a)}.series_id IN ({listed})" for a in joined)
    start = text.find(clause.encode(), min(a for a, _ in _spans(where)))
    end = start + len(clause.encode())
    edits = [(start, end, f"({clause}) AND {implied}")]
    if narrow is not None:
        for alias in joined:
            ref = refs_by_alias[alias]
            loc, length = ref.get("query_location"), ref.get("query_location_length")
            name = narrow(tables[alias], ids)
            if name is None or not isinstance(loc, int) or not isinstance(length, int):
                continue
            if loc + length <= start:  # the FROM item, before the WHERE clause
                edits.append((loc, loc + length, f"{_quote(name)} AS {_quote(alias)}"))
    out = text
    for a, b, new in sorted(edits, reverse=True):
        out = out[:a] + new.encode() + out[b:]
    return out.decode()


def _inner_joins(
    ref: dict[str, Any] | None, tables: dict[str, str], joins: list[dict[str, Any]]
) -> bool:
    """Collect the base tables and join conditions of a tree of inner/comma joins; False for
    anything else (outer joins, subqueries, table functions)."""
    if not ref:
        return False
    if ref.get("type") == "BASE_TABLE":
        if ref.get("schema_name") or ref.get("catalog_name"):
            return False
        name = ref["table_name"].lower()
        alias = (ref.get("alias") or name).lower()
        if alias in tables:
            return False
        tables[alias] = name
        return True
    if ref.get("type") != "JOIN" or ref.get("join_type") != "INNER":
        return False
    if ref.get("ref_type") not in ("REGULAR", "CROSS"):
        return False
    if not (
        _inner_joins(ref.get("left"), tables, joins)
        and _inner_joins(ref.get("right"), tables, joins)
    ):
        return False
    if ref.get("using_columns"):
        if [c.lower() for c in ref["using_columns"]] == ["series_id"]:
            joins.append({"using": True, "tables": _aliases(ref)})
        return True
    if ref.get("condition"):
        joins.extend(_conjuncts(ref["condition"]))
    return True


def _base_refs(ref: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if ref.get("type") == "BASE_TABLE":
        return {(ref.get("alias") or ref["table_name"]).lower(): ref}
    return {**_base_refs(ref["left"]), **_base_refs(ref["right"])}


def _aliases(ref: dict[str, Any]) -> list[str]:
    if ref.get("type") == "BASE_TABLE":
        return [(ref.get("alias") or ref["table_name"]).lower()]
    return [*_aliases(ref["left"]), *_aliases(ref["right"])]


def _conjuncts(expr: dict[str, Any]) -> list[dict[str, Any]]:
    if expr.get("class") == "CONJUNCTION" and expr.get("type") == "CONJUNCTION_AND":
        return [t for child in expr["children"] for t in _conjuncts(child)]
    return [expr]


def _refs(expr: Any) -> list[str] | None:
    """The qualifiers of every column an expression reads; None where one is unqualified or
    the expression holds a subquery (which could read anything)."""
    out: list[str] = []

    def walk(x: Any) -> bool:
        if isinstance(x, dict):
            if x.get("class") == "SUBQUERY":
                return False
            if x.get("class") == "COLUMN_REF":
                names = x.get("column_names", [])
                if len(names) != 2:
                    return False
                out.append(names[0].lower())
                return True
            return all(walk(v) for v in x.values())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True

    return out if walk(expr) else None


def _joins_on_series_id(cond: dict[str, Any], sample: str, series: str) -> bool:
    if cond.get("using"):
        return sample in cond["tables"] and series in cond["tables"]
    if cond.get("class") != "COMPARISON" or cond.get("type") != "COMPARE_EQUAL":
        return False
    sides = []
    for side in (cond.get("left", {}), cond.get("right", {})):
        names = [n.lower() for n in side.get("column_names", [])]
        if side.get("class") != "COLUMN_REF" or len(names) != 2 or names[1] != "series_id":
            return False
        sides.append(names[0])
    return sorted(sides) == sorted([sample, series])


def _source(con: Any, text: bytes, expr: dict[str, Any]) -> str | None:
    """The statement's own text of an expression, checked by parsing it back: None unless it
    is exactly that expression. DuckDB notes where each node starts; for some (IN, LIKE) that
    is the operator, so the span of all its nodes is tried too, with a closing parenthesis."""
    spans = list(_spans(expr))
    if not spans:
        return None
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    candidates = [spans[0], (lo, hi)]
    rest = text[hi:]
    gap = len(rest) - len(rest.lstrip())
    if rest[gap : gap + 1] == b")":
        candidates.append((lo, hi + gap + 1))
    for a, b in candidates:
        if not 0 <= a < b <= len(text):
            continue
        try:
            source = text[a:b].decode()
            back = json.loads(
                _fetch(con, "SELECT json_serialize_sql(?)", [f"SELECT 1 WHERE {source}"])[0][0]
            )
            again = back["statements"][0]["node"]["where_clause"]
        except Exception:  # not an expression on its own
            continue
        if _shape(again) == _shape(expr):
            return source
    return None


def _spans(x: Any) -> Any:
    """(start, end) byte offsets of an expression node, then of every node inside it."""
    if isinstance(x, dict):
        start, length = x.get("query_location"), x.get("query_location_length")
        if isinstance(start, int) and isinstance(length, int) and length > 0 and start >= 0:
            yield start, start + length
        for v in x.values():
            yield from _spans(v)
    elif isinstance(x, list):
        for v in x:
            yield from _spans(v)


def _shape(x: Any) -> Any:
    """An expression tree without the positions DuckDB notes in it."""
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items() if not k.startswith("query_location")}
    if isinstance(x, list):
        return [_shape(v) for v in x]
    return x


def _series_ids(con: Any, alias: str, conditions: list[str]) -> list[int] | None:
    """The ids of the series the conditions select, run on the series view itself (the same
    comparison rules as the statement's), or None: too many to list, or they fail there."""
    where = " AND ".join(f"({c})" for c in conditions)
    try:
        rows = _fetch(
            con,
            f"SELECT series_id FROM series AS {_quote(alias)} WHERE {where} "
            f"LIMIT {MAX_PUSHED_IDS + 1}",
        )
    except Exception:  # the statement as written gets DuckDB's own error
        return None
    if len(rows) > MAX_PUSHED_IDS:
        return None
    return sorted(int(r[0]) for r in rows)


def _fetch(con: Any, sql: str, params: list[Any] | None = None) -> list[Any]:
    """Every row of ``sql`` on ``con`` itself (its registered tables are not seen by other
    cursors), fetched to the end so the connection holds no unfinished result."""
    rows: list[Any] = con.execute(sql, params or []).fetchall()
    return rows


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


GROUPS_PER_READ = 4  # row groups decoded together: parallel reads, memory still bounded


def series_rows(path: str, filesystem: pafs.FileSystem, ids: list[int]) -> pa.Table | None:
    """The rows of a data file (its physical columns, page checksums verified) whose
    series_id is in ``ids``, or None when it holds none. Files are sorted by series_id, so
    each series is one run of rows: the series_id column is read only in the row groups
    whose statistics can hold one of them, and then only the row groups those runs reach
    (a row group spans many series: its statistics alone would keep most of them), a few
    at a time, so that memory holds those beside the rows kept."""
    from metricvault.store.files import VERIFY

    wanted = np.asarray(sorted(ids), dtype=np.int64)
    with filesystem.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle, **VERIFY)
        meta = parquet.metadata
        col = parquet.schema_arrow.names.index("series_id")
        candidates = []
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(col).statistics
            if stats is not None and stats.has_min_max:
                at = int(np.searchsorted(wanted, stats.min))
                if at >= wanted.size or int(wanted[at]) > stats.max:
                    continue  # no wanted series in this group's range
            candidates.append(g)
        if not candidates:
            return None
        sids = parquet.read_row_groups(candidates, columns=["series_id"]).column(0)
        rows_of: dict[int, np.ndarray] = {}
        offset = 0
        for g in candidates:
            size = meta.row_group(g).num_rows
            sid = sids.slice(offset, size).to_numpy()
            offset += size
            lo = np.searchsorted(sid, wanted, "left")
            hi = np.searchsorted(sid, wanted, "right")
            runs = [(int(a), int(b)) for a, b in zip(lo, hi, strict=True) if b > a]
            if runs:
                rows_of[g] = np.concatenate([np.arange(a, b) for a, b in runs])
        groups = sorted(rows_of)
        parts = []
        for i in range(0, len(groups), GROUPS_PER_READ):
            batch = groups[i : i + GROUPS_PER_READ]
            table = parquet.read_row_groups(batch)
            base = np.cumsum([0] + [meta.row_group(g).num_rows for g in batch])
            take = np.concatenate([rows_of[g] + base[j] for j, g in enumerate(batch)])
            parts.append(table.take(pa.array(take)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
