"""Prometheus remote-write decoder: golden Prometheus bodies, 2.0 round trips, bad input, fuzz."""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cramjam
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricvault.errors import (
    InputError,
    LabelError,
    MetricVaultError,
    TooLargeError,
    UnsupportedError,
)
from metricvault.ingest.protocols import remote_write_checks, remote_write_columns
from metricvault.ingest.protocols.remote_write import (
    DecodedWrite,
    LabelPairCache,
    MetricMetadata,
    decode_remote_write,
)
from metricvault.wire.proto import messages

# Real Prometheus 2.42 bodies kept in the repository (see its README), so no clone skips them.
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "prometheus_remote_write"
PROTO_DIR = Path(messages.__file__).resolve().parent  # the .proto files beside the classes
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
CT_V1 = "application/x-protobuf"
CT_V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


def decode_v1(body: bytes, **limits: Any) -> DecodedWrite:
    return decode_remote_write(
        body, content_type=CT_V1, content_encoding="snappy", version_header="0.1.0", **limits
    )


def decode_v2(body: bytes, **limits: Any) -> DecodedWrite:
    return decode_remote_write(
        body, content_type=CT_V2, content_encoding="snappy", version_header="2.0.0", **limits
    )


def v1_request(*series: tuple[list[tuple[str, str]], list[tuple[float, int]]]) -> Any:
    request = messages.WriteRequest()
    for labels, samples in series:
        timeseries = request.timeseries.add()
        for name, text in labels:
            timeseries.labels.add(name=name, value=text)
        for value, timestamp in samples:
            timeseries.samples.add(value=value, timestamp=timestamp)
    return request


def v1_body(*series: tuple[list[tuple[str, str]], list[tuple[float, int]]]) -> bytes:
    return snappy(v1_request(*series).SerializeToString())


class V2Builder:
    """Builds an ``io.prometheus.write.v2.Request`` with a de-duplicated symbol table."""

    def __init__(self) -> None:
        self.request = messages.Request()
        self.symbols: dict[str, int] = {}
        self.ref("")

    def ref(self, text: str) -> int:
        if text not in self.symbols:
            self.symbols[text] = len(self.symbols)
            self.request.symbols.append(text)
        return self.symbols[text]

    def series(
        self,
        labels: dict[str, str],
        samples: Sequence[tuple[float, int]] = (),
        *,
        kind: int = 0,
        help_text: str = "",
        unit: str = "",
    ) -> Any:
        timeseries = self.request.timeseries.add()
        for name in sorted(labels):
            timeseries.labels_refs.extend([self.ref(name), self.ref(labels[name])])
        for value, timestamp in samples:
            timeseries.samples.add(value=value, timestamp=timestamp)
        timeseries.metadata.type = kind
        timeseries.metadata.help_ref = self.ref(help_text)
        timeseries.metadata.unit_ref = self.ref(unit)
        return timeseries

    def body(self) -> bytes:
        return snappy(self.request.SerializeToString())


# --- golden bodies from Prometheus 2.42 ------------------------------------------------------


def golden_files() -> list[str]:
    return sorted(json.loads((GOLDEN / "manifest.json").read_text())["files"])


def manifest() -> dict[str, Any]:
    return dict(json.loads((GOLDEN / "manifest.json").read_text()))


def test_golden_bodies_live_in_the_repository_byte_for_byte() -> None:
    # The copy must be the captured bodies exactly: every file of the manifest, no other body.
    files = manifest()["files"]
    assert len(files) == 14
    assert sorted(p.name for p in GOLDEN.glob("*.bin")) == sorted(files)
    for name, expected in files.items():
        assert hashlib.sha256((GOLDEN / name).read_bytes()).hexdigest() == expected["sha256"], name


@pytest.mark.parametrize("name", golden_files())
def test_golden_counts_equal_the_manifest(name: str) -> None:
    expected = manifest()["files"][name]
    headers = manifest()["headers"]
    body = (GOLDEN / name).read_bytes()
    assert len(body) == expected["body_bytes"]

    decoded = decode_remote_write(
        body,
        content_type=headers["Content-Type"],
        content_encoding=headers["Content-Encoding"],
        version_header=headers["X-Prometheus-Remote-Write-Version"],
    )

    assert decoded.version == "1.0"
    assert decoded.series == expected["timeseries"]
    assert decoded.samples == expected["samples"]
    assert decoded.stale_markers == expected["staleness_markers"]
    assert len(decoded.metadata) == expected["metadata_entries"]
    assert decoded.histograms == 0 and decoded.exemplars == 0
    table = decoded.table
    assert table.num_rows == decoded.samples
    # every sample received is stored, staleness markers and NaNs too (issue 13)
    stored_names = set(table["metric"].to_pylist())
    oracle = oracle_v1(body)
    assert len(oracle["names"]) == expected["metric_names"]
    assert stored_names <= oracle["names"]
    if decoded.samples:
        assert pc.min(table["timestamp"]).as_py() >= expected["min_timestamp_ms"]
        assert pc.max(table["timestamp"]).as_py() <= expected["max_timestamp_ms"]
    if decoded.samples == expected["samples"]:
        assert len(stored_names) == expected["metric_names"]
        if decoded.samples:
            assert pc.min(table["timestamp"]).as_py() == expected["min_timestamp_ms"]
            assert pc.max(table["timestamp"]).as_py() == expected["max_timestamp_ms"]
    assert (oracle["min_ts"], oracle["max_ts"]) == (
        expected["min_timestamp_ms"],
        expected["max_timestamp_ms"],
    )


