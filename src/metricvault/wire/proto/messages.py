"""Prometheus remote-write message classes, built at import time: no protoc, no generated code.

The schemas below mirror ``remote_write_v1.proto`` and ``remote_write_v2.proto`` beside this
module line for line (field numbers are the wire contract; a unit test compares the two). They
are turned into ``FileDescriptorProto``s and handed to the protobuf runtime, which builds real
message classes (upb-backed, so parsing runs in C).

Besides the classes as written (``WriteRequest``, ``Request``: for senders and tests), the
decoder uses *twins*: the same wire format read through a different schema, which is legal in
protobuf and lets C do work that Python would otherwise do per label:

- ``*Fast``: the request's structure only: per series, its labels and samples as raw
  ``bytes`` (so counting them costs no parsing), and 1.0 metadata as written.
- ``*Merged``: ``timeseries`` is declared *singular*, so the parser merges every series into
  one message: the labels (or 2.0 label references), samples, histograms and exemplars of the
  whole request, each as one flat list, with no Python loop over series. Histograms and
  exemplars are parsed (so checked) and only counted.
- ``WriteRequestSeries``: each series as its raw bytes (the fast decoder in
  ``ingest/protocols/remote_write_known.py`` reads the labels' bytes as a key).
- ``*Bytes``: every ``string`` is ``bytes``, which never fails on invalid UTF-8; used only after
  a failed parse, to name the series whose label is not UTF-8.

Rebuilding needs nothing: the classes are made when this module is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message,
    message_factory,
)

__all__ = [
    "V1_PACKAGE",
    "V1_SCHEMA",
    "V2_PACKAGE",
    "V2_SCHEMA",
    "DecodeError",
    "Label",
    "LabelBytes",
    "Metadata",
    "Request",
    "RequestBytes",
    "RequestFast",
    "RequestMerged",
    "Sample",
    "TimeSeries",
    "WriteRequest",
    "WriteRequestBytes",
    "WriteRequestFast",
    "WriteRequestMerged",
    "WriteRequestSeries",
    "file_descriptor",
]

DecodeError: type[Exception] = message.DecodeError

V1_PACKAGE = "prometheus"
V2_PACKAGE = "io.prometheus.write.v2"


@dataclass(frozen=True)
class _Message:
    name: str
    fields: tuple[str, ...]  # "[repeated ]TYPE NAME = N", or "oneof GROUP: TYPE NAME = N"
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (enum name, value names from 0)
    reserved: tuple[int, ...] = ()


def _histogram(reset_hints: tuple[str, ...]) -> _Message:
    return _Message(
        "Histogram",
        (
            "oneof count: uint64 count_int = 1",
            "oneof count: double count_float = 2",
            "double sum = 3",
            "sint32 schema = 4",
            "double zero_threshold = 5",
            "oneof zero_count: uint64 zero_count_int = 6",
            "oneof zero_count: double zero_count_float = 7",
            "repeated BucketSpan negative_spans = 8",
            "repeated sint64 negative_deltas = 9",
            "repeated double negative_counts = 10",
            "repeated BucketSpan positive_spans = 11",
            "repeated sint64 positive_deltas = 12",
            "repeated double positive_counts = 13",
            "ResetHint reset_hint = 14",
            "int64 timestamp = 15",
            "repeated double custom_values = 16",
        ),
        enums=(("ResetHint", reset_hints),),
    )


_BUCKET_SPAN = _Message("BucketSpan", ("sint32 offset = 1", "uint32 length = 2"))
_SAMPLE = _Message("Sample", ("double value = 1", "int64 timestamp = 2"))

V1_SCHEMA: tuple[_Message, ...] = (
    _Message(
        "WriteRequest",
        ("repeated TimeSeries timeseries = 1", "repeated MetricMetadata metadata = 3"),
        reserved=(2,),
    ),
    _Message(
        "MetricMetadata",
        (
            "MetricType type = 1",
            "string metric_family_name = 2",
            "string help = 4",
            "string unit = 5",
        ),
        enums=(
            (
                "MetricType",
                (
                    "UNKNOWN",
                    "COUNTER",
                    "GAUGE",
                    "HISTOGRAM",
                    "GAUGEHISTOGRAM",
                    "SUMMARY",
                    "INFO",
                    "STATESET",
                ),
            ),
        ),
    ),
    _SAMPLE,
    _Message("Exemplar", ("repeated Label labels = 1", "double value = 2", "int64 timestamp = 3")),
    _Message(
        "TimeSeries",
        (
            "repeated Label labels = 1",
            "repeated Sample samples = 2",
            "repeated Exemplar exemplars = 3",
            "repeated Histogram histograms = 4",
        ),
    ),
    _Message("Label", ("string name = 1", "string value = 2")),
    _histogram(("UNKNOWN", "YES", "NO", "GAUGE")),
    _BUCKET_SPAN,
)

V2_SCHEMA: tuple[_Message, ...] = (
    _Message(
        "Request",
        ("repeated string symbols = 4", "repeated TimeSeries timeseries = 5"),
        reserved=(1, 2, 3),
    ),
    _Message(
        "TimeSeries",
        (
            "repeated uint32 labels_refs = 1",
            "repeated Sample samples = 2",
            "repeated Histogram histograms = 3",
            "repeated Exemplar exemplars = 4",
            "Metadata metadata = 5",
            "int64 created_timestamp = 6",
        ),
    ),
    _Message(
        "Exemplar",
        ("repeated uint32 labels_refs = 1", "double value = 2", "int64 timestamp = 3"),
    ),
    _SAMPLE,
    _Message(
        "Metadata",
        ("MetricType type = 1", "uint32 help_ref = 3", "uint32 unit_ref = 4"),
        enums=(
            (
                "MetricType",
                tuple(
                    f"METRIC_TYPE_{kind}"
                    for kind in (
                        "UNSPECIFIED",
                        "COUNTER",
                        "GAUGE",
                        "HISTOGRAM",
                        "GAUGEHISTOGRAM",
                        "SUMMARY",
                        "INFO",
                        "STATESET",
                    )
                ),
            ),
        ),
    ),
    _histogram(tuple(f"RESET_HINT_{hint}" for hint in ("UNSPECIFIED", "YES", "NO", "GAUGE"))),
    _BUCKET_SPAN,
)

_FDP = descriptor_pb2.FieldDescriptorProto
_SCALAR_TYPES: dict[str, int] = {
    "double": _FDP.TYPE_DOUBLE,
    "int64": _FDP.TYPE_INT64,
    "uint64": _FDP.TYPE_UINT64,
    "uint32": _FDP.TYPE_UINT32,
    "sint32": _FDP.TYPE_SINT32,
    "sint64": _FDP.TYPE_SINT64,
    "string": _FDP.TYPE_STRING,
    "bytes": _FDP.TYPE_BYTES,
}
_FIELD = re.compile(r"(?:oneof (\w+): )?(repeated )?(\w+) (\w+) = (\d+)")


def file_descriptor(
    package: str, schema: tuple[_Message, ...], *, strings_as_bytes: bool = False
) -> Any:
    """The ``FileDescriptorProto`` for ``schema`` (proto3, so repeated scalars are packed)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=package.replace(".", "/") + ("/bytes" if strings_as_bytes else "") + ".proto",
        package=package,
        syntax="proto3",
    )
    for spec in schema:
        _add_message(proto.message_type.add(), package, spec, strings_as_bytes)
    return proto


