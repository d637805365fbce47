"""Remote-write 1.0's known-series path compiled with numba: one pass over the request, no GIL.

:mod:`remote_write_known` parses a request in protobuf's C code into one ``bytes`` per series,
joins them, walks the labels and samples with numpy and looks each series' label bytes up in a
dict: about a third of the gateway's CPU (the GIL profile in docs/benchmarks.md, "Round 8"),
all of it holding the GIL. Here one compiled function walks the protobuf itself, decodes the
samples and finds each series' label bytes in an open-addressing table (64-bit hash, then the
bytes compared, so a collision only costs a probe), with the GIL released: the request threads
of a gateway decode in parallel.

It is an accelerator, never a second meaning: any request it does not take in full (a field
other than labels and samples, a sample not in one of the four usual shapes, a series without
samples or with more than ``MAX_SAMPLES_PER_SERIES``, metadata, a series not yet known) goes on
to :mod:`remote_write_known`'s numpy path, which decides as before (its tests run both ways).
numba compiles the functions once per machine (``cache=True``, beside this file or in numba's
user cache); a process compiles or loads them on a background thread the first time a request
asks, and until they are ready requests take the numpy path, so no request waits for the
compiler.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

OK = 0
FALL_BACK = 1  # the numpy path decides
COUNT_FIRST_BYTES = 4 << 20  # bodies over this are counted before their arrays are made
_EMPTY = np.int64(-1)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_SEED = np.uint64(0xCBF29CE484222325)
_SHIFT = np.uint64(29)


@numba.njit(nogil=True, cache=True)
def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``, or (-1, pos) past ``end`` or over
    63 bits (a length: anything that large is not a usual request)."""
    value = 0
    shift = 0
    while pos < end and shift < 63:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, pos


@numba.njit(nogil=True, cache=True)
def _walk(buf: Any, max_per_series: int, out: Any, fill: bool) -> tuple[int, int, int]:
    """Count (``fill`` False) or record into ``out`` every series and sample of a
    WriteRequest made only of timeseries of labels then samples: (status, series, samples).
    The count checks everything but the samples' shapes."""
    label_starts, label_ends, counts, value_bits, stamps = out
    end_all = len(buf)
    pos = 0
    series = 0
    samples = 0
    while pos < end_all:
        if buf[pos] != 0x0A:  # WriteRequest.timeseries; metadata and the rest: numpy path
            return FALL_BACK, 0, 0
        length, pos = _varint(buf, pos + 1, end_all)
        end = pos + length
        if length < 0 or end > end_all:
            return FALL_BACK, 0, 0
        at = pos
        while at < end and buf[at] == 0x0A:  # TimeSeries.labels
            size, at = _varint(buf, at + 1, end)
            if size < 0:
                return FALL_BACK, 0, 0
            at += size
        if at > end or at == pos:
            return FALL_BACK, 0, 0
        if fill:
            label_starts[series] = pos
            label_ends[series] = at
        count = 0
        while at < end:
            if buf[at] != 0x12 or count == max_per_series:  # TimeSeries.samples
                return FALL_BACK, 0, 0
            size, at = _varint(buf, at + 1, end)
            if size < 0 or at + size > end:
                return FALL_BACK, 0, 0
            if fill and not _sample(buf, at, at + size, samples + count, value_bits, stamps):
                return FALL_BACK, 0, 0
            at += size
            count += 1
        if count == 0:
            return FALL_BACK, 0, 0
        if fill:
            counts[series] = count
        series += 1
        samples += count
        pos = end
    return OK, series, samples


@numba.njit(nogil=True, cache=True)
def _sample(buf: Any, start: int, end: int, k: int, value_bits: Any, stamps: Any) -> bool:
    """A Sample in one of its four usual shapes (nothing, value, timestamp, value then
    timestamp; zero when left out), as the numpy path reads them; False for anything else."""
    value = np.uint64(0)
    at = start
    if end - start >= 9 and buf[start] == 0x09:
        for i in range(8):
            value |= np.uint64(buf[start + 1 + i]) << np.uint64(8 * i)
        at = start + 9
    stamp = np.uint64(0)
    if at < end:
        if buf[at] != 0x10 or end - at - 1 > 10:
            return False
        at += 1
        shift = 0
        while at < end:
            byte = buf[at]
            at += 1
            last = at == end
            if (byte >= 0x80) == last:
                return False  # not a varint of exactly the remaining bytes
            if shift == 63 and byte > 1:
                return False  # over 64 bits
            stamp |= np.uint64(byte & 0x7F) << np.uint64(shift)
            shift += 7
    value_bits[k] = value
    stamps[k] = stamp
    return True


