"""Remote-write framing: which message the headers announce, and the snappy block around it.

No protobuf here: version negotiation (``Content-Type``'s ``proto`` parameter, as the specs and
Prometheus's receiver decide) and snappy *block* decompression, sized before it allocates.
"""

from __future__ import annotations

import cramjam

from metricvault.errors import InputError, TooLargeError, UnsupportedError
from metricvault.wire.remote_write import (
    CONTENT_TYPE_V1,
    CONTENT_TYPE_V2,
    MEDIA_TYPE,
    PROTO_V1,
    PROTO_V2,
)

__all__ = [
    "check_encoding",
    "decompress_snappy_block",
    "negotiate_version",
    "snappy_declared_length",
]

_FRAMED_SNAPPY_MAGIC = b"\xff\x06\x00\x00sNaPpY"
# One snappy copy element of 3 bytes emits at most 64 bytes: no valid block expands further.
_SNAPPY_MAX_RATIO = 22


def negotiate_version(content_type: str | None, version_header: str | None) -> str:
    """``"1.0"`` or ``"2.0"`` from the request headers, or ``UnsupportedError``."""
    if content_type is None or not content_type.strip():
        if version_header is not None and version_header.strip().startswith("2."):
            raise UnsupportedError(
                f"X-Prometheus-Remote-Write-Version is {version_header.strip()!r} but there is "
                f"no Content-Type to say which message the body holds; send Content-Type "
                f"{CONTENT_TYPE_V2!r} for remote-write 2.0 or {CONTENT_TYPE_V1!r} for 1.0"
            )
        return "1.0"
    media_type, *params = (part.strip() for part in content_type.split(";"))
    if media_type.lower() != MEDIA_TYPE:
        raise UnsupportedError(
            f"Content-Type {content_type!r} is not supported: remote-write bodies are "
            f"{MEDIA_TYPE!r}; send {CONTENT_TYPE_V1!r} (remote-write 1.0) or "
            f"{CONTENT_TYPE_V2!r} (2.0)"
        )
    proto = None
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "proto":
            proto = value.strip().strip('"')
    if proto is None or proto == PROTO_V1:
        return "1.0"
    if proto == PROTO_V2:
        return "2.0"
    raise UnsupportedError(
        f"Content-Type {content_type!r} asks for protobuf message {proto!r}, which this "
        f"receiver does not speak; supported: {PROTO_V1!r} (remote-write 1.0) and {PROTO_V2!r} "
        f"(2.0)"
    )


def check_encoding(content_encoding: str | None) -> None:
    if content_encoding is None or content_encoding.strip().lower() in ("", "snappy"):
        return
    raise UnsupportedError(
        f"Content-Encoding {content_encoding!r} is not supported: remote-write bodies must be "
        f"snappy block compressed; send the body snappy-compressed with Content-Encoding: snappy"
    )


# --- snappy ----------------------------------------------------------------------------------


def decompress_snappy_block(body: bytes, max_decoded_bytes: int) -> memoryview:
    """Decompress a snappy *block*, checking its declared size before allocating anything."""
    if not body:
        raise InputError(
            "the request body is empty; send the snappy-compressed protobuf message as the body "
            "(even an empty request compresses to one byte, 0x00)"
        )
    if body.startswith(_FRAMED_SNAPPY_MAGIC):
        raise InputError(
            "the body is a framed snappy stream, but remote-write uses the snappy block format; "
            "compress with snappy's block API (Go: snappy.Encode, Python: "
            "cramjam.snappy.compress_raw), not the framed/stream writer"
        )
    declared = snappy_declared_length(body)
    if declared > max_decoded_bytes:
        raise TooLargeError(
            f"the snappy block declares {declared:,} decompressed bytes, over the limit of "
            f"{max_decoded_bytes:,}; send smaller batches (Prometheus: lower "
            f"queue_config.max_samples_per_send)"
        )
    if declared > _SNAPPY_MAX_RATIO * len(body) + 64:
        raise InputError(
            f"the snappy block declares {declared:,} decompressed bytes, more than a "
            f"{len(body):,}-byte block can hold: the body is truncated or not snappy block "
            f"compressed; send the whole body, compressed with the snappy block format"
        )
    try:
        raw = cramjam.snappy.decompress_raw(body)
    except Exception as exc:  # cramjam.DecompressionError, and anything else it may raise
        raise InputError(
            f"the body ({len(body):,} bytes) is not a valid snappy block: {exc}; it may be "
            f"truncated, framed, or sent uncompressed; send the whole message compressed with "
            f"the snappy block format and Content-Encoding: snappy"
        ) from exc
    view = memoryview(raw)
    if len(view) != declared:
        raise InputError(
            f"the snappy block declares {declared:,} bytes but holds {len(view):,}: the body "
            f"is corrupt; send it again, compressed with the snappy block format"
        )
    return view


def snappy_declared_length(body: bytes) -> int:
    """The decompressed size a snappy block declares in its header (read before anything is
    decompressed, so a limit can refuse a body without allocating it)."""
    length = 0
    for shift, byte in zip(range(0, 35, 7), body, strict=False):
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            if length > 0xFFFFFFFF:
                break
            return length
    raise InputError(
        f"the body does not start with a snappy block header (a varint of the decompressed "
        f"length; got {bytes(body[:5]).hex(' ')}): it is truncated or not snappy block "
        f"compressed; send the protobuf message compressed with the snappy block format"
    )
