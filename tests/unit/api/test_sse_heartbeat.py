"""Heartbeats on a silent stream: the headers go out at once, then a beat whenever nothing was
sent for the interval (a long prefill), never after the end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hearth.api.anthropic.stream import PING
from hearth.http.sse import COMMENT_BEAT, EventStreamResponse


async def drive(response: EventStreamResponse, sent: list[dict[str, Any]]) -> None:
    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client never leaves
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await response({"type": "http"}, receive, send)


async def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


async def test_beats_fill_the_silence_before_the_first_chunk_and_stop_at_the_end() -> None:
    release = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: opening\n\n"  # the opening event goes out at once
        await release.wait()  # ... then a long prefill
        yield b"data: token\n\n"

    sent: list[dict[str, Any]] = []
    task = asyncio.create_task(drive(EventStreamResponse(chunks(), heartbeat=0.05), sent))
    await wait_for(lambda: bodies(sent).count(COMMENT_BEAT) >= 3)
    assert sent[0]["type"] == "http.response.start" and bodies(sent)[0] == b"data: opening\n\n"
    release.set()
    await asyncio.wait_for(task, 10)
    out = bodies(sent)
    assert out[-2:] == [b"data: token\n\n", b""] and sent[-1]["more_body"] is False
    assert set(out[1:-2]) == {COMMENT_BEAT}


async def test_no_beat_while_chunks_keep_coming_and_none_without_an_interval() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"data: {i}\n\n".encode()

    for heartbeat in (30.0, None):
        sent: list[dict[str, Any]] = []
        await asyncio.wait_for(drive(EventStreamResponse(chunks(), heartbeat=heartbeat), sent), 10)
        assert COMMENT_BEAT not in bodies(sent) and len(bodies(sent)) == 6


async def test_anthropic_streams_beat_with_its_own_ping_event() -> None:
    release = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        await release.wait()
        yield b"event: message_stop\ndata: {}\n\n"

    sent: list[dict[str, Any]] = []
    task = asyncio.create_task(drive(EventStreamResponse(chunks(), heartbeat=0.05, beat=PING), sent))
    await wait_for(lambda: PING in bodies(sent))
    release.set()
    await asyncio.wait_for(task, 10)
    assert PING == b'event: ping\ndata: {"type":"ping"}\n\n'
