"""An upstream's answer on its way to the client: relayed as it comes, renamed, and read in
passing.

Upstream streams are relayed read by read: the whole events of each read (split at the blank
line) in one write, never an event cut in two. Until the first event comes a heartbeat comment
goes out every `heartbeat` seconds (a long prefill), and the first of them counts as the first
byte: before it a broken stream is still retried on another node (`retry.Retry`); after it a
failure ends the stream with the protocol's terminal error (`terminal.py`).

On the way, answers name the model as the client did (the alias, not the upstream's id), and a
`Scan` picks up what the gateway records: usage (cached and prompt tokens) and a Responses id
and output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.responses import Response

from hearth.api.http.sse import EventStreamResponse
from hearth.gateway.config import GatewaySettings
from hearth.gateway.headers import passed_headers
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.pool import Node
from hearth.gateway.retry import Retry
from hearth.gateway.terminal import Protocol, first_response, is_terminal, terminal_error
from hearth.gateway.upstream_http import Answer, Stalled, within

log = logging.getLogger("hearth.gateway")

HEARTBEAT = b": keep-alive\n\n"

_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)":(\d+)')
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)":(\d+)')
_RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]+)"')


@dataclass(slots=True)
class Scan:
    """What the gateway learns from an answer as it passes: usage and a Responses id."""

    responses: bool = False  # a Responses answer: look for its id and output
    cached: int | None = None
    prompt: int | None = None
    response_id: str | None = None
    output: list[Any] | None = None  # a Responses answer's output items (kept for chain failover)

    def feed_response(self, data: bytes) -> None:
        """A Responses answer: the whole JSON (non-streamed) or its terminal event."""
        if data.startswith(b"event: "):
            if not data.startswith((b"event: response.completed", b"event: response.incomplete")):
                return
            data = data.split(b"data: ", 1)[-1]
        try:
            doc = json.loads(data)
        except ValueError:
            return
        r = doc.get("response", doc) if isinstance(doc, dict) else None
        if isinstance(r, dict) and r.get("status") in ("queued", "in_progress"):
            return  # a background response as it starts: its output is not known yet
        if isinstance(r, dict) and isinstance(r.get("output"), list):
            self.output = r["output"]

    def feed(self, data: bytes) -> None:
        if self.responses and self.response_id is None and (r := _RESPONSE_ID.search(data)):
            self.response_id = r.group(1).decode()
        if b'"usage"' not in data:  # most events: text deltas
            return
        if m := _CACHED.findall(data):
            self.cached = int(m[-1])
        if m := _PROMPT.findall(data):
            self.prompt = int(m[-1])


class Broken(Exception):
    """The upstream stream failed (transport error, or it ended with no terminal event)."""


Release = Callable[[bool | None], None]  # the node's lease back, once: True ok, False failed, None neither
Finished = Callable[[Scan], None]  # a successful answer, with what was read from it


class Relay:
    """Relays upstream answers to the client; one per gateway."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock

    def whole(self, content: bytes, node: Node, alias: str, protocol: Protocol) -> tuple[bytes, Scan]:
        """A non-streamed successful answer: renamed, and what it says."""
        content = renamer(node.up.models[alias], alias)(content)
        scan = Scan(responses=protocol == "responses")
        scan.feed(content)
        if protocol == "responses":
            scan.feed_response(content)
        return content, scan

    async def stream(self, resp: Answer, node: Node, alias: str, protocol: Protocol, started: float,
                     finished: Finished, release: Release) -> Response:
        """The upstream's event stream as the client's. Raises Retry when it broke before the
        first byte (the lease already released); past it, `release` runs when the stream ends,
        and `finished` when it ended with its protocol's terminal event."""
        events = _events(resp, node, self.clock, self.settings.stall_timeout_for(node.up))
        # The first read runs as a task so that waiting for it can time out (a heartbeat goes out)
        # without cancelling the read; every later read is awaited by the response body itself.
        first_read: asyncio.Task[list[bytes]] = asyncio.create_task(_next(events))

        async def abandon() -> None:
            first_read.cancel()
            with contextlib.suppress(BaseException):
                await first_read
            with contextlib.suppress(Exception):
                await events.aclose()
            await resp.aclose()

        try:  # before the first byte: a failure here is still retried elsewhere
            await asyncio.wait((first_read,), timeout=self.settings.heartbeat)
            first = first_read.result() if first_read.done() else None
        except Broken as e:
            await abandon()
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name}: {e}") from e
        except StopAsyncIteration:  # closed without a single event: nothing reached the client, retry
            await abandon()
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name} sent an empty stream") from None
        except BaseException:
            await abandon()
            release(None)
            raise
        scan = Scan(responses=protocol == "responses")
        state: dict[str, Any] = {"terminal": False, "events": 0, "response": None}
        rename = renamer(node.up.models[alias], alias)

        def forward(batch: list[bytes]) -> bytes:
            """The events of one upstream read, relayed as one write."""
            out = []
            for event in batch:
                event = rename(event)
                scan.feed(event)
                state["events"] += 1
                if state["response"] is None and protocol == "responses":
                    state["response"] = first_response(event)
                if is_terminal(protocol, event):
                    state["terminal"] = True
                    if protocol == "responses":
                        scan.feed_response(event)
                out.append(event)
            return b"\n\n".join(out) + b"\n\n"

        async def body() -> AsyncIterator[bytes]:
            outcome: bool | None = None
            try:
                self.metrics.ttft.observe(time.monotonic() - started)
                if first is None:  # a long prefill: keep the client's connection warm until it ends
                    while not first_read.done():
                        yield HEARTBEAT
                        await asyncio.wait((first_read,), timeout=self.settings.heartbeat)
                    try:
                        yield forward(first_read.result())
                    except StopAsyncIteration:
                        raise Broken("the upstream closed the stream before its first event") from None
                else:
                    yield forward(first)
                async for batch in events:
                    yield forward(batch)
                if not state["terminal"] and protocol != "other":
                    raise Broken("the upstream closed the stream without its final event")
                outcome = True
                finished(scan)
            except Broken as e:
                outcome = False
                phase = "after_first_event" if state["events"] else "before_first_event"
                self.metrics.aborted.labels(phase).inc()
                log.warning("upstream %s broke mid-stream: %s", node.name, e)
                yield terminal_error(protocol, f"the upstream node failed mid-stream ({e}); the partial "
                                     "answer above is all there is: send the turn again",
                                     response=state["response"], sequence_number=state["events"])
            finally:
                await abandon()
                release(outcome)

        # Later silences (a slow tool-call argument, a stalled node) get keep-alive comments from
        # the response itself.
        return EventStreamResponse(body(), headers=passed_headers(resp, node.name),
                                   heartbeat=self.settings.heartbeat, beat=HEARTBEAT)


