"""An OTLP/HTTP request body -> an ``ExportMetricsServiceRequest``, and the replies' bodies.

Content types (OTLP/HTTP spec): ``application/x-protobuf`` (binary protobuf) and
``application/json`` (the OTLP JSON mapping: lowerCamelCase or original field names, int64 and
uint64 as strings or numbers, enums as integers, trace and span ids in hex, unknown fields
ignored). ``Content-Encoding: gzip`` is inflated in bounded chunks (a gzip bomb stops at
``max_decoded_bytes``). Replies go back in the request's content type: an
``ExportMetricsServiceResponse`` on success, a ``google.rpc.Status`` on errors.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from metricvault.errors import InputError, UnsupportedError
from metricvault.ingest.protocols.gzip_body import gunzip

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)

_GRPC_INVALID_ARGUMENT = 3  # google.rpc.Code for a 400
# google.rpc.Code by HTTP status, for the Status body of a refusal
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}


def media_type(content_type: str | None) -> str | None:
    """``application/json; charset=utf-8`` -> ``application/json``; None if not OTLP's."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind if kind in CONTENT_TYPES else None


def check_content_type(content_type: str | None) -> str:
    kind = media_type(content_type)
    if kind is None:
        shown = json.dumps(content_type) if content_type else "none"
        raise UnsupportedError(
            f"Content-Type {shown} is not an OTLP/HTTP encoding; send "
            f"'{PROTOBUF}' (binary protobuf) or '{JSON}' (the OTLP JSON mapping)"
        )
    return kind


def inflate(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body as sent, or gunzipped; never more than ``limit`` bytes of it."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip"):
        raise UnsupportedError(
            f"Content-Encoding {json.dumps(content_encoding)} is not supported for OTLP; send "
            "the body uncompressed or with 'Content-Encoding: gzip'"
        )
    return gunzip(
        body,
        limit,
        f"the gzip body inflates to more than {limit} bytes (max_body_bytes); export smaller "
        "batches (OTel SDK: lower max_export_batch_size; Collector: send_batch_max_size)",
    )


def parse_request(raw: bytes, kind: str) -> Any:
    """The ``ExportMetricsServiceRequest`` in ``raw``, or ``InputError`` saying why not."""
    request = ExportMetricsServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(raw)
        except DecodeError as exc:
            raise InputError(
                f"the body ({len(raw):,} bytes) is not a valid protobuf "
                f"ExportMetricsServiceRequest: {exc}; send an OTLP metrics export request "
                f"(opentelemetry-proto) with Content-Type {PROTOBUF}"
            ) from exc
        return request
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"the body is not JSON: {exc}; send OTLP/JSON") from exc
    except RecursionError:  # Python's json module recurses once per level
        raise _too_deep() from None
    if not isinstance(document, dict):
        raise InputError(
            f"the JSON body is a {type(document).__name__}, not an object; send an OTLP/JSON "
            'ExportMetricsServiceRequest ({"resourceMetrics": [...]})'
        )
    try:
        _hex_ids_to_base64(document)
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(
            f"the JSON body is not a valid OTLP/JSON ExportMetricsServiceRequest: {exc}"
        ) from exc
    return request


_ID_KEYS = ("traceId", "spanId", "trace_id", "span_id")
# As protobuf's binary parser limits message nesting (100): deeper JSON is refused before
# the recursive parsers (json, protobuf's json_format) could run out of stack on it.
MAX_JSON_DEPTH = 100


def _hex_ids_to_base64(document: Any) -> None:
    """OTLP/JSON writes trace and span ids in hex, where proto3 JSON expects base64. Walks
    without recursing, and refuses a document nested deeper than :data:`MAX_JSON_DEPTH`
    before protobuf's (recursive) JSON parser sees it."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_KEYS and isinstance(value, str):
                    try:
                        node[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                    except ValueError as exc:
                        raise ValueError(f"{key} {value!r} is not hex") from exc
                elif isinstance(value, dict | list):
                    stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node if isinstance(item, dict | list))


def _too_deep() -> InputError:
    return InputError(
        f"the JSON body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels (the "
        "limit; an OTLP export needs about 15, more only for kvlistValue/arrayValue "
        "attributes nested in each other): flatten the nested attribute values"
    )


def response_body(rejected: int, message: str, kind: str) -> bytes:
    """An ``ExportMetricsServiceResponse``; ``partial_success`` set only when something was
    rejected (the spec: an empty response means everything was accepted)."""
    response = ExportMetricsServiceResponse()
    if rejected or message:
        response.partial_success.rejected_data_points = rejected
        response.partial_success.error_message = message
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(response)).encode()
    return bytes(response.SerializeToString())


def status_body(status: int, message: str, kind: str) -> bytes:
    """A ``google.rpc.Status`` (code, message), encoded by hand: its two scalar fields are all
    a refusal needs, and googleapis-common-protos would be a dependency for them only."""
    code = GRPC_CODES.get(status, _GRPC_INVALID_ARGUMENT if status < 500 else 13)
    if kind == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
