"""Server-sent events and disconnect handling, shared by every protocol.

Both helpers watch the ASGI `receive` channel for `http.disconnect` while the work runs
and cancel the work the moment the client leaves, instead of noticing only at the next
write (which, during a long prefill, may be seconds away). Cancellation closes the event
stream, which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON. orjson, because one chunk per token is encoded on the event loop,
    which shares the CPU with llama.cpp's threads (stdlib json was ~1/6 of the loop's time per
    token); what orjson refuses (non-str keys) goes through the stdlib."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def sse_data(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def sse_event(event: str, obj: Any) -> bytes:
    return f"event: {event}\n".encode() + b"data: " + json_bytes(obj) + b"\n\n"


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


OnDisconnect = Callable[[], object] | None


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope, on_disconnect: OnDisconnect) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if on_disconnect is not None:
                on_disconnect()
            scope.cancel()
            return


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]],
                           on_disconnect: OnDisconnect = None) -> T:
    """Run `work()`; if the client disconnects first, cancel it and raise ClientGone.

    `work` runs in the calling task; a watcher task cancels that task when the disconnect
    arrives. Plain asyncio rather than an anyio task group: this runs once per request (twice
    for a non-streamed generation), and the group's scope, its task and its cancel cost ~0.3 ms
    of the event loop's CPU, on the machine's critical path for a small request (a one-input
    embedding, issue 37). A disconnect that arrives after `work` returned changes nothing."""
    task = asyncio.current_task()
    if task is None:  # not in a task (never so under an ASGI server): nothing to cancel
        return await work()
    state = [False, False]  # [work finished, the client left and the task was cancelled]

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if state[0]:
            return
        state[1] = True
        if on_disconnect is not None:
            on_disconnect()
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await work()
    except asyncio.CancelledError:
        if state[1] and task.uncancel() == 0:  # ours alone: anyone else's cancel goes on
            raise ClientGone() from None
        raise
    finally:
        state[0] = True
        watcher.cancel()


# Sent when a stream has been silent for the heartbeat interval (a long prefill, a tool call's
# arguments being gathered): an SSE comment, which every SSE parser skips. Anthropic's protocol
# has its own `ping` event, which its clients expect instead.
COMMENT_BEAT = b": keep-alive\n\n"


class _Sender:
    """Serializes body writes between the stream and its heartbeat task and remembers when
    the last one went out. After `close()` nothing more is written."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = asyncio.Lock()  # not anyio.Lock: that yields to the loop on every acquire, once per chunk
        self.last = time.monotonic()
        self.closed = False

    async def body(self, data: bytes) -> None:
        async with self._lock:
            if not self.closed:
                await self._send({"type": "http.response.body", "body": data, "more_body": True})
                self.last = time.monotonic()

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def beat_every(self, interval: float, beat: bytes) -> None:
        while not self.closed:
            await anyio.sleep(max(0.0, self.last + interval - time.monotonic()))
            if time.monotonic() - self.last >= interval:
                await self.body(beat)


class EventStreamResponse(Response):
    """Streams `chunks` as text/event-stream; stops on disconnect. `close` always runs at the
    end (even if `chunks` never started, when an async generator's own `finally` would not).
    The headers go out at once; then, whenever `heartbeat` seconds pass without a chunk, `beat`.
    A Response for the handlers' types; `Response.__init__` (a buffered body) is not used."""

    media_type = "text/event-stream"
    content_type = b"text/event-stream; charset=utf-8"  # a subclass streams another format (Ollama's NDJSON)

    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str] | None = None, *,
                 close: Callable[[], Awaitable[None]] | None = None, on_disconnect: OnDisconnect = None,
                 heartbeat: float | None = None, beat: bytes = COMMENT_BEAT) -> None:
        self.status_code = 200
        self.background = None
        self.chunks = chunks
        self.extra_headers = headers or {}
        self.close = close
        self.on_disconnect = on_disconnect
        self.heartbeat = heartbeat
        self.beat = beat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", self.content_type),
                   (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.extra_headers.items()]
        out = _Sender(send)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_disconnect, receive, tg.cancel_scope, self.on_disconnect)
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                if self.heartbeat:
                    tg.start_soon(out.beat_every, self.heartbeat, self.beat)
                async for chunk in self.chunks:
                    await out.body(chunk)
                await out.close()
                tg.cancel_scope.cancel()
        except OSError:  # the socket went away mid-write
            pass
        except BaseExceptionGroup as group:
            if not all(isinstance(e, OSError) for e in group.exceptions):
                raise
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.close is not None:
                await self.close()
