"""A line protocol request body: its content encoding (identity or gzip, inflated in bounded
chunks), UTF-8 and NUL checks, and the line count limit."""

from __future__ import annotations

from metricvault.errors import InputError, TooLargeError, UnsupportedError
from metricvault.ingest.protocols.gzip_body import gunzip
from metricvault.ingest.protocols.influx_values import q


def decode_body(body: bytes, content_encoding: str | None, max_decoded_bytes: int) -> bytes:
    """The body as sent, or gunzipped; never more than ``max_decoded_bytes`` of it."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        if len(body) > max_decoded_bytes:
            raise TooLargeError(_too_large(f"the body is {len(body)} bytes", max_decoded_bytes))
        return body
    if encoding in ("gzip", "x-gzip"):
        return _gunzip(body, max_decoded_bytes)
    raise UnsupportedError(
        f"Content-Encoding {q(content_encoding)} is not supported for line protocol; "
        "send the body uncompressed or with 'Content-Encoding: gzip'"
    )


def _too_large(what: str, limit: int) -> str:
    return (
        f"{what}, more than the limit of {limit} bytes of line protocol per request "
        "(max_decoded_bytes); split the batch into smaller requests"
    )


def _gunzip(body: bytes, limit: int) -> bytes:
    return gunzip(body, limit, _too_large("the gzip body inflates to more", limit))


def utf8_text(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"line {number} is not valid UTF-8 (byte {raw[exc.start : exc.start + 1]!r} at "
            f"offset {exc.start}: {exc.reason}); line protocol is UTF-8 text — re-encode it"
        ) from exc
    nul = text.find("\x00")
    if nul >= 0:
        number = text.count("\n", 0, nul) + 1
        column = nul - text.rfind("\n", 0, nul)
        raise InputError(
            f"line {number} contains a NUL character at column {column}; line protocol is "
            "text — remove NUL characters from names and values"
        )
    return text


def check_line_count(lines: list[str], max_lines: int) -> None:
    count = 0
    for line in lines:
        stripped = line.strip(" \t\r")
        if stripped and stripped[0] != "#":
            count += 1
    if count > max_lines:
        raise TooLargeError(
            f"the body has {count} lines of line protocol, more than the limit of {max_lines} "
            "per request (max_lines); split the batch into smaller requests"
        )
