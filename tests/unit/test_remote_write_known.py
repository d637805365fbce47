"""Remote-write 1.0's fast path for known series (``remote_write_known``) against the general,
label-by-label path: the same table row for row, the same counts, series ids equal to those the
store computes from the table, and every unusual request left to the general path (its result
or its error)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import cramjam
import numpy as np
import pyarrow as pa
import pytest

from metricvault.errors import LabelError, MetricVaultError, ValueRangeError
from metricvault.ingest.protocols import remote_write_known
from metricvault.ingest.protocols.remote_write import LabelPairCache, decode_remote_write
from metricvault.ingest.protocols.remote_write_columns import KnownDecodedWrite
from metricvault.ingest.protocols.remote_write_known import SeriesKeyCache, decode_v1_known
from metricvault.model import SeriesRows
from metricvault.store.normalize import from_resolved, normalize
from metricvault.wire.proto import messages

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "prometheus_remote_write"
STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
CT_V1 = "application/x-protobuf"


def _body(series: list[tuple[list[tuple[str, str]], list[tuple[float, int]]]]) -> bytes:
    request = messages.WriteRequest()
    for labels, samples in series:
        one = request.timeseries.add()
        for name, text in labels:
            one.labels.add(name=name, value=text)
        for number, ts in samples:
            one.samples.add(value=number, timestamp=ts)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _decode(body: bytes, **kwargs: Any) -> Any:
    return decode_remote_write(
        body, content_type=CT_V1, content_encoding="snappy", version_header="0.1.0", **kwargs
    )


def _general(body: bytes) -> Any:
    return _decode(body, label_cache=LabelPairCache())  # a cache of its own: label by label


def _bits(table: pa.Table) -> pa.Table:
    """``table`` with values as bit patterns (NaN never equals NaN)."""
    raw = table["value"].combine_chunks().buffers()[1]
    bits = pa.Array.from_buffers(pa.uint64(), table.num_rows, [None, raw])
    return table.set_column(table.column_names.index("value"), "value", bits)


def _golden() -> list[str]:
    return sorted(json.loads((GOLDEN / "manifest.json").read_text())["files"])


def _raw(body: bytes) -> memoryview:
    return memoryview(bytes(cramjam.snappy.decompress_raw(body)))


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def known_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both known-series paths: numba's compiled walk and numpy's."""
    assert remote_write_known.start_compiling(wait=True), "numba's compiled decoder loads"
    if request.param == "numpy":
        monkeypatch.setattr(remote_write_known, "USE_COMPILED", False)
    return str(request.param)