@numba.njit(nogil=True, cache=True)
def _hash(buf: Any, words: Any, start: int, end: int) -> Any:
    """A 64-bit hash of ``buf[start:end]``; ``words[i]`` is the 8 bytes at ``buf[i]``."""
    h = _SEED ^ np.uint64(end - start)
    at = start
    while at + 8 <= end:
        h = (h ^ words[at]) * _MULTIPLIER
        h ^= h >> _SHIFT
        at += 8
    tail = np.uint64(0)
    shift = np.uint64(0)
    while at < end:
        tail |= np.uint64(buf[at]) << shift
        shift += np.uint64(8)
        at += 1
    h = (h ^ tail) * _MULTIPLIER
    return h ^ (h >> _SHIFT)


@numba.njit(nogil=True, cache=True)
def _same(buf: Any, words: Any, start: int, keys: Any, key_words: Any, key: int, size: int) -> bool:
    at = 0
    while at + 8 <= size:
        if words[start + at] != key_words[key + at]:
            return False
        at += 8
    while at < size:
        if buf[start + at] != keys[key + at]:
            return False
        at += 1
    return True


@numba.njit(nogil=True, cache=True)
def _lookup(buf: Any, words: Any, starts: Any, ends: Any, table: Any, found: Any) -> None:
    """Each series' entry index in ``table``'s arrays, -1 where not known."""
    slot_hash, slot_entry, keys, key_words, key_starts, key_ends = table
    mask = len(slot_hash) - 1
    entries = len(key_starts)
    for i in range(len(starts)):
        start = starts[i]
        size = ends[i] - start
        h = _hash(buf, words, start, ends[i])
        found[i] = -1
        slot = h & np.uint64(mask)
        while True:
            entry = slot_entry[slot]
            if entry < 0:
                break
            if slot_hash[slot] == h and entry < entries:
                key_start = key_starts[entry]
                key_end = key_ends[entry]
                if (
                    key_end - key_start == size
                    and key_end <= len(keys)
                    and _same(buf, words, start, keys, key_words, key_start, size)
                ):
                    found[i] = entry
                    break
            slot = (slot + np.uint64(1)) & np.uint64(mask)


