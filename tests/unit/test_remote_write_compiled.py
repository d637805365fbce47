"""remote_write's compiled known-series walk (``remote_write_compiled``): its key table finds
exactly the keys it holds, also while it grows under a reader; its samples are protobuf's; every
body it does not take in full (truncated, other fields, odd shapes) is left to the numpy path;
and the series cache builds its table from what it learned before the compiler was ready."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from metricvault.ingest.protocols import remote_write_known
from metricvault.model import SeriesRows
from metricvault.wire.proto import messages
from tests.unit.test_remote_write_known import _body, _raw


@pytest.fixture(scope="module")
def compiled() -> Any:
    remote_write_known.start_compiling(wait=True)
    walk = remote_write_known.compiled_walk()
    assert walk is not None, "numba's compiled decoder loads"
    return walk


def _keys(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    keys = {b"", b"a", b"ab", b"abcdefgh", b"abcdefghi"}  # under, at and over one word
    while len(keys) < count:
        size = rng.choice([3, 8, 15, 16, 17, 64, 239, 400])
        keys.add(bytes(rng.getrandbits(8) for _ in range(size)))
    return sorted(keys)


def _found(compiled: Any, table: Any, keys: list[bytes], arrays: Any = None) -> list[int]:
    """Each key's entry in ``table`` (or in an earlier ``arrays`` of it), -1 if not there."""
    buffer = np.frombuffer(b"".join(keys) + bytes(8), dtype=np.uint8)
    ends = np.cumsum([len(k) for k in keys], dtype=np.int64)
    starts = ends - np.array([len(k) for k in keys], dtype=np.int64)
    found = np.empty(len(keys), dtype=np.int64)
    words = compiled.words_of(buffer)
    compiled._lookup(buffer, words, starts, ends, arrays or table.arrays, found)
    return [int(f) for f in found]


def test_the_key_table_finds_every_key_it_holds_and_no_other(compiled: Any) -> None:
    keys = _keys(3000, seed=1)
    held, others = keys[::2], keys[1::2]
    table = compiled.KeyTable()
    for entry, key in enumerate(held):
        table.add(key, entry)
    assert _found(compiled, table, held) == list(range(len(held)))
    assert _found(compiled, table, others) == [-1] * len(others)
    prefixes = [k[:-1] for k in held if len(k) > 1 and k[:-1] not in held]
    assert _found(compiled, table, prefixes) == [-1] * len(prefixes)


def test_a_readers_arrays_keep_answering_while_the_table_grows(compiled: Any) -> None:
    keys = _keys(2000, seed=2)
    table = compiled.KeyTable()
    for entry, key in enumerate(keys[:10]):
        table.add(key, entry)
    before = table.arrays  # what a request took before the others were learned
    for entry, key in enumerate(keys[10:], start=10):
        table.add(key, entry)
    assert table.arrays[0] is not before[0]  # the slots grew: a new array
    assert _found(compiled, table, keys[:10], before) == list(range(10))
    assert _found(compiled, table, keys) == list(range(len(keys)))


def _request(series: list[tuple[list[tuple[str, str]], list[tuple[float, int]]]]) -> bytes:
    """A WriteRequest's protobuf bytes (not compressed)."""
    return bytes(_raw(_body(series)))


SAMPLES = [
    (0.0, 0),  # both left out: an empty Sample
    (1.5, 0),  # value only
    (0.0, 1_767_225_600_000),  # timestamp only
    (math.nan, -1),  # a negative timestamp: a 10-byte varint
    (-math.inf, -(1 << 63)),
    (math.inf, (1 << 63) - 1),
    (2.0**-1074, 127),
    (-0.0, 128),
]


@pytest.fixture(params=["bounded arrays", "counted first"])
def sizing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, compiled: Any) -> str:
    """Small bodies decode into arrays of their bound; big ones are counted first."""
    if request.param == "counted first":
        monkeypatch.setattr(compiled, "COUNT_FIRST_BYTES", 0)
    return str(request.param)


def test_samples_decode_as_protobuf_parses_them(compiled: Any, sizing: str) -> None:
    body = _request([([("__name__", "m"), ("i", str(i))], [s]) for i, s in enumerate(SAMPLES)])
    decoded = compiled.decode(memoryview(body), compiled.KeyTable(), 64)
    assert decoded is not None
    starts, ends, counts, values, timestamps, found = decoded
    parsed = messages.WriteRequest.FromString(body)
    assert counts.tolist() == [1] * len(SAMPLES) and found.tolist() == [-1] * len(SAMPLES)
    expected = [(s.samples[0].value, s.samples[0].timestamp) for s in parsed.timeseries]
    assert np.array_equal(
        values.view(np.uint64), np.array([v for v, _ in expected]).view(np.uint64)
    )
    assert timestamps.tolist() == [t for _, t in expected]
    for i, one in enumerate(parsed.timeseries):
        labels = b"".join(_field(label.SerializeToString(), 0x0A) for label in one.labels)
        assert body[starts[i] : ends[i]] == labels


