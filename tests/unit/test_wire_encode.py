"""The hand-written remote-write encoder writes the bytes protobuf's own serialiser writes."""

from __future__ import annotations

import math
import random

import cramjam
import pytest

from metricvault.wire.proto import messages
from metricvault.wire.remote_write import SampleTuple, encode_write_request

VALUES = (0.0, -0.0, 1.0, -1.5, 1e300, 5e-324, math.inf, -math.inf, math.nan, 2.0**53 + 1)
TIMESTAMPS = (0, 1, 127, 128, 300, 16_383, 16_384, 1_700_000_000_123, -1, -5, 2**63 - 1, -(2**63))


def protobuf_body(samples: list[SampleTuple]) -> bytes:
    """The same request through protobuf's message classes (what the encoder used to do)."""
    groups: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for metric, labels, timestamp, value in samples:
        pairs = [("__name__", metric), *((k, v) for k, v in labels.items() if v)]
        groups.setdefault(tuple(sorted(pairs)), []).append((timestamp, value))
    request = messages.WriteRequest()
    for key, points in groups.items():
        series = request.timeseries.add()
        for name, text in key:
            series.labels.add(name=name, value=text)
        for timestamp, value in sorted(points, key=lambda point: point[0]):
            series.samples.add(value=value, timestamp=timestamp)
    return bytes(request.SerializeToString())


def random_samples(rng: random.Random, count: int) -> list[SampleTuple]:
    names = ["DCGM_FI_DEV_GPU_UTIL", "node_cpu_seconds_total", "up", "x" * 200]
    values = ["0", "", "node-01", "ä€😀", "v" * 300, "GPU-1234"]
    out: list[SampleTuple] = []
    for _ in range(count):
        labels = {
            rng.choice(["gpu", "Hostname", "mode", "UUID", "l" * 130]): rng.choice(values)
            for _ in range(rng.randrange(4))
        }
        out.append(
            (
                rng.choice(names),
                labels,
                rng.choice([*TIMESTAMPS, rng.randrange(-(2**63), 2**63)]),
                rng.choice([*VALUES, rng.uniform(-1e9, 1e9)]),
            )
        )
    return out


@pytest.mark.parametrize("seed", range(20))
def test_the_encoder_writes_protobufs_bytes(seed: int) -> None:
    samples = random_samples(random.Random(seed), 1 + seed * 10)
    raw = bytes(cramjam.snappy.decompress_raw(encode_write_request(samples)))
    assert raw == protobuf_body(samples)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("timestamp", TIMESTAMPS)
def test_each_value_and_timestamp_edge(value: float, timestamp: int) -> None:
    samples: list[SampleTuple] = [("m", {"a": "b"}, timestamp, value)]
    raw = bytes(cramjam.snappy.decompress_raw(encode_write_request(samples)))
    assert raw == protobuf_body(samples)
    [series] = messages.WriteRequest.FromString(raw).timeseries
    assert series.samples[0].timestamp == timestamp
    decoded = series.samples[0].value
    assert (math.isnan(decoded) and math.isnan(value)) or (
        decoded == value and math.copysign(1, decoded) == math.copysign(1, value)
    )


def test_a_timestamp_outside_int64_is_refused_as_protobuf_refuses_it() -> None:
    with pytest.raises(ValueError, match="int64"):
        encode_write_request([("m", {}, 2**63, 1.0)])
    with pytest.raises(ValueError):
        protobuf_body([("m", {}, 2**63, 1.0)])


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_write_request([("m", {"a": "\udc80"}, 1, 1.0)])