@numba.njit(nogil=True, cache=True)
def _insert(
    slot_hash: Any, slot_entry: Any, keys: Any, words: Any, starts: Any, ends: Any, first: int
) -> None:
    """Put entries ``first`` .. ``len(starts)`` - 1 (the keys ``keys[starts[e]:ends[e]]``)."""
    mask = np.uint64(len(slot_hash) - 1)
    for entry in range(first, len(starts)):
        h = _hash(keys, words, starts[entry], ends[entry])
        slot = h & mask
        while slot_entry[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        slot_hash[slot] = h  # the hash before the entry: a reader sees an entry with its hash
        slot_entry[slot] = entry


def words_of(buffer: Any) -> Any:
    """``buffer`` (uint8) as overlapping little-endian uint64s, one at each byte (a view)."""
    return np.ndarray((max(len(buffer) - 7, 0),), dtype="<u8", buffer=buffer, strides=(1,))


class KeyTable:
    """Label bytes -> entry index of one cache generation, for :func:`_lookup`: an
    open-addressing table at most half full, and the keys' bytes. Written by one learner at a
    time (the cache's lock); readers take :attr:`arrays` once per request, and an array that
    has to grow is copied and the tuple replaced, so a reader's arrays never move under it."""

    def __init__(self) -> None:
        self.used = 0
        self.entries = 0
        keys = np.zeros(1024, dtype=np.uint8)
        self.arrays = (
            np.zeros(16, dtype=np.uint64),
            np.full(16, _EMPTY, dtype=np.int64),
            keys,
            words_of(keys),
            np.zeros(16, dtype=np.int64),
            np.zeros(16, dtype=np.int64),
        )

    def add(self, key: bytes, entry: int) -> None:
        """Record ``key`` as entry ``entry`` (entries are added in order: 0, 1, 2, ...)."""
        assert entry == self.entries
        slot_hash, slot_entry, keys, words, key_starts, key_ends = self.arrays
        end = self.used + len(key)
        if end > len(keys) or entry == len(key_starts):
            keys = _grown(keys, end)
            words = words_of(keys)
            key_starts = _grown(key_starts, entry + 1)
            key_ends = _grown(key_ends, entry + 1)
        if 2 * (entry + 1) > len(slot_hash):  # a new table of the entries so far
            slots = 1 << (4 * (entry + 1) - 1).bit_length()
            slot_hash = np.zeros(slots, dtype=np.uint64)
            slot_entry = np.full(slots, _EMPTY, dtype=np.int64)
            _insert(slot_hash, slot_entry, keys, words, key_starts[:entry], key_ends[:entry], 0)
        keys[self.used : end] = np.frombuffer(key, dtype=np.uint8)
        key_starts[entry] = self.used
        key_ends[entry] = end
        self.arrays = (slot_hash, slot_entry, keys, words, key_starts, key_ends)
        first = key_starts[: entry + 1], key_ends[: entry + 1]
        _insert(slot_hash, slot_entry, keys, words, *first, entry)
        self.used = end
        self.entries += 1


def _grown(array: Any, at_least: int) -> Any:
    if at_least <= len(array):
        return array
    bigger = np.zeros(max(2 * len(array), at_least), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


def decode(
    raw: memoryview, table: KeyTable, max_per_series: int
) -> tuple[Any, Any, Any, Any, Any, Any] | None:
    """(label starts, label ends, sample counts, values, timestamps, entry indexes, -1 where
    not known) of every series of the request ``raw`` (positions in ``raw``), or None when the
    numpy path is to decide."""
    buffer = np.frombuffer(raw, dtype=np.uint8)
    most_series = len(buffer) // 6 + 1  # a series takes >= 6 bytes: tag, length, a label, a sample
    most_samples = len(buffer) // 2 + 1  # a sample >= 2: tag, length (np.empty: pages untouched)
    if len(buffer) > COUNT_FIRST_BYTES:  # a big body: arrays of the sizes it needs, not bounds
        empty = np.zeros(0, dtype=np.int64)
        nothing = (empty, empty, empty, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        status, most_series, most_samples = _walk(buffer, max_per_series, nothing, False)
        if status != OK:
            return None
    out = (
        np.empty(most_series, dtype=np.int64),
        np.empty(most_series, dtype=np.int64),
        np.empty(most_series, dtype=np.int64),
        np.empty(most_samples, dtype=np.uint64),
        np.empty(most_samples, dtype=np.uint64),
    )
    found = np.empty(most_series, dtype=np.int64)
    status, series, samples = _decode(
        buffer, words_of(buffer), max_per_series, out, table.arrays, found
    )
    if status != OK or not series:
        return None
    starts, ends, counts = (a[:series] for a in out[:3])
    value_bits, stamps = (a[:samples] for a in out[3:])
    return starts, ends, counts, value_bits.view(np.float64), stamps.view(np.int64), found[:series]


@numba.njit(nogil=True, cache=True)
def _decode(
    buf: Any, words: Any, max_per_series: int, out: Any, table: Any, found: Any
) -> tuple[int, int, int]:
    status, series, samples = _walk(buf, max_per_series, out, True)
    if status == OK:
        _lookup(buf, words, out[0][:series], out[1][:series], table, found)
    return status, series, samples


def warm() -> None:
    """Compile (or load from numba's cache) every function, on a request of one series."""
    label = b"\x0a\x08__name__\x12\x02m1"
    labels = b"\x0a" + bytes([len(label)]) + label
    sample = b"\x09" + np.float64(1.5).tobytes() + b"\x10\x01"
    series = labels + b"\x12" + bytes([len(sample)]) + sample
    table = KeyTable()
    table.add(labels, 0)
    decoded = decode(memoryview(b"\x0a" + bytes([len(series)]) + series), table, 64)
    assert decoded is not None and decoded[5].tolist() == [0], decoded
    assert decoded[3].tolist() == [1.5] and decoded[4].tolist() == [1], decoded