def _with_exemplar() -> bytes:
    request = messages.WriteRequest()
    one = request.timeseries.add()
    one.labels.add(name="__name__", value="m")
    one.samples.add(value=1.0, timestamp=5)
    one.exemplars.add(value=1.0, timestamp=5)
    return request.SerializeToString()


def _with_metadata() -> bytes:
    request = messages.WriteRequest.FromString(_request([([("__name__", "m")], [(1.0, 5)])]))
    request.metadata.add(type=1, metric_family_name="m")
    return request.SerializeToString()


def _field(payload: bytes, tag: int) -> bytes:
    """A length-delimited protobuf field (payloads under 128 bytes)."""
    return bytes([tag, len(payload)]) + payload


LEFT_TO_THE_NUMPY_PATH = {
    "an exemplar": _with_exemplar(),
    "metadata": _with_metadata(),
    "a series without samples": _request([([("__name__", "m")], [])]),
    "a series without labels": _request([([], [(1.0, 5)])]),
    "more samples in a series than the numpy path takes": _request(
        [([("__name__", "m")], [(1.0, t) for t in range(65)])]
    ),
    "a label after the samples": _field(
        _field(b"\x0a\x01a\x12\x01b", 0x0A)
        + _field(b"\x10\x05", 0x12)
        + _field(b"\x0a\x01c", 0x0A),
        0x0A,
    ),
    "a field of WriteRequest it does not know": _field(b"\x00", 0x12),
    "an empty body": b"",
}


@pytest.mark.parametrize("name", sorted(LEFT_TO_THE_NUMPY_PATH))
def test_bodies_it_does_not_take_in_full_are_left_to_the_numpy_path(
    compiled: Any, name: str, sizing: str
) -> None:
    body = LEFT_TO_THE_NUMPY_PATH[name]
    assert compiled.decode(memoryview(body), compiled.KeyTable(), 64) is None


def _outcome(body: bytes) -> Any:
    """decode_v1_known's answer on a fresh cache: None, its error, or the decoded arrays."""
    from metricvault.ingest.protocols.decode_limits import DecodeBudget
    from metricvault.ingest.protocols.remote_write_columns import Limits

    limits = Limits(None, None, DecodeBudget(None))
    cache = remote_write_known.SeriesKeyCache()
    try:
        decoded = remote_write_known.decode_v1_known(memoryview(body), limits, cache)
    except Exception as exc:  # the same error either way
        return type(exc).__name__, str(exc)
    resolved = None if decoded is None else decoded.prepared()
    if resolved is None:
        return None
    return (
        resolved.series_ids.tolist(),
        resolved.timestamps.tolist(),
        resolved.values.view(np.uint64).tolist(),
        list(resolved.series),
    )


def test_every_truncation_and_byte_flip_decodes_as_the_numpy_path_decodes_it(
    compiled: Any, monkeypatch: pytest.MonkeyPatch, sizing: str
) -> None:
    body = _request(
        [
            ([("__name__", "m"), ("gpu", str(i))], [(float(i), 1_767_225_600_000 + i)] * 2)
            for i in range(3)
        ]
    )
    rng = random.Random(3)
    bodies = [body[:n] for n in range(len(body))]
    for _ in range(300):
        flipped = bytearray(body)
        flipped[rng.randrange(len(body))] = rng.getrandbits(8)
        bodies.append(bytes(flipped))
    taken = 0
    for one in bodies:
        taken += compiled.decode(memoryview(one), compiled.KeyTable(), 64) is not None
        fast = _outcome(one)
        with monkeypatch.context() as numpy_only:
            numpy_only.setattr(remote_write_known, "USE_COMPILED", False)
            assert _outcome(one) == fast
    assert taken > 100  # most flips land in a value or a label: still a well-formed request


def test_series_learned_before_the_compiler_was_ready_are_found_by_it(
    compiled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metricvault.ingest.protocols.decode_limits import DecodeBudget
    from metricvault.ingest.protocols.remote_write_columns import Limits

    cache = remote_write_known.SeriesKeyCache()
    body = memoryview(
        _request([([("__name__", "m"), ("i", str(i))], [(1.0, 5)]) for i in range(9)])
    )
    limits = Limits(None, None, DecodeBudget(None))
    monkeypatch.setattr(remote_write_known, "USE_COMPILED", False)
    learned = remote_write_known.decode_v1_known(body, limits, cache)  # the numpy path learns
    assert learned is not None and cache.generation.table is None
    monkeypatch.setattr(remote_write_known, "USE_COMPILED", True)

    def no_numpy(*args: Any) -> None:
        raise AssertionError("the compiled path did not take a request of known series")

    monkeypatch.setattr(remote_write_known, "_decode_numpy", no_numpy)
    again = remote_write_known.decode_v1_known(body, limits, cache)
    table: Any = cache.generation.table  # made from the 9 entries the numpy path learned
    assert again is not None and table.entries == 9
    first, second = learned.prepared(), again.prepared()
    assert first is not None and second is not None
    assert np.array_equal(first.series_ids, second.series_ids)
    assert isinstance(first.series, SeriesRows) and isinstance(second.series, SeriesRows)
    assert first.series.keys.tolist() == second.series.keys.tolist()
