"""Compressed request bodies and messages, as Triton takes them: ``gzip`` and ``deflate``
(HTTP ``Content-Encoding``, gRPC ``grpc-encoding``), decompressed to at most the same
limit an uncompressed body has, so a small bomb is refused before it grows.
"""

from __future__ import annotations

import zlib

from milliserve.errors import MalformedRequestError, RequestTooLargeError, UnsupportedEncodingError

__all__ = ["ENCODINGS", "decompress"]

# what the server takes, as clients name them
ENCODINGS = ("identity", "gzip", "deflate")


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """``data`` decoded from ``encoding``. Raises UnsupportedEncodingError for another
    encoding, MalformedRequestError for a corrupt stream and RequestTooLargeError when the
    result would pass ``limit`` bytes."""
    if encoding == "identity":
        return data
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS  # the zlib format, as HTTP's deflate and tritonclient send it
    else:
        raise UnsupportedEncodingError(
            f"content encoding {encoding[:40]!r} is not supported; use one of {', '.join(ENCODINGS)}"
        )
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise MalformedRequestError(f"the {encoding} body cannot be decompressed: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise RequestTooLargeError(f"the decompressed body is over the limit of {limit} bytes")
    if not d.eof:
        raise MalformedRequestError(f"the {encoding} body is truncated")
    if d.unused_data:
        raise MalformedRequestError(f"the {encoding} body has {len(d.unused_data)} bytes after its end")
    return out
