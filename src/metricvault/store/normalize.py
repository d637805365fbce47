"""Turn what users hand to ``Vault.write`` into validated ``(series_id, ts, value)`` batches.

Accepted inputs, all in the long shape that queries return:
- Arrow tables and pandas/polars frames with columns ``metric``, ``timestamp`` (int64 epoch ms
  or a timestamp type) and ``value``; every other column is a label (null or "" = absent);
- iterables of ``(metric, labels_dict, ts_ms, value)`` tuples.

Validation is all-or-nothing: the first problem raises and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricvault.durations import MAX_TS_MS, MIN_TS_MS
from metricvault.errors import InputError, LabelError, SeriesCollisionError, ValueRangeError
from metricvault.model import (
    KINDS,
    SAMPLE_SCHEMA,
    DistinctSeriesRows,
    Series,
    kind_from_name,
)

_SEP = "\x00"  # between the cells of a series key; label values may not hold it (model.py)
TIME_COLUMNS = ("timestamp", "ts")


@dataclass(frozen=True)
class Batch:
    samples: pa.Table  # SAMPLE_SCHEMA
    series: list[tuple[int, str, str, str]]  # (series_id, metric, labels_json, kind)


def normalize(data: Any, kinds: Mapping[str, str] | None = None) -> Batch:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        data = _frame_to_arrow(data)
    if isinstance(data, pa.Table):
        return _from_table(data, kinds or {})
    return _from_tuples(data, kinds or {})


def _frame_to_arrow(data: Any) -> Any:
    module = type(data).__module__
    if module.startswith("pandas"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if module.startswith("polars"):
        return data.to_arrow()
    return data


def _from_table(table: pa.Table, kinds: Mapping[str, str]) -> Batch:
    names = table.column_names
    time_col = next((c for c in TIME_COLUMNS if c in names), None)
    missing = [c for c in ("metric", "value") if c not in names] + (
        [] if time_col else ["timestamp"]
    )
    if missing:
        raise InputError(
            f"table lacks column(s) {', '.join(missing)}; write needs 'metric', 'timestamp' "
            f"(epoch ms or a timestamp type) and 'value', other columns are labels; got {names}"
        )
    if table.num_rows == 0:
        return Batch(SAMPLE_SCHEMA.empty_table(), [])
    label_cols = [c for c in names if c not in ("metric", "value", time_col)]
    ts = _timestamps(table.column(time_col))
    values = _values(table.column("value"))
    metric = _strings(table.column("metric"), "metric")
    labels = {c: _strings(table.column(c), c, allow_null=True) for c in label_cols}
    if metric.null_count:
        raise InputError(f"column 'metric' has {metric.null_count} null(s); every row needs one")
    encoded = pc.dictionary_encode(_series_keys(metric, labels)).combine_chunks()
    keys = encoded.dictionary.to_pylist()
    columns = tuple(labels)
    found = [_SERIES_CACHE.get((columns, k)) for k in keys]
    _forget_ambiguous(found, encoded.dictionary, len(columns))
    unseen = [i for i, hit in enumerate(found) if hit is None]
    if unseen:
        _resolve(unseen, found, keys, columns, encoded, metric, labels)
    entries = [e for e in found if e is not None]  # _resolve filled every gap
    kind_of = {name: _kind(name, kinds) for name in {e[1] for e in entries}}
    series = [(e[0], e[1], e[2], kind_of[e[1]]) for e in entries]
    ids = np.fromiter((e[0] for e in entries), np.int64, len(entries))
    sid = ids[encoded.indices.to_numpy()]
    _check(sid, ts, values, series, ids)
    samples = pa.table([pa.array(sid), pa.array(ts), pa.array(values)], schema=SAMPLE_SCHEMA)
    return Batch(samples, _unique(series))


def from_resolved(
    series_ids: np.ndarray,
    timestamps: np.ndarray,
    values: np.ndarray,
    series: list[tuple[int, str, str, str]],
) -> Batch:
    """A batch from samples whose series a decoder already resolved (each row's series id and
    the distinct series with their kinds): the same checks as a table gets, without finding
    the series again."""
    sid = np.asarray(series_ids, dtype=np.int64)
    ts = np.asarray(timestamps, dtype=np.int64)
    vals = np.asarray(values, dtype=np.float64)
    if not (len(sid) == len(ts) == len(vals)):
        raise InputError(
            f"resolved samples have {len(sid)} series ids, {len(ts)} timestamps and "
            f"{len(vals)} values; they must be the same length"
        )
    _check(sid, ts, vals, series, sid)
    samples = pa.table([pa.array(sid), pa.array(ts), pa.array(vals)], schema=SAMPLE_SCHEMA)
    return Batch(samples, _unique(series))


# (label columns, joined key) -> (series_id, metric, labels_json): a gateway sees the same
# series in every scrape, and validating + hashing them again dominated ingest time.
_SERIES_CACHE: dict[tuple[tuple[str, ...], str], tuple[int, str, str]] = {}
_SERIES_CACHE_MAX = 1_000_000


def _resolve(
    missing: list[int],
    found: list[tuple[int, str, str] | None],
    keys: list[str],
    columns: tuple[str, ...],
    encoded: pa.DictionaryArray,
    metric: pa.ChunkedArray,
    labels: dict[str, pa.ChunkedArray],
) -> None:
    """Validate and hash the series not seen before (all of them, or none, are cached)."""
    first_rows = _first_occurrence(encoded.indices.to_numpy(), len(keys)).take(pa.array(missing))
    names = metric.take(first_rows).to_pylist()
    resolved = []
    for name, series_labels in zip(names, _sparse_labels(labels, first_rows), strict=True):
        s = Series.make(name, series_labels)
        resolved.append((s.series_id, s.metric, s.labels_json))
    if len(_SERIES_CACHE) + len(resolved) > _SERIES_CACHE_MAX:
        _SERIES_CACHE.clear()
    for i, entry in zip(missing, resolved, strict=True):
        found[i] = entry
        _SERIES_CACHE[(columns, keys[i])] = entry


def _series_keys(metric: pa.ChunkedArray, labels: dict[str, pa.ChunkedArray]) -> pa.ChunkedArray:
    """One string per row: its cells joined by NUL, a null cell written as an empty one (an
    empty label value is an absent label, so both are the same series)."""
    return pc.binary_join_element_wise(
        metric, *labels.values(), _SEP, null_handling="replace", null_replacement=""
    )


def _forget_ambiguous(found: list[Any], keys: pa.Array, label_columns: int) -> None:
    """Treat as unseen every key with a NUL inside a cell, so validation refuses it.

    A key is unambiguous only if no cell holds the separator: the cache once took
    ``mig="\\x00\\x1e"`` for an absent ``mig`` and stored two series as one. A key
    of a clean row holds exactly one separator per label column; checked on every write, over
    the distinct keys only.
    """
    separators = pc.count_substring(keys, _SEP).to_numpy()
    for i in np.flatnonzero(separators != label_columns).tolist():
        found[i] = None


def _sparse_labels(labels: dict[str, pa.ChunkedArray], rows: pa.Array) -> list[dict[str, str]]:
    """The non-empty labels of each of ``rows``, touching only the cells that hold a value.

    A request may combine many series with many distinct label names, most cells empty; going
    cell by cell in Python cost series x label names (1,000 x 33,000 took 9 s and 1 GB).
    """
    per_row: list[dict[str, str]] = [{} for _ in range(len(rows))]
    for name, column in labels.items():
        taken = column.take(rows)
        if taken.null_count == len(taken):
            continue
        present = np.flatnonzero(pc.fill_null(pc.not_equal(taken, ""), False).to_numpy())
        values = taken.take(pa.array(present)).to_pylist()
        for row, value in zip(present.tolist(), values, strict=True):
            per_row[row][name] = value
    return per_row


def _first_occurrence(indices: np.ndarray, n: int) -> pa.Array:
    order = np.argsort(indices, kind="stable")
    starts = np.searchsorted(indices[order], np.arange(n))
    return pa.array(order[starts])


def _unique(series: list[tuple[int, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """One entry per series id; two label sets with one id are a collision, never merged."""
    if isinstance(series, DistinctSeriesRows) or len({entry[0] for entry in series}) == len(series):
        return series
    seen: dict[int, tuple[int, str, str, str]] = {}
    for entry in series:
        known = seen.setdefault(entry[0], entry)
        if known[1:3] != entry[1:3]:
            raise SeriesCollisionError(
                f"{known[1]}{known[2]} and {entry[1]}{entry[2]} hash to the same 64-bit series "
                "id; nothing was written. Add a distinguishing label to one and report this"
            )
    return list(seen.values())


def _strings(col: pa.ChunkedArray, name: str, allow_null: bool = False) -> pa.ChunkedArray:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_null(col.type):
        return col.cast(pa.string())
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if pa.types.is_floating(col.type) or not (
            pa.types.is_integer(col.type) or pa.types.is_boolean(col.type)
        ):
            raise LabelError(
                f"column {name!r} has type {col.type}; metric and label columns must be strings "
                "(integers are converted): cast it, e.g. df[col] = df[col].astype(str)"
            )
        col = col.cast(pa.string())
    return col.cast(pa.string())


def _timestamps(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = pc.cast(col.cast(pa.timestamp("ms", col.type.tz)), pa.int64())
    elif pa.types.is_integer(col.type):
        col = col.cast(pa.int64())
    else:
        raise InputError(
            f"timestamp column has type {col.type}; give epoch milliseconds as integers or a "
            "timestamp type (pandas datetime64 / Arrow timestamp)"
        )
    if col.null_count:
        raise InputError(f"timestamp column has {col.null_count} null(s)")
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _values(col: pa.ChunkedArray) -> np.ndarray:
    if not (
        pa.types.is_floating(col.type)
        or pa.types.is_integer(col.type)
        or pa.types.is_boolean(col.type)
    ):
        raise InputError(f"value column has type {col.type}; values must be numbers")
    if col.null_count:
        raise InputError(f"value column has {col.null_count} null(s); drop them before writing")
    return np.asarray(col.cast(pa.float64()).to_numpy(), dtype=np.float64)


def _check(
    sid: np.ndarray,
    ts: np.ndarray,
    values: np.ndarray,
    series: list[tuple[int, str, str, str]],
    ids: np.ndarray,
) -> None:
    # NaN, ±Inf and Prometheus staleness markers are stored as they are: PromQL
    # needs them, and rollups count finite samples only (store/rollup.py).
    bad = np.flatnonzero((ts < MIN_TS_MS) | (ts > MAX_TS_MS))
    if bad.size:
        raise ValueRangeError(
            f"{bad.size} timestamp(s) outside 1990..2200, e.g. {ts[bad[0]]} for "
            f"{_name(sid[bad[0]], series)}; timestamps are epoch milliseconds (seconds x 1000)"
        )


def _name(series_id: int, series: list[tuple[int, str, str, str]]) -> str:
    for sid, metric, labels, _ in series:
        if sid == series_id:
            return f"{metric}{labels}"
    return str(series_id)


def _kind(metric: str, kinds: Mapping[str, str]) -> str:
    kind = kinds.get(metric) or kind_from_name(metric)
    if kind not in KINDS:
        raise InputError(f"kind {kind!r} for {metric!r} is not one of {', '.join(KINDS)}")
    return kind


def _from_tuples(rows: Iterable[Any], kinds: Mapping[str, str]) -> Batch:
    cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, str, str, str]] = {}
    sids: list[int] = []
    tss: list[int] = []
    vals: list[float] = []
    try:
        for metric, labels, ts, value in rows:
            key = (metric, tuple(sorted((labels or {}).items())))
            entry = cache.get(key)
            if entry is None:
                s = Series.make(metric, labels)
                entry = cache[key] = (s.series_id, s.metric, s.labels_json, _kind(metric, kinds))
            sids.append(entry[0])
            tss.append(int(ts))
            vals.append(float(value))
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"cannot read sample tuple: {exc}; write takes (metric, labels_dict, ts_ms, value) "
            "tuples, an Arrow table or a DataFrame"
        ) from exc
    sid, ts_a, val = np.array(sids, np.int64), np.array(tss, np.int64), np.array(vals, np.float64)
    series = list(cache.values())
    _check(sid, ts_a, val, series, sid)
    samples = pa.table([pa.array(sid), pa.array(ts_a), pa.array(val)], schema=SAMPLE_SCHEMA)
    return Batch(samples, _unique(series))
