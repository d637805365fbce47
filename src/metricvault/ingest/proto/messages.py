"""Moved to :mod:`metricvault.wire.proto.messages` (issue 12): the agent's encoder and the
gateway's decoder share the schemas, and ``collect`` may not import ``ingest``."""

from metricvault.wire.proto.messages import (  # moved: issue 12
    V1_PACKAGE,
    V1_SCHEMA,
    V2_PACKAGE,
    V2_SCHEMA,
    DecodeError,
    Label,
    LabelBytes,
    Metadata,
    Request,
    RequestBytes,
    RequestFast,
    RequestMerged,
    Sample,
    WriteRequest,
    WriteRequestBytes,
    WriteRequestFast,
    WriteRequestMerged,
    file_descriptor,
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
    "WriteRequest",
    "WriteRequestBytes",
    "WriteRequestFast",
    "WriteRequestMerged",
    "file_descriptor",
]
