"""Reading request bodies within a limit, without ever holding more than the limit.

A body is refused on its `Content-Length` before a byte of it is read, and a body without one
(chunked) is read only up to the limit: a 400 MB upload costs nothing but its headers. JSON is
parsed by `hearth.jsonsafe` (bounded depth, values and valid Unicode); bodies past
INLINE_PARSE_BYTES are parsed in a worker thread so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from hearth import jsonsafe
from hearth.errors import BadRequest, PayloadTooLarge

MAX_JSON_BYTES = 32 * 1024 * 1024
INLINE_PARSE_BYTES = 256 * 1024


def declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError as e:
        raise BadRequest("Content-Length is not a number") from e
    if n < 0:
        raise BadRequest("Content-Length is negative")
    return n


def check_length(request: Request, limit: int, what: str = "request body") -> None:
    """Refuse before reading when the client says the body is larger than `limit`."""
    n = declared_length(request)
    if n is not None and n > limit:
        raise PayloadTooLarge(f"the {what} is {n} bytes; the limit is {limit} bytes")


async def stream_limited(request: Request, limit: int, what: str = "request body") -> AsyncIterator[bytes]:
    """The body's chunks, refusing it (413) as soon as it passes `limit`, whatever it declared."""
    check_length(request, limit, what)
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the {what} is larger than the limit of {limit} bytes")
        yield chunk


async def read_limited(request: Request, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole body, at most `limit` bytes. Cached on the request, so a second call (or
    Starlette's `request.body()`) returns the same bytes."""
    cached: bytes | None = getattr(request, "_body", None)
    if cached is not None:
        return cached
    buf = bytearray()
    async for chunk in stream_limited(request, limit):
        buf += chunk
    body = bytes(buf)
    request._body = body  # Starlette's own cache: request.body() now returns it
    return body


async def parse_json(body: bytes) -> Any:
    """`jsonsafe.loads` as a 400; large bodies in a worker thread."""
    try:
        if len(body) <= INLINE_PARSE_BYTES:
            return jsonsafe.loads(body)
        return await asyncio.to_thread(jsonsafe.loads, body)
    except jsonsafe.JSONRejected as e:
        raise BadRequest(f"the request body is not acceptable JSON: {e}") from e
