"""The remote-write sample decoder that reads each sample as 8-byte words: the same values
and timestamps as protobuf's parser, bit for bit, and None for anything it does not decode."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from metricvault.ingest.protocols.remote_write_columns import (
    _decode_canonical_samples,
    decode_samples,
    decode_samples_slowly,
)
from metricvault.wire.proto import messages

STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
VALUES = [0.0, -0.0, 1.5, float("nan"), float("inf"), STALE, 1e300]
TIMESTAMPS = [0, 1, -1, 127, 128, 1_700_000_000_000, (1 << 56) - 1, 1 << 56, (1 << 63) - 1]


def _sample(rng: random.Random) -> bytes:
    value = rng.choice([*VALUES, rng.random()])
    timestamp = rng.choice([*TIMESTAMPS, rng.randrange(1 << rng.randrange(1, 63))])
    return bytes(messages.Sample(value=value, timestamp=timestamp).SerializeToString())


def _bits(values: np.ndarray) -> list[int]:
    return [int(v) for v in values.view(np.uint64)]


@pytest.mark.parametrize("seed", range(4))
def test_words_decode_as_protobuf_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        raws = [_sample(rng) for _ in range(rng.randrange(1, 40))]
        values, timestamps = decode_samples(raws)
        slow_values, slow_timestamps = decode_samples_slowly(raws)
        assert _bits(values) == _bits(slow_values)
        assert timestamps.tolist() == slow_timestamps.tolist()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x10",  # a timestamp tag without its varint
        b"\x10\x80",  # a varint that never ends
        b"\x10\x80\x00",  # timestamp 0 in two bytes (valid, if unusual)
        b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02",  # over 64 bits
        b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # 11 bytes
        b"\x10\x05\x09" + bytes(8),  # fields out of order
        b"\x09" + bytes(7),  # a short double
        b"\x18\x01",  # an unknown field
    ],
)
def test_words_refuse_or_agree_on_odd_encodings(raw: bytes) -> None:
    """Every sample is either decoded exactly as protobuf decodes it, or left to it (None)."""
    for neighbours in ([], [_sample(random.Random(1))]):
        raws = [*neighbours, raw, *neighbours]
        lengths = np.array([len(r) for r in raws], dtype=np.int64)
        buffer = np.frombuffer(b"".join(raws) + bytes(16), dtype=np.uint8)
        decoded = _decode_canonical_samples(buffer, np.cumsum(lengths) - lengths, lengths)
        try:
            expected = decode_samples_slowly(raws)
        except Exception:  # protobuf refuses it: so must the fast decoder
            assert decoded is None
            continue
        if decoded is not None:
            assert _bits(decoded[0]) == _bits(expected[0])
            assert decoded[1].tolist() == expected[1].tolist()


def test_two_byte_varint_with_a_zero_last_byte() -> None:
    """``10 80 00`` is timestamp 0 in two bytes (protobuf reads it): decoded, or left to it."""
    raws = [b"\x10\x80\x00"]
    values, timestamps = decode_samples(raws)
    assert timestamps.tolist() == [0] and _bits(values) == [0]
