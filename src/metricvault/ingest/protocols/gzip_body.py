"""Bounded gunzip for request bodies (line protocol, OTLP): inflated in chunks, so a gzip bomb
stops at ``limit`` bytes instead of filling memory; concatenated gzip members are read in turn."""

from __future__ import annotations

import zlib

from metricvault.errors import InputError, TooLargeError

CHUNK = 1 << 20


def gunzip(body: bytes, limit: int, too_large: str) -> bytes:
    """``body`` inflated; ``TooLargeError(too_large)`` past ``limit`` bytes, ``InputError``
    for a body that is not (complete) gzip."""
    out: list[bytes] = []
    total, data = 0, body
    try:
        while True:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            while not inflater.eof:
                chunk = inflater.decompress(data, min(CHUNK, limit + 1 - total))
                total += len(chunk)
                if total > limit:
                    raise TooLargeError(too_large)
                progress = bool(chunk) or len(inflater.unconsumed_tail) != len(data)
                data = inflater.unconsumed_tail
                out.append(chunk)
                if not progress:
                    break
            if not inflater.eof:
                raise InputError(
                    f"the gzip body ends early after {total} decompressed bytes (truncated "
                    "upload?); send the complete gzip stream"
                )
            data = inflater.unused_data
            if not data:
                return b"".join(out)
    except zlib.error as exc:
        raise InputError(
            f"the body is not valid gzip ({exc}); compress it with gzip or drop the "
            "'Content-Encoding: gzip' header"
        ) from exc