def _add_message(target: Any, package: str, spec: _Message, strings_as_bytes: bool) -> None:
    target.name = spec.name
    for enum_name, values in spec.enums:
        enum = target.enum_type.add(name=enum_name)
        for value_number, value_name in enumerate(values):
            enum.value.add(name=value_name, number=value_number)
    enum_names = {name for name, _ in spec.enums}
    oneofs: list[str] = []
    for declaration in spec.fields:
        match = _FIELD.fullmatch(declaration)
        if match is None:  # a typo in the tables above: fail at import, loudly
            raise ValueError(f"cannot read field declaration {declaration!r} of {spec.name}")
        oneof, repeated, type_name, field_name, number = match.groups()
        field = target.field.add(name=field_name, number=int(number))
        field.label = _FDP.LABEL_REPEATED if repeated else _FDP.LABEL_OPTIONAL
        if type_name == "string" and strings_as_bytes:
            type_name = "bytes"
        if type_name in _SCALAR_TYPES:
            field.type = _SCALAR_TYPES[type_name]
        elif type_name in enum_names:
            field.type = _FDP.TYPE_ENUM
            field.type_name = f".{package}.{spec.name}.{type_name}"
        else:
            field.type = _FDP.TYPE_MESSAGE
            field.type_name = f".{package}.{type_name}"
        if oneof:
            if oneof not in oneofs:
                oneofs.append(oneof)
                target.oneof_decl.add(name=oneof)
            field.oneof_index = oneofs.index(oneof)
    for reserved in spec.reserved:
        target.reserved_range.add(start=reserved, end=reserved + 1)