def oracle_v1(body: bytes) -> dict[str, Any]:
    """Names and timestamps over all samples, read with the plain message classes."""
    request = messages.WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
    names = {
        label.value for ts in request.timeseries for label in ts.labels if label.name == "__name__"
    }
    stamps = [sample.timestamp for ts in request.timeseries for sample in ts.samples]
    return {
        "names": names,
        "min_ts": min(stamps) if stamps else None,
        "max_ts": max(stamps) if stamps else None,
    }


@pytest.mark.parametrize("name", [n for n in golden_files() if n != "write-05.bin"])
def test_golden_table_matches_the_series_sample_for_sample(name: str) -> None:
    body = (GOLDEN / name).read_bytes()
    table = decode_v1(body).table
    assert table.column_names[:3] == ["metric", "timestamp", "value"]
    assert table.schema.field("metric").type == pa.string()
    assert table.schema.field("timestamp").type == pa.int64()
    assert table.schema.field("value").type == pa.float64()
    labels = table.column_names[3:]
    assert labels == sorted(labels) and "__name__" not in labels
    assert all(table.schema.field(name).type == pa.string() for name in labels)
    assert table["metric"].null_count == 0

    request = messages.WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
    expected = []
    for ts in request.timeseries:
        series = {label.name: label.value for label in ts.labels}
        for sample in ts.samples:  # every sample, NaN and staleness markers bit-exact
            row = {name: series.get(name) or None for name in labels}
            bits = struct.pack("<d", sample.value)
            expected.append((series["__name__"], sample.timestamp, bits, row))
    got = [
        (
            row["metric"],
            row["timestamp"],
            struct.pack("<d", row["value"]),
            {name: row[name] for name in labels},
        )
        for row in table.to_pylist()
    ]
    assert got == expected


def test_golden_metadata_request_gives_types_and_kinds() -> None:
    decoded = decode_v1((GOLDEN / "write-05.bin").read_bytes())
    assert decoded.table.num_rows == 0
    assert decoded.table.column_names == ["metric", "timestamp", "value"]
    by_name = {entry.metric: entry for entry in decoded.metadata}
    assert by_name["node_nf_conntrack_stat_invalid"] == MetricMetadata(
        "node_nf_conntrack_stat_invalid",
        "gauge",
        "",
        "Number of packets seen which can not be tracked.",
    )
    types = {entry.type for entry in decoded.metadata}
    assert types <= {"counter", "gauge", "histogram", "summary", "unknown"}
    counters = [entry.metric for entry in decoded.metadata if entry.type == "counter"]
    assert counters and all(decoded.kinds[name] == "counter" for name in counters)
    for entry in decoded.metadata:
        if entry.type == "histogram":
            assert decoded.kinds[f"{entry.metric}_bucket"] == "counter"
            assert decoded.kinds[f"{entry.metric}_count"] == "counter"
        if entry.type == "summary":
            assert decoded.kinds[entry.metric] == "gauge"
            assert decoded.kinds[f"{entry.metric}_sum"] == "counter"
    assert set(decoded.kinds.values()) == {"counter", "gauge"}


def test_golden_stale_markers_are_stored() -> None:
    decoded = decode_v1((GOLDEN / "stale-02.bin").read_bytes())
    assert decoded.stale_markers == 357
    assert decoded.table.num_rows == decoded.samples == 500
    values = decoded.table["value"].to_pylist()
    stale = [v for v in values if struct.pack("<d", v) == struct.pack("<d", STALE_NAN)]
    assert len(stale) == 357


def _value_bits(table: pa.Table) -> pa.Table:
    """``table`` with its values as their bit patterns (NaN never equals NaN)."""
    raw = table["value"].combine_chunks().buffers()[1]
    bits = pa.Array.from_buffers(pa.uint64(), table.num_rows, [None, raw])
    return table.set_column(table.column_names.index("value"), "value", bits)


def test_label_cache_eviction_and_threads_change_no_result() -> None:
    bodies = [(GOLDEN / name).read_bytes() for name in golden_files()]
    expected = [decode_v1(body).table for body in bodies]
    cache = LabelPairCache(max_pairs=64)  # evict constantly, from cold
    results: dict[int, list[pa.Table]] = {}

    def work(worker: int) -> None:
        results[worker] = [decode_v1(body, label_cache=cache).table for body in bodies * 3]

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for tables in results.values():
        assert all(
            _value_bits(got).equals(_value_bits(want))
            for got, want in zip(tables, expected * 3, strict=True)
        )
    # the decoders used this cache (not the shared one) and it was emptied for being full
    # (a request larger than the bound still fits whole: it is never evicted midway)
    assert len(cache) > 0 and cache.evictions > 0


# --- 1.0 requests built here -----------------------------------------------------------------


