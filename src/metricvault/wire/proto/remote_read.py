"""Prometheus remote-read messages (``prompb/remote.proto``, ``types.proto``), built at import.

Only what a SAMPLES answer needs: ``ReadRequest`` (queries: a time range and label matchers)
and ``ReadResponse`` (per query, the matching series with their samples). ``ReadHints`` and
``accepted_response_types`` are left out of the schema on purpose: unknown fields are skipped
by the parser, and metricvault answers SAMPLES, the type every Prometheus reader accepts.
Field numbers are the wire contract (prompb in Prometheus 2.x).
"""

from __future__ import annotations

from typing import Any

from metricvault.wire.proto.messages import V1_PACKAGE, _Message, _message_class

READ_SCHEMA: tuple[_Message, ...] = (
    _Message("ReadRequest", ("repeated Query queries = 1",)),
    _Message(
        "Query",
        (
            "int64 start_timestamp_ms = 1",
            "int64 end_timestamp_ms = 2",
            "repeated LabelMatcher matchers = 3",
        ),
    ),
    _Message(
        "LabelMatcher",
        ("Type type = 1", "string name = 2", "string value = 3"),
        enums=(("Type", ("EQ", "NEQ", "RE", "NRE")),),
    ),
    _Message("ReadResponse", ("repeated QueryResult results = 1",)),
    _Message("QueryResult", ("repeated TimeSeries timeseries = 1",)),
    _Message("TimeSeries", ("repeated Label labels = 1", "repeated Sample samples = 2")),
    _Message("Label", ("string name = 1", "string value = 2")),
    _Message("Sample", ("double value = 1", "int64 timestamp = 2")),
)

ReadRequest: Any = _message_class(V1_PACKAGE, READ_SCHEMA, "ReadRequest")
ReadResponse: Any = _message_class(V1_PACKAGE, READ_SCHEMA, "ReadResponse")
MATCHER_OPS = ("=", "!=", "=~", "!~")  # LabelMatcher.Type, in enum order
