"""The series cache vouches for distinct series ids only while no two of its entries share
one: the store then skips its own look for duplicates; otherwise it merges them as before."""

from __future__ import annotations

from typing import Any

import cramjam

from metricvault.ingest.protocols.decode_limits import DecodeBudget
from metricvault.ingest.protocols.remote_write_columns import Limits
from metricvault.ingest.protocols.remote_write_known import SeriesKeyCache, decode_v1_known
from metricvault.model import DistinctSeriesRows
from metricvault.store.normalize import from_resolved
from metricvault.wire.proto import messages

T0 = 1_767_225_600_000


def _raw(series: list[list[tuple[str, str]]], ts: int) -> memoryview:
    request = messages.WriteRequest()
    for labels in series:
        one = request.timeseries.add()
        for name, text in labels:
            one.labels.add(name=name, value=text)
        one.samples.add(value=1.0, timestamp=ts)
    body = cramjam.snappy.compress_raw(request.SerializeToString())
    return memoryview(bytes(cramjam.snappy.decompress_raw(bytes(body))))


def _resolved(cache: SeriesKeyCache, series: list[list[tuple[str, str]]], ts: int) -> Any:
    decoded = decode_v1_known(_raw(series, ts), Limits(None, None, DecodeBudget(None)), cache)
    assert decoded is not None
    resolved = decoded.prepared()
    assert resolved is not None
    return resolved


A = [("__name__", "up"), ("job", "a")]
B = [("__name__", "up"), ("job", "b")]
A_AGAIN = [("__name__", "up"), ("empty", ""), ("job", "a")]  # A, in other bytes


def test_distinct_ids_are_vouched_for_until_two_entries_share_one() -> None:
    cache = SeriesKeyCache()
    first = _resolved(cache, [A, B], T0)
    assert isinstance(first.series, DistinctSeriesRows)
    assert (
        len(from_resolved(first.series_ids, first.timestamps, first.values, first.series).series)
        == 2
    )

    both = _resolved(cache, [A, A_AGAIN], T0 + 1000)
    assert not isinstance(both.series, DistinctSeriesRows)
    assert len(both.series) == 2  # two cache entries, one series
    batch = from_resolved(both.series_ids, both.timestamps, both.values, both.series)
    assert len(batch.series) == 1 and batch.samples.num_rows == 2

    later = _resolved(cache, [A, B], T0 + 2000)  # the flag never turns back
    assert not isinstance(later.series, DistinctSeriesRows)