T0 = 1_767_225_600_000
GPU = [("Hostname", "node01"), ("UUID", "GPU-1"), ("__name__", "DCGM_FI_DEV_GPU_UTIL")]
BUILT = {
    "one sample per series": [
        ([("__name__", f"m{i}"), ("job", "j"), ("k", str(i))], [(float(i), T0 + i)])
        for i in range(50)
    ],
    "several samples, zero values and zero timestamps left out": [
        ([("__name__", "up"), ("job", "a")], [(0.0, T0), (1.0, T0 + 1), (0.0, 0), (2.5, 0)]),
        ([("__name__", "up"), ("job", "b")], [(3.0, T0)]),
    ],
    "NaN, infinities and staleness markers, bit-exact": [
        ([("__name__", "x_total")], [(math.nan, T0), (math.inf, T0 + 1), (STALE, T0 + 2)]),
        ([("__name__", "y")], [(-math.inf, T0)]),
    ],
    "empty label values are absent labels": [
        ([("__name__", "m"), ("a", ""), ("b", "1")], [(1.0, T0)]),
        ([("__name__", "m"), ("b", "2")], [(2.0, T0)]),
    ],
    "the same series twice in one request": [
        ([("__name__", "m"), ("a", "1")], [(1.0, T0)]),
        ([("__name__", "m"), ("a", "1")], [(2.0, T0 + 5)]),
    ],
    "long label values (two-byte lengths)": [
        ([("Hostname", "h" * 300), ("__name__", "m")], [(1.0, T0)]),
    ],
    "a long label value among short ones, at a later label position": [
        ([("__name__", "m"), ("a", "1")], [(1.0, T0)]),
        ([("__name__", "m"), ("a", "2"), ("b", "x" * 200)], [(2.0, T0), (3.0, T0 + 1)]),
        ([("__name__", "n")], [(4.0, T0)]),
    ],
    "dcgm-like labels": [(sorted(GPU), [(50.0, T0)])],
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_known_series_decode_to_the_general_paths_table(name: str) -> None:
    body = _body(BUILT[name])
    for _ in range(2):  # first sight (learns) and then known
        fast, general = _decode(body), _general(body)
        assert isinstance(fast, KnownDecodedWrite)
        assert _bits(fast.table).equals(_bits(general.table))
        for field in ("samples", "stale_markers", "non_finite", "series", "histograms"):
            assert getattr(fast, field) == getattr(general, field), field


@pytest.mark.parametrize("name", _golden())
def test_golden_prometheus_bodies_decode_the_same_either_way(name: str) -> None:
    body = (GOLDEN / name).read_bytes()
    fast, general = _decode(body), _general(body)
    assert _bits(fast.table).equals(_bits(general.table))
    assert (fast.samples, fast.series, fast.kinds) == (
        general.samples,
        general.series,
        general.kinds,
    )


STORABLE = sorted(name for name in BUILT if "zero timestamps" not in name)


@pytest.mark.parametrize("name", STORABLE)
def test_resolved_series_ids_are_the_ones_the_store_computes(name: str) -> None:
    fast = _decode(_body(BUILT[name]))
    resolved = fast.prepared()
    assert resolved is not None
    batch = normalize(fast.table)
    assert np.array_equal(resolved.series_ids, batch.samples["series_id"].to_numpy())
    assert sorted(set(resolved.series)) == sorted(batch.series)


def test_resolved_samples_get_the_stores_checks() -> None:
    fast = _decode(_body(BUILT["several samples, zero values and zero timestamps left out"]))
    resolved = fast.prepared()
    assert resolved is not None
    with pytest.raises(ValueRangeError) as from_table:
        normalize(fast.table)
    with pytest.raises(ValueRangeError) as from_ids:
        from_resolved(resolved.series_ids, resolved.timestamps, resolved.values, resolved.series)
    assert str(from_ids.value) == str(from_table.value)


def test_a_replaced_table_is_normalized_again() -> None:
    import dataclasses

    fast = _decode(_body(BUILT["one sample per series"]))
    assert fast.prepared() is not None
    filtered = dataclasses.replace(fast, table=fast.table.slice(0, 3))
    assert filtered.prepared() is None and filtered.table.num_rows == 3


def _with_metadata() -> bytes:
    request = messages.WriteRequest()
    one = request.timeseries.add()
    one.labels.add(name="__name__", value="m")
    one.samples.add(value=1.0, timestamp=T0)
    request.metadata.add(type=1, metric_family_name="m")
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _with_exemplar() -> bytes:
    request = messages.WriteRequest()
    one = request.timeseries.add()
    one.labels.add(name="__name__", value="m")
    one.samples.add(value=1.0, timestamp=T0)
    one.exemplars.add(value=1.0, timestamp=T0)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


LEFT_TO_THE_GENERAL_PATH = {
    "metadata": _with_metadata(),
    "an exemplar": _with_exemplar(),
    "a series without samples": _body(
        [([("__name__", "m")], []), ([("__name__", "n")], [(1.0, T0)])]
    ),
    "many samples in one series": _body(
        [([("__name__", "m")], [(1.0, T0 + i) for i in range(100)])]
    ),
}


@pytest.mark.parametrize("name", sorted(LEFT_TO_THE_GENERAL_PATH))
def test_unusual_requests_are_left_to_the_general_path(name: str) -> None:
    body = LEFT_TO_THE_GENERAL_PATH[name]
    limits = _limits()
    assert decode_v1_known(_raw(body), limits, SeriesKeyCache()) is None
    fast, general = _decode(body), _general(body)
    assert not isinstance(fast, KnownDecodedWrite)
    assert _bits(fast.table).equals(_bits(general.table))


BROKEN = {
    "unsorted labels": [([("b", "1"), ("__name__", "m"), ("a", "1")], [(1.0, T0)])],
    "a bad label name": [([("__name__", "m"), ("a-b", "1")], [(1.0, T0)])],
    "no metric name": [([("job", "x")], [(1.0, T0)])],
    "a bad metric name": [([("__name__", "1m")], [(1.0, T0)])],
    "a duplicated label": [([("__name__", "m"), ("a", "1"), ("a", "2")], [(1.0, T0)])],
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_series_get_the_general_paths_error(name: str) -> None:
    body = _body(BROKEN[name])
    with pytest.raises(MetricVaultError) as general:
        _general(body)
    with pytest.raises(type(general.value)) as fast:
        _decode(body)
    assert str(fast.value) == str(general.value)
    assert isinstance(fast.value, LabelError)


def test_the_series_cache_is_bounded() -> None:
    cache = SeriesKeyCache(max_series=4)
    body = _body(BUILT["one sample per series"])  # 50 series: more than it holds
    assert decode_v1_known(_raw(body), _limits(), cache) is None  # the general path takes it
    assert len(cache.known) <= 4
    small = _body(BUILT["one sample per series"][:3])
    decoded = decode_v1_known(_raw(small), _limits(), cache)
    assert decoded is not None and decoded.samples == 3
    assert len(cache.known) == 3


def test_series_keys_stand_for_one_row_each_across_requests() -> None:
    cache = SeriesKeyCache()
    series = BUILT["one sample per series"]
    first = decode_v1_known(_raw(_body(series[:30])), _limits(), cache)
    again = decode_v1_known(_raw(_body(series[10:40])), _limits(), cache)
    assert first is not None and again is not None
    rows: dict[int, tuple[int, str, str, str]] = {}
    for decoded in (first, again):
        resolved = decoded.prepared()
        assert resolved is not None
        assert isinstance(resolved.series, SeriesRows)
        keys = resolved.series.keys.tolist()
        assert len(set(keys)) == len(keys) == len(resolved.series)
        for key, row in zip(keys, resolved.series, strict=True):
            assert rows.setdefault(key, row) == row
    assert len(rows) == 40
    other = decode_v1_known(_raw(_body(series[:30])), _limits(), SeriesKeyCache())
    assert other is not None
    prepared = other.prepared()
    assert prepared is not None and isinstance(prepared.series, SeriesRows)
    assert not set(prepared.series.keys.tolist()) & set(rows)  # another cache's keys


def _limits() -> Any:
    from metricvault.ingest.protocols.decode_limits import DecodeBudget
    from metricvault.ingest.protocols.remote_write_columns import Limits

    return Limits(None, None, DecodeBudget(None))