def test_v1_long_shape_with_nulls_and_several_samples_per_series() -> None:
    body = v1_body(
        ([("__name__", "up"), ("instance", "a:1"), ("job", "node")], [(1.0, 1000), (0.0, 2000)]),
        ([("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("job", "dcgm")], [(87.5, 1000)]),
        ([("Hostname", "n1"), ("__name__", "temp"), ("zone", "")], [(-3.25, 0)]),
    )
    decoded = decode_v1(body)
    assert decoded.samples == 4 and decoded.series == 3
    assert decoded.table.to_pydict() == {
        "metric": ["up", "up", "DCGM_FI_DEV_GPU_UTIL", "temp"],
        "timestamp": [1000, 2000, 1000, 0],
        "value": [1.0, 0.0, 87.5, -3.25],
        "Hostname": [None, None, None, "n1"],
        "gpu": [None, None, "0", None],
        "instance": ["a:1", "a:1", None, None],
        "job": ["node", "node", "dcgm", None],
    }  # zone="" is no label at all, so no column


def test_v1_non_finite_values_are_counted_and_kept() -> None:
    values = [1.5, STALE_NAN, math.nan, math.inf, -math.inf, 2.5, STALE_NAN]
    body = v1_body(([("__name__", "x")], [(v, 1000 + i) for i, v in enumerate(values)]))
    decoded = decode_v1(body)
    assert (decoded.samples, decoded.stale_markers, decoded.non_finite) == (7, 2, 3)
    got = [struct.pack("<d", v) for v in decoded.table["value"].to_pylist()]
    assert got == [struct.pack("<d", v) for v in values]
    assert decoded.table["timestamp"].to_pylist() == [1000 + i for i in range(7)]


def test_v1_series_without_samples_leave_no_column() -> None:
    body = v1_body(
        ([("__name__", "a"), ("job", "x")], [(1.0, 1)]),
        ([("__name__", "b"), ("gone", "y")], []),
        ([("__name__", "c"), ("kept", "z")], [(STALE_NAN, 1)]),  # a marker is a sample
    )
    decoded = decode_v1(body)
    assert decoded.table.column_names == ["metric", "timestamp", "value", "job", "kept"]
    assert decoded.series == 3 and decoded.stale_markers == 1


@pytest.mark.parametrize(
    "timestamp", [0, 1, 127, 128, 1_796_010_883_251, 2**62, -1, -(2**63), 2**63 - 1]
)
@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 5e-324, -1.7976931348623157e308])
def test_v1_sample_encodings_round_trip(value: float, timestamp: int) -> None:
    decoded = decode_v1(v1_body(([("__name__", "m")], [(value, timestamp), (7.0, 3)])))
    assert decoded.table["value"].to_pylist() == [value, 7.0]
    assert decoded.table["timestamp"].to_pylist() == [timestamp, 3]


def test_v1_samples_in_unusual_field_order_take_the_slow_path_and_agree() -> None:
    # timestamp before value, and an unknown field 7: legal protobuf, not what Prometheus sends
    sample = b"\x10\xe8\x07" + b"\x09" + struct.pack("<d", 2.5) + b"\x38\x01"
    label = messages.Label(name="__name__", value="m").SerializeToString()
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    raw = b"\x0a" + bytes([len(series)]) + series
    decoded = decode_v1(snappy(raw))
    assert decoded.table.to_pydict() == {"metric": ["m"], "timestamp": [1000], "value": [2.5]}


def test_v1_histograms_and_exemplars_are_counted_not_stored() -> None:
    request = v1_request(([("__name__", "lat_bucket"), ("le", "1")], [(3.0, 10)]))
    series = request.timeseries[0]
    series.exemplars.add(value=0.4, timestamp=10).labels.add(name="trace_id", value="abc")
    series.exemplars.add(value=0.9, timestamp=11)
    native = request.timeseries.add()
    native.labels.add(name="__name__", value="lat")
    for stamp in (10, 20, 30):
        histogram = native.histograms.add(count_int=4, sum=2.5, schema=3, timestamp=stamp)
        histogram.positive_spans.add(offset=0, length=2)
        histogram.positive_deltas.extend([1, 2])
    decoded = decode_v1(snappy(request.SerializeToString()))
    assert (decoded.histograms, decoded.exemplars, decoded.samples) == (3, 2, 1)
    assert decoded.table["metric"].to_pylist() == ["lat_bucket"]


def test_v1_kinds_from_metadata() -> None:
    request = v1_request()
    for kind, family in [
        (1, "http_requests_total"),
        (1, "om_requests"),
        (2, "gpu_temp"),
        (3, "latency"),
        (4, "queue"),
        (5, "rpc"),
        (6, "build"),
        (7, "state"),
        (0, "mystery"),
        (2, "latency_bucket"),  # a later, conflicting description: the first one wins
    ]:
        request.metadata.add(type=kind, metric_family_name=family, help="h", unit="u")
    decoded = decode_v1(snappy(request.SerializeToString()))
    assert decoded.kinds == {
        "http_requests_total": "counter",
        "om_requests": "counter",
        "om_requests_total": "counter",
        "gpu_temp": "gauge",
        "latency_bucket": "counter",
        "latency_count": "counter",
        "latency_sum": "counter",
        "queue_bucket": "gauge",
        "queue_gcount": "gauge",
        "queue_gsum": "gauge",
        "rpc": "gauge",
        "rpc_count": "counter",
        "rpc_sum": "counter",
        "build": "gauge",
        "build_info": "gauge",
        "state": "gauge",
        # "mystery" (unknown) says nothing: the name decides, and it never downgrades a kind
    }
    assert [entry.type for entry in decoded.metadata] == [
        "counter",
        "counter",
        "gauge",
        "histogram",
        "gaugehistogram",
        "summary",
        "info",
        "stateset",
        "unknown",
        "gauge",
    ]
    assert decoded.metadata[0] == MetricMetadata("http_requests_total", "counter", "u", "h")


@pytest.mark.parametrize(
    ("content_type", "version_header"),
    [
        (None, None),
        ("", "0.1.0"),
        ("application/x-protobuf", None),
        ("Application/X-Protobuf; proto=prometheus.WriteRequest", "0.1.0"),
        ('application/x-protobuf;proto="prometheus.WriteRequest"', None),
    ],
)
def test_version_1_negotiation(content_type: str | None, version_header: str | None) -> None:
    body = v1_body(([("__name__", "up")], [(1.0, 1)]))
    for encoding in ("snappy", "SNAPPY", None):
        decoded = decode_remote_write(
            body,
            content_type=content_type,
            content_encoding=encoding,
            version_header=version_header,
        )
        assert decoded.version == "1.0" and decoded.samples == 1


def test_empty_requests_decode_to_empty_tables() -> None:
    for decode in (decode_v1, decode_v2):
        decoded = decode(b"\x00")  # snappy block of zero bytes: an empty message
        assert decoded.table.num_rows == 0 and decoded.series == 0
        assert decoded.table.column_names == ["metric", "timestamp", "value"]


# --- 2.0 -------------------------------------------------------------------------------------


def test_v2_round_trip_with_symbols_metadata_histograms_exemplars() -> None:
    builder = V2Builder()
    requests = builder.series(
        {"__name__": "http_requests_total", "job": "api", "code": "200"},
        [(10.0, 1000), (12.0, 2000)],
        kind=1,
        help_text="Requests served.",
    )
    requests.created_timestamp = 500
    requests.exemplars.add(value=1.0, timestamp=1000).labels_refs.extend(
        [builder.ref("trace_id"), builder.ref("abc123")]
    )
    builder.series(
        {"__name__": "http_requests_total", "job": "api", "code": "500"},
        [(1.0, 1000)],
        kind=1,
        help_text="Requests served.",
    )
    builder.series(
        {"__name__": "gpu_temp_celsius", "gpu": "0", "job": ""},
        [(61.5, 1000), (STALE_NAN, 2000)],
        kind=2,
        unit="celsius",
    )
    native = builder.series({"__name__": "latency_seconds", "job": "api"}, kind=3)
    native.histograms.add(count_float=3.0, sum=1.5, timestamp=1000)
    builder.series({"__name__": "rpc_seconds_count"}, [(4.0, 1000)], kind=5)
    builder.series({"__name__": "untyped"}, [(math.inf, 1000)])

    decoded = decode_v2(builder.body())

    assert decoded.version == "2.0"
    assert (decoded.series, decoded.samples, decoded.histograms, decoded.exemplars) == (
        6,
        7,
        1,
        1,
    )
    assert (decoded.stale_markers, decoded.non_finite) == (1, 1)
    got = decoded.table.to_pydict()
    values = [struct.pack("<d", v) for v in got.pop("value")]
    assert values == [
        struct.pack("<d", v) for v in (10.0, 12.0, 1.0, 61.5, STALE_NAN, 4.0, math.inf)
    ]
    assert got == {
        "metric": [
            "http_requests_total",
            "http_requests_total",
            "http_requests_total",
            "gpu_temp_celsius",
            "gpu_temp_celsius",
            "rpc_seconds_count",
            "untyped",
        ],
        "timestamp": [1000, 2000, 1000, 1000, 2000, 1000, 1000],
        "code": ["200", "200", "500", None, None, None, None],
        "gpu": [None, None, None, "0", "0", None, None],
        "job": ["api", "api", "api", None, None, None, None],
    }
    assert decoded.metadata == (
        MetricMetadata("http_requests_total", "counter", "", "Requests served."),
        MetricMetadata("gpu_temp_celsius", "gauge", "celsius", ""),
        MetricMetadata("latency_seconds", "histogram", "", ""),
        MetricMetadata("rpc_seconds_count", "summary", "", ""),
    )
    assert decoded.kinds == {
        "http_requests_total": "counter",
        "gpu_temp_celsius": "gauge",
        "latency_seconds": "counter",
        "rpc_seconds_count": "counter",
    }


def test_v2_symbol_table_with_repeated_strings_still_decodes() -> None:
    request = messages.Request(symbols=["", "__name__", "up", "job", "a", "job", "b"])
    request.timeseries.add(labels_refs=[1, 2, 3, 4]).samples.add(value=1.0, timestamp=5)
    request.timeseries.add(labels_refs=[1, 2, 5, 6]).samples.add(value=2.0, timestamp=5)
    decoded = decode_v2(snappy(request.SerializeToString()))
    assert decoded.table["job"].to_pylist() == ["a", "b"]
    assert decoded.table.column_names == ["metric", "timestamp", "value", "job"]


def varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def test_v2_field_numbers_match_the_public_spec_byte_for_byte() -> None:
    # Hand-encoded from the spec's field numbers, independent of our schema tables:
    # Request{symbols=4, timeseries=5}; TimeSeries{labels_refs=1 packed, samples=2,
    # histograms=3, exemplars=4, metadata=5, created_timestamp=6}; Sample{value=1, timestamp=2};
    # Metadata{type=1, help_ref=3, unit_ref=4}.
    symbols = ["", "__name__", "node_power_watts", "job", "dcgm", "Board power.", "watts"]
    sample = field(1, 1, struct.pack("<d", 312.5)) + field(2, 0, varint(1_700_000_000_000))
    metadata = field(1, 0, varint(2)) + field(3, 0, varint(5)) + field(4, 0, varint(6))
    exemplar = field(2, 1, struct.pack("<d", 1.0))
    series = (
        field(1, 2, b"".join(varint(ref) for ref in (1, 2, 3, 4)))
        + field(2, 2, sample)
        + field(3, 2, field(3, 1, struct.pack("<d", 1.0)))
        + field(4, 2, exemplar)
        + field(5, 2, metadata)
        + field(6, 0, varint(1_600_000_000_000))
    )
    raw = b"".join(field(4, 2, symbol.encode()) for symbol in symbols) + field(5, 2, series)
    decoded = decode_v2(snappy(raw))
    assert decoded.table.to_pydict() == {
        "metric": ["node_power_watts"],
        "timestamp": [1_700_000_000_000],
        "value": [312.5],
        "job": ["dcgm"],
    }
    assert (decoded.histograms, decoded.exemplars) == (1, 1)
    assert decoded.metadata == (
        MetricMetadata("node_power_watts", "gauge", "watts", "Board power."),
    )
    parsed = messages.Request.FromString(raw)
    assert parsed.timeseries[0].created_timestamp == 1_600_000_000_000


def test_v1_field_numbers_match_the_public_spec_byte_for_byte() -> None:
    # WriteRequest{timeseries=1, metadata=3}; TimeSeries{labels=1, samples=2, exemplars=3,
    # histograms=4}; Label{name=1, value=2}; MetricMetadata{type=1, family=2, help=4, unit=5}.
    label = field(1, 2, b"__name__") + field(2, 2, b"up")
    sample = field(1, 1, struct.pack("<d", 1.0)) + field(2, 0, varint(42))
    series = (
        field(1, 2, label)
        + field(2, 2, sample)
        + field(3, 2, field(2, 1, struct.pack("<d", 0.5)))
        + field(4, 2, field(4, 0, varint(6)))
    )
    metadata = field(1, 0, varint(1)) + field(2, 2, b"up") + field(4, 2, b"h") + field(5, 2, b"u")
    decoded = decode_v1(snappy(field(1, 2, series) + field(3, 2, metadata)))
    assert decoded.table.to_pydict() == {"metric": ["up"], "timestamp": [42], "value": [1.0]}
    assert (decoded.exemplars, decoded.histograms) == (1, 1)
    assert decoded.metadata == (MetricMetadata("up", "counter", "u", "h"),)


# --- the .proto files are the schema the classes are built from ------------------------------

_SCALARS = {1: "double", 3: "int64", 4: "uint64", 9: "string", 12: "bytes", 13: "uint32"}
_SCALARS |= {17: "sint32", 18: "sint64"}


def read_proto(text: str) -> dict[str, dict[str, Any]]:
    """{message: {"fields": {name: (number, repeated, type, oneof)}, "enums": {...}}}."""
    text = re.sub(r"//[^\n]*", "", text)
    found: dict[str, dict[str, Any]] = {}
    stack: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if opened := re.fullmatch(r"(message|enum|oneof)\s+(\w+)\s*\{", line):
            kind, name = opened.groups()
            stack.append((kind, name))
            if kind == "message":
                found[name] = {"fields": {}, "enums": {}}
            elif kind == "enum":
                found[stack[0][1]]["enums"][name] = []
        elif line == "}":
            stack.pop()
        elif (
            stack
            and stack[-1][0] == "enum"
            and (value := re.fullmatch(r"(\w+)\s*=\s*(\d+);", line))
        ):
            found[stack[0][1]]["enums"][stack[-1][1]].append((value[1], int(value[2])))
        elif declared := re.fullmatch(r"(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+);", line):
            oneof = stack[-1][1] if stack[-1][0] == "oneof" else None
            found[stack[0][1]]["fields"][declared[3]] = (
                int(declared[4]),
                bool(declared[1]),
                declared[2],
                oneof,
            )
    return found


def built_schema(package: str, schema: Any) -> dict[str, dict[str, Any]]:
    proto = messages.file_descriptor(package, schema)
    found: dict[str, dict[str, Any]] = {}
    for message in proto.message_type:
        fields = {}
        for item in message.field:
            type_name = _SCALARS.get(item.type) or item.type_name.rsplit(".", 1)[-1]
            oneof = (
                message.oneof_decl[item.oneof_index].name if item.HasField("oneof_index") else None
            )
            fields[item.name] = (item.number, item.label == 3, type_name, oneof)
        enums = {enum.name: [(v.name, v.number) for v in enum.value] for enum in message.enum_type}
        found[message.name] = {"fields": fields, "enums": enums}
    return found


@pytest.mark.parametrize(
    ("filename", "package", "schema"),
    [
        ("remote_write_v1.proto", messages.V1_PACKAGE, messages.V1_SCHEMA),
        ("remote_write_v2.proto", messages.V2_PACKAGE, messages.V2_SCHEMA),
    ],
)
def test_proto_files_and_built_classes_agree(filename: str, package: str, schema: Any) -> None:
    text = (PROTO_DIR / filename).read_text()
    assert f"package {package};" in text
    assert read_proto(text) == built_schema(package, schema)


# --- bad input: every case names what is wrong and how to fix it -----------------------------


def v2_raw(symbols: list[str], *series: dict[str, Any]) -> bytes:
    request = messages.Request(symbols=symbols)
    for spec in series:
        request.timeseries.add(**spec)
    return snappy(request.SerializeToString())


UP = [("__name__", "up"), ("job", "x")]
OK = (UP, [(1.0, 1)])
V1 = {"content_type": CT_V1, "content_encoding": "snappy", "version_header": "0.1.0"}
V2 = {"content_type": CT_V2, "content_encoding": "snappy", "version_header": "2.0.0"}


def bad_utf8_label_body() -> bytes:
    raw = v1_request(OK, ([("__name__", "up"), ("job", "@@@")], [(1.0, 1)])).SerializeToString()
    return snappy(raw.replace(b"@@@", b"\xff\xfe!"))


def bad_utf8_metadata_body() -> bytes:
    request = v1_request(OK)
    request.metadata.add(type=1, metric_family_name="up", help="@@@")
    return snappy(request.SerializeToString().replace(b"@@@", b"\xc3(("))


def bad_utf8_symbol_body() -> bytes:
    request = messages.Request(symbols=["", "__name__", "@@@"])
    request.timeseries.add(labels_refs=[1, 2]).samples.add(value=1.0, timestamp=1)
    return snappy(request.SerializeToString().replace(b"@@@", b"\xed\xa0\x80"))


def bad_utf8_exemplar_body() -> bytes:
    request = v1_request(OK)
    exemplar = request.timeseries[0].exemplars.add(value=1.0, timestamp=1)
    exemplar.labels.add(name="trace_id", value="@@@")
    return snappy(request.SerializeToString().replace(b"@@@", b"\x80\x80\x80"))


def malformed_v2_metadata_body() -> bytes:
    series = field(1, 2, bytes([1, 2])) + field(5, 2, b"\x0a\xff")
    return snappy(
        field(4, 2, b"") + field(4, 2, b"__name__") + field(4, 2, b"up") + field(5, 2, series)
    )


def malformed_histogram_body() -> bytes:
    series = field(1, 2, field(1, 2, b"__name__") + field(2, 2, b"up")) + field(4, 2, b"\x0a\xff")
    return snappy(field(1, 2, series))


def malformed_sample_body() -> bytes:
    label = field(1, 2, field(1, 2, b"__name__") + field(2, 2, b"up"))
    return snappy(field(1, 2, label + field(2, 2, b"\x09\x00\x00")))


BAD_INPUTS: list[tuple[str, Callable[[], bytes], dict[str, Any], type[MetricVaultError], str]] = [
    ("content type text", lambda: v1_body(OK), V1 | {"content_type": "text/plain"},
     UnsupportedError, "Content-Type 'text/plain' is not supported"),
    ("content type json", lambda: v1_body(OK), V1 | {"content_type": "application/json"},
     UnsupportedError, "send 'application/x-protobuf'"),
    ("unknown proto", lambda: v1_body(OK),
     V1 | {"content_type": "application/x-protobuf;proto=io.prometheus.write.v3.Request"},
     UnsupportedError, "does not speak"),
    ("gzip encoding", lambda: v1_body(OK), V1 | {"content_encoding": "gzip"},
     UnsupportedError, "Content-Encoding 'gzip' is not supported"),
    ("identity encoding", lambda: v1_body(OK), V1 | {"content_encoding": "identity"},
     UnsupportedError, "Content-Encoding: snappy"),
    ("2.0 header without content type", lambda: v1_body(OK),
     V1 | {"content_type": None, "version_header": "2.0.0"}, UnsupportedError,
     "no Content-Type"),
    ("empty body", lambda: b"", V1, InputError, "request body is empty"),
    ("framed snappy", lambda: bytes(cramjam.snappy.compress(v1_request(OK).SerializeToString())),
     V1, InputError, "framed snappy stream"),
    ("truncated snappy", lambda: v1_body(OK, OK, OK)[:-7], V1, InputError,
     "not a valid snappy block"),
    ("no snappy header", lambda: b"\xff\xff\xff\xff\xff\xff", V1, InputError,
     "does not start with a snappy block header"),
    ("uncompressed protobuf", lambda: v1_request(OK).SerializeToString(), V1, InputError,
     "snappy"),
    ("declared size over limit", lambda: varint(10_000_001) + b"\x00" * 600_000,
     V1 | {"max_decoded_bytes": 10_000_000}, TooLargeError, "over the limit of 10,000,000"),
    ("declared size impossible", lambda: varint(50_000_000) + b"\x00", V1, InputError,
     "more than a 5-byte block can hold"),
    ("not protobuf", lambda: snappy(b"\xff\xff\xff\xff garbage"), V1, InputError,
     "not a valid protobuf prometheus.WriteRequest"),
    ("2.0 body as 1.0", lambda: v2_raw(["", "__name__", "up"], {"labels_refs": [1, 2]}), V1,
     InputError, "is it a remote-write 2.0 body?"),
    ("1.0 body as 2.0", lambda: v1_body(OK), V2, InputError, "is it a remote-write 1.0 body?"),
    ("missing __name__", lambda: v1_body(OK, ([("job", "x")], [(1.0, 1)])), V1, LabelError,
     'series #1 {job="x"}: the series has no __name__ label'),
    ("no labels at all", lambda: v1_body(OK, OK, ([], [(1.0, 1)])), V1, LabelError,
     "series #2 {}: the series has no __name__ label"),
    ("empty label name", lambda: v1_body(([("", "v"), ("__name__", "up")], [(1.0, 1)])), V1,
     LabelError, 'series #0 up{="v"}: invalid label name "": the name is empty'),
    ("invalid label name", lambda: v1_body(([("__name__", "up"), ("pod-name", "p")], [])), V1,
     LabelError, 'invalid label name "pod-name": label names must match'),
    ("invalid metric name", lambda: v1_body(([("__name__", "1up")], [(1.0, 1)])), V1, LabelError,
     'series #0 "1up"{}: metric name "1up" is invalid'),
    ("empty metric name", lambda: v1_body(([("__name__", ""), ("job", "x")], [(1.0, 1)])), V1,
     LabelError, "the __name__ label is empty"),
    ("unsorted labels", lambda: v1_body(([("__name__", "up"), ("job", "x"), ("env", "p")], [])),
     V1, LabelError, "label 'env' comes after 'job'; labels must be unique and sorted"),
    ("duplicate labels", lambda: v1_body(([("__name__", "up"), ("a", "1"), ("a", "2")], [])), V1,
     LabelError, 'series #0 up{a="2"}: label \'a\' is duplicated'),
    ("reserved label value", lambda: v1_body(([("__name__", "up"), ("value", "1")], [])), V1,
     LabelError, 'invalid label name "value": it is reserved'),
    ("reserved label metric", lambda: v1_body(([("__name__", "up"), ("metric", "m")], [])), V1,
     LabelError, "'exported_metric'"),
    ("label value not UTF-8", bad_utf8_label_body, V1, LabelError,
     "series #1 up{job=\"\ufffd\ufffd!\"}: the value of label #1"),
    ("metadata not UTF-8", bad_utf8_metadata_body, V1, InputError,
     "metadata entry #0 (b'up'): its help"),
    ("metadata family invalid", lambda: snappy(v1_request().SerializeToString() + field(
        3, 2, field(2, 2, b"bad name"))), V1, LabelError,
     'metadata entry #0: metric family name "bad name" is invalid'),
    ("exemplar label not UTF-8", bad_utf8_exemplar_body, V1, LabelError,
     'series #0 up{job="x"}: the value of exemplar #0\'s label #0'),
    ("malformed histogram", malformed_histogram_body, V1, InputError, "not a valid protobuf"),
    ("v2 malformed metadata", malformed_v2_metadata_body, V2, InputError,
     "not a valid protobuf io.prometheus.write.v2.Request"),
    ("malformed sample", malformed_sample_body, V1, InputError, "not a valid protobuf"),
    ("too many series", lambda: v1_body(OK, OK, OK), V1 | {"max_series": 2}, TooLargeError,
     "3 time series, over the limit of 2"),
    ("v2 odd refs", lambda: v2_raw(["", "__name__", "up"], {"labels_refs": [1, 2, 1]}), V2,
     LabelError, "series #0: labels_refs has 3 entries, an odd number"),
    ("v2 ref out of range", lambda: v2_raw(["", "__name__", "up"], {"labels_refs": [1, 2]},
                                            {"labels_refs": [1, 9]}), V2, LabelError,
     "series #1: labels_refs points at symbol 9, but the symbol table has 3 entries"),
    ("v2 symbols[0] not empty", lambda: v2_raw(["x", "__name__", "up"], {"labels_refs": [1, 2]}),
     V2, InputError, "symbols[0] to be the empty string"),
    ("v2 missing __name__", lambda: v2_raw(["", "job", "x"], {"labels_refs": [1, 2]}), V2,
     LabelError, 'series #0 {job="x"}: the series has no __name__'),
    ("v2 unsorted", lambda: v2_raw(["", "__name__", "up", "b", "a"],
                                   {"labels_refs": [1, 2, 3, 2, 4, 2]}),
     V2, LabelError, "label 'a' comes after 'b'"),
    ("v2 help_ref out of range", lambda: v2_raw(["", "__name__", "up"], {
        "labels_refs": [1, 2], "metadata": {"type": 1, "help_ref": 7}}), V2, LabelError,
     'series #0 up{}: metadata help_ref=7'),
    ("v2 symbol not UTF-8", bad_utf8_symbol_body, V2, LabelError,
     "symbol #2 (b'\\xed\\xa0\\x80') is not valid UTF-8"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make_body", "headers", "error", "message"),
    [case[1:] for case in BAD_INPUTS],
    ids=[case[0] for case in BAD_INPUTS],
)
def test_bad_input_is_rejected_with_a_clear_message(
    make_body: Callable[[], bytes],
    headers: dict[str, Any],
    error: type[MetricVaultError],
    message: str,
) -> None:
    with pytest.raises(error) as raised:
        decode_remote_write(make_body(), **headers)
    assert message in str(raised.value)
    assert isinstance(raised.value, MetricVaultError)
    assert "; " in str(raised.value) or "send" in str(raised.value)  # says how to fix it


def test_bad_input_corpus_covers_every_status() -> None:
    statuses = {case[3].status for case in BAD_INPUTS}
    assert statuses == {400, 413, 415} and len(BAD_INPUTS) >= 30


@pytest.mark.parametrize("metric", ["up\n", "gpu\u20ac", "a b", "0x", "up{}", "\u00e9t\u00e9"])
def test_invalid_metric_names_are_rejected_by_both_paths(metric: str) -> None:
    with pytest.raises(LabelError, match="is invalid; metric names must match"):
        decode_v1(v1_body(OK, ([("__name__", metric)], [(1.0, 1)])))


def test_the_label_cell_limit_guards_against_sparse_label_bombs() -> None:
    series = [([("__name__", "m"), (f"label_{i}", "v")], [(1.0, 1)]) for i in range(40)]
    body = v1_body(*series)
    assert decode_v1(body).table.num_rows == 40  # 41 x 40 cells: far below the default
    with pytest.raises(TooLargeError, match=r"41 distinct label names.*over the limit of 1,000"):
        decode_v1(body, max_label_cells=1000)


def test_a_rejected_request_names_the_first_bad_series_among_good_ones() -> None:
    good = [([("__name__", f"m{i}"), ("job", "x")], [(1.0, 1)]) for i in range(50)]
    bad = ([("__name__", "m"), ("job", "x"), ("job", "y")], [(1.0, 1)])
    with pytest.raises(LabelError, match=r"series #37 m\{job=\"y\"\}: label 'job' is duplicated"):
        decode_v1(v1_body(*good[:37], bad, *good[37:]))


@pytest.mark.parametrize(
    "encoded",
    [
        [b"\x10\x80"],  # varint whose last byte says "more follows"
        [b"\x10\x81\x01\x00"],  # varint shorter than the bytes left
        [b"\x10" + b"\xff" * 9 + b"\x02"],  # 10-byte varint over 64 bits
        [b"\x10" + b"\xff" * 9 + b"\x01"],  # -1
        [b"\x10" + b"\x80" * 10 + b"\x01"],  # 11-byte varint
        [b"\x09" + b"\x00" * 7],  # value cut short
        [b"\x09" + struct.pack("<d", 1.0) + b"\x18\x01"],  # field 3 instead of timestamp
        [b"", b"\x09" + struct.pack("<d", 2.0), b"\x10\x05"],  # zero-valued fields left out
    ],
)
def test_vectorised_sample_decoding_agrees_with_protobuf(encoded: list[bytes]) -> None:
    try:
        expected = remote_write_columns.decode_samples_slowly(encoded)
    except remote_write_checks._Invalid:
        with pytest.raises(remote_write_checks._Invalid):
            remote_write_columns.decode_samples(encoded)
        return
    values, timestamps = remote_write_columns.decode_samples(encoded)
    assert values.tolist() == expected[0].tolist()
    assert timestamps.tolist() == expected[1].tolist()


def test_v2_metadata_with_nothing_in_it_is_no_metadata() -> None:
    series = field(1, 2, bytes([1, 2])) + field(2, 2, b"") + field(5, 2, b"\x08\x00")
    raw = field(4, 2, b"") + field(4, 2, b"__name__") + field(4, 2, b"up") + field(5, 2, series)
    decoded = decode_v2(snappy(raw))
    assert decoded.metadata == () and decoded.kinds == {}
    assert decoded.table.to_pydict() == {"metric": ["up"], "timestamp": [0], "value": [0.0]}


# --- fuzz ------------------------------------------------------------------------------------


def check_outcome(body: bytes, headers: dict[str, Any]) -> None:
    try:
        decoded = decode_remote_write(body, **headers)
    except MetricVaultError as exc:
        assert exc.status in (400, 413, 415) and exc.message
        return
    assert isinstance(decoded, DecodedWrite)
    assert decoded.table.num_rows == decoded.samples
    assert decoded.table.column_names[:3] == ["metric", "timestamp", "value"]
    assert decoded.table["metric"].null_count == 0


def fuzz_seeds() -> list[bytes]:
    seeds = [v1_request(OK, ([("__name__", "b"), ("z", "")], [(STALE_NAN, 2)])).SerializeToString()]
    builder = V2Builder()
    builder.series({"__name__": "up", "job": "x"}, [(1.0, 1)], kind=1, help_text="h")
    seeds.append(builder.request.SerializeToString())
    for name in golden_files()[:3]:
        seeds.append(bytes(cramjam.snappy.decompress_raw((GOLDEN / name).read_bytes())))
    return seeds


SEEDS = fuzz_seeds()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.timeout(240)
@FUZZ
@given(body=st.binary(max_size=2048), v2=st.booleans())
def test_fuzz_random_bytes(body: bytes, v2: bool) -> None:
    check_outcome(body, V2 if v2 else V1)
    check_outcome(snappy(body), V2 if v2 else V1)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        if not raw:
            break
        where = draw(st.integers(0, len(raw) - 1))
        action = draw(st.sampled_from(["flip", "byte", "cut", "drop", "dup"]))
        if action == "flip":
            raw[where] ^= 1 << draw(st.integers(0, 7))
        elif action == "byte":
            raw[where] = draw(st.integers(0, 255))
        elif action == "cut":
            del raw[where:]
        elif action == "drop":
            del raw[where]
        else:
            raw[where:where] = raw[where : where + draw(st.integers(1, 16))]
    return bytes(raw)


@pytest.mark.timeout(240)
@FUZZ
@given(raw=mutated(), v2=st.booleans(), compressed_mutation=st.booleans())
def test_fuzz_mutated_bodies(raw: bytes, v2: bool, compressed_mutation: bool) -> None:
    body = snappy(raw)
    if compressed_mutation and body:  # also corrupt the snappy block itself
        middle = len(body) // 2
        body = body[:middle] + bytes([body[middle] ^ 0x55]) + body[middle + 1 :]
    check_outcome(body, V2 if v2 else V1)


# --- issue 10: request limits and linear cost ------------------------------------------------

T0 = 1_767_225_600_000


def _wide_v1(series: int, names_each: int) -> bytes:
    return v1_body(
        *(
            (
                sorted([("__name__", "up")] + [(f"l{i}_{j}", "x") for j in range(names_each)]),
                [(1.0, T0)],
            )
            for i in range(series)
        )
    )


def _wide_v2(series: int, names_each: int) -> bytes:
    builder = V2Builder()
    for i in range(series):
        labels = {"__name__": "up", **{f"l{i}_{j}": "x" for j in range(names_each)}}
        builder.series(labels, [(1.0, T0)])
    return builder.body()


@pytest.mark.parametrize(("decode", "wide"), [(decode_v1, _wide_v1), (decode_v2, _wide_v2)])
def test_label_names_per_request_limit(decode: Any, wide: Any) -> None:
    body = wide(10, 3)  # 30 distinct names besides __name__
    assert len(decode(body, max_label_names=30).table.column_names) == 3 + 30
    with pytest.raises(TooLargeError, match=r"30 distinct label names \(e\.g\. \"l0_0\""):
        decode(body, max_label_names=29)


def test_decode_time_budget_is_checked_between_phases() -> None:
    body = _wide_v1(200, 3)
    assert decode_v1(body, time_budget_s=60.0).samples == 200
    with pytest.raises(TooLargeError, match=r"over the budget of 0 s per request"):
        decode_v1(body, time_budget_s=0.0)


def test_wide_request_memory_is_linear_not_series_times_names() -> None:
    """1,000 series x 33 label names of their own: the decoder held a names x series int64
    matrix (33,000 x 1,000 x 8 bytes = 264 MB of numpy, which tracemalloc sees); now only
    per-name scratch arrays. The Arrow table itself (Arrow's allocator) is not counted."""
    import tracemalloc

    body = _wide_v1(1000, 33)
    tracemalloc.start()
    try:
        decoded = decode_v1(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.table.num_columns == 3 + 33_000
    assert peak < 64 * 1024**2, f"decoding traced {peak / 1024**2:.0f} MB at peak"
