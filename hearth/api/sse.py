"""Server-sent events and disconnect handling, shared by every protocol.

Both helpers watch the ASGI `receive` channel for `http.disconnect` while the work runs
and cancel the work the moment the client leaves, instead of noticing only at the next
write (which, during a long prefill, may be seconds away). Cancellation closes the event
stream, which aborts the request in the engine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_event(event: str, obj: Any) -> bytes:
    return (f"event: {event}\n".encode() + b"data: "
            + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run `work()`; if the client disconnects first, cancel it and raise ClientGone."""
    result: list[T] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_disconnect, request.receive, tg.cancel_scope)
        result.append(await work())
        tg.cancel_scope.cancel()
    if not result:
        raise ClientGone()
    return result[0]


class EventStreamResponse:
    """Streams `chunks` as text/event-stream; stops (and closes the iterator) on disconnect."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> None:
        self.chunks = chunks
        self.headers = headers or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                   (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_disconnect, receive, tg.cancel_scope)
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        except OSError:  # the socket went away mid-write
            pass
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