def _message_class(
    package: str,
    schema: tuple[_Message, ...],
    name: str,
    *,
    strings_as_bytes: bool = False,
    fields: dict[str, tuple[str, ...]] | None = None,
) -> Any:
    """The class of ``package.name``; ``fields`` swaps the field lists of some messages."""
    swapped = fields or {}
    variant = tuple(replace(spec, fields=swapped.get(spec.name, spec.fields)) for spec in schema)
    variant += tuple(
        _Message(extra, declared)
        for extra, declared in swapped.items()
        if extra not in {spec.name for spec in schema}
    )
    # A pool of its own per variant: the variants share full names.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor(package, variant, strings_as_bytes=strings_as_bytes))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))


WriteRequest: Any = _message_class(V1_PACKAGE, V1_SCHEMA, "WriteRequest")
Label: Any = _message_class(V1_PACKAGE, V1_SCHEMA, "Label")
LabelBytes: Any = _message_class(V1_PACKAGE, V1_SCHEMA, "Label", strings_as_bytes=True)
Sample: Any = _message_class(V1_PACKAGE, V1_SCHEMA, "Sample")  # the same in 1.0 and 2.0
WriteRequestFast: Any = _message_class(
    V1_PACKAGE,
    V1_SCHEMA,
    "WriteRequest",
    fields={"TimeSeries": ("repeated bytes labels = 1", "repeated bytes samples = 2")},
)
# the request's series as raw bytes each (the labels of a series are the start of its bytes)
WriteRequestSeries: Any = _message_class(
    V1_PACKAGE,
    V1_SCHEMA,
    "WriteRequest",
    fields={
        "WriteRequest": ("repeated bytes timeseries = 1", "repeated MetricMetadata metadata = 3")
    },
)
TimeSeries: Any = _message_class(V1_PACKAGE, V1_SCHEMA, "TimeSeries")
WriteRequestMerged: Any = _message_class(
    V1_PACKAGE,
    V1_SCHEMA,
    "WriteRequest",
    fields={
        "WriteRequest": ("Merged timeseries = 1",),
        "Merged": (
            "repeated bytes labels = 1",
            "repeated bytes samples = 2",
            "repeated Exemplar exemplars = 3",
            "repeated Histogram histograms = 4",
        ),
    },
)
WriteRequestBytes: Any = _message_class(
    V1_PACKAGE, V1_SCHEMA, "WriteRequest", strings_as_bytes=True
)

Request: Any = _message_class(V2_PACKAGE, V2_SCHEMA, "Request")
Metadata: Any = _message_class(V2_PACKAGE, V2_SCHEMA, "Metadata")
RequestFast: Any = _message_class(
    V2_PACKAGE,
    V2_SCHEMA,
    "Request",
    fields={
        "TimeSeries": (
            "repeated uint32 labels_refs = 1",
            "repeated bytes samples = 2",
            "bytes metadata = 5",
        )
    },
)
RequestMerged: Any = _message_class(
    V2_PACKAGE,
    V2_SCHEMA,
    "Request",
    fields={
        "Request": ("Merged timeseries = 5",),
        "Merged": (
            "repeated uint32 labels_refs = 1",
            "repeated bytes samples = 2",
            "repeated Histogram histograms = 3",
            "repeated Exemplar exemplars = 4",
        ),
    },
)
RequestBytes: Any = _message_class(V2_PACKAGE, V2_SCHEMA, "Request", strings_as_bytes=True)