async def _next(events: AsyncIterator[list[bytes]]) -> list[bytes]:
    return await anext(events)


async def _events(resp: Answer, node: Node, clock: Callable[[], float],
                  stall: float | None = None) -> AsyncGenerator[list[bytes], None]:
    """Upstream bytes → the whole SSE events (without their blank line) of each read, never an
    event cut in two. A transport failure, or `stall` seconds without a byte, raises Broken
    (only the read is timed: a slow client holding up the relay is not the upstream stalling).
    Every read marks the node as alive (`Node.last_bytes`)."""
    buf = b""
    try:
        async for chunk in within(resp.aiter_raw(), stall):
            node.last_bytes = clock()
            buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
            end = buf.rfind(b"\n\n")
            if end < 0:
                continue
            whole, buf = buf[:end], buf[end + 2:]
            batch = [e for e in whole.split(b"\n\n") if e]
            if batch:
                yield batch
    except httpx.HTTPError as e:
        raise Broken(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
    except Stalled as e:
        raise Broken(str(e)) from e


def renamer(upstream_id: str, alias: str) -> Callable[[bytes], bytes]:
    """Answers name the model as the client did (the alias), not the upstream's id."""
    if upstream_id == alias:
        return lambda data: data
    old = b'"model":' + json.dumps(upstream_id).encode()
    new = b'"model":' + json.dumps(alias).encode()
    return lambda data: data.replace(old, new)
