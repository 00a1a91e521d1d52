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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.responses import Response

from hearth.api.http.sse import EventStreamResponse
from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.failover.retry import Retry
from hearth.gateway.fleet.pool import Lease, Node
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.protocols import Protocol, first_response, is_terminal, terminal_error
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.upstream.headers import passed_headers
from hearth.gateway.upstream.http import Answer, Stalled, within

log = logging.getLogger("hearth.gateway")

HEARTBEAT = b": keep-alive\n\n"

_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)":(\d+)')
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)":(\d+)')
_CREATED = re.compile(rb'"cache_creation_input_tokens":(\d+)')
_COMPLETION = re.compile(rb'"(?:completion_tokens|output_tokens)":(\d+)')
_RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]+)"')


@dataclass(slots=True)
class Scan:
    """What the gateway learns from an answer as it passes: usage and a Responses id."""

    responses: bool = False  # a Responses answer: look for its id and output
    cached: int | None = None
    prompt: int | None = None
    completion: int | None = None  # tokens generated (usage per key, api/http/key_usage.py)
    response_id: str | None = None
    output: list[Any] | None = None  # a Responses answer's output items (kept for chain failover)
    migrated: bool = False  # the answer was finished by another node than the one that began it
    anthropic_usage: bool = False  # `prompt` is Anthropic's input_tokens: the part not read from cache
    created: int = 0  # Anthropic's cache_creation_input_tokens

    @property
    def whole_prompt(self) -> int | None:
        """Every prompt token, cached or not (Anthropic's input_tokens leaves the cache out)."""
        if self.prompt is None or not self.anthropic_usage:
            return self.prompt
        return self.prompt + (self.cached or 0) + self.created

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
        if b'"cache_read_input_tokens"' in data:
            self.anthropic_usage = True
        if m := _CREATED.findall(data):
            self.created = int(m[-1])
        if m := _COMPLETION.findall(data):
            self.completion = int(m[-1])


class Broken(Exception):
    """The upstream stream failed (transport error, or it ended with no terminal event)."""


Release = Callable[[bool | None], None]  # the node's lease back, once: True ok, False failed, None neither
# A successful answer, with what was read from it and the lease of the node that ended it;
# False: it could not be recorded (the client gets the terminal error).
Finished = Callable[[Scan, Lease], Awaitable[bool]]


@dataclass(slots=True)
class Moved:
    """A continuation on another node: its answer (a 200 event stream) and its lease."""

    resp: Answer
    lease: Lease
    release: Release


Move = Callable[[Cut, Node], Awaitable[Moved | None]]  # continue the answer `cut` elsewhere than the node


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

    async def stream(self, resp: Answer, lease: Lease, alias: str, protocol: Protocol, started: float,
                     finished: Finished, release: Release, cut: Cut | None = None,
                     move: Move | None = None) -> Response:
        """The upstream's event stream as the client's. Raises Retry when it broke before the
        first byte (the lease already released); past it, `release` runs when the stream ends,
        and `finished` before the protocol's terminal event goes out (that event waits for it;
        if it says False the client gets the terminal error instead). A stream that breaks past
        the first byte goes on on another node (`move`, at most --migration-limit times) when
        `cut` can say what to send it (migration.py); else it ends with the terminal error."""
        node = lease.node
        events = _events(resp, node, self.clock, self.settings.stall_timeout_for(node.up))
        # The first read runs as a task so that waiting for it can time out (a heartbeat goes out)
        # without cancelling the read; every later read is awaited by the response body itself.
        first_read: asyncio.Task[list[bytes]] = asyncio.create_task(_next(events))

        async def abandon(events: AsyncGenerator[list[bytes], None], resp: Answer) -> None:
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
            await abandon(events, resp)
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name}: {e}") from e
        except StopAsyncIteration:  # closed without a single event: nothing reached the client, retry
            await abandon(events, resp)
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name} sent an empty stream") from None
        except BaseException:
            await abandon(events, resp)
            release(None)
            raise
        scan = Scan(responses=protocol == "responses")
        state: dict[str, Any] = {"terminal": None, "events": 0, "response": None, "moves": 0}

        def forward(batch: list[bytes], node: Node) -> list[bytes]:
            """The events of one upstream read as the client gets them (a continuation's
            rewritten by `cut`); `state["terminal"]` is set to the terminal event's place."""
            rename = renamer(node.up.models[alias], alias)
            out: list[bytes] = []
            for raw in batch:
                for event in cut.rewrite(rename(raw)) if cut is not None and state["moves"] else [rename(raw)]:
                    if cut is not None:
                        cut.feed(event)
                    scan.feed(event)
                    state["events"] += 1
                    if state["response"] is None and protocol == "responses":
                        state["response"] = first_response(event)
                    if state["terminal"] is None and is_terminal(protocol, event):
                        state["terminal"] = len(out)
                        if protocol == "responses":
                            scan.feed_response(event)
                    out.append(event)
            return out

        def joined(out: list[bytes]) -> bytes:
            return b"\n\n".join(out) + b"\n\n"

        async def body() -> AsyncIterator[bytes]:
            outcome: bool | None = None
            current, stream, upstream, done = lease, events, resp, release
            cut_at: float | None = None
            try:
                self.metrics.ttft.observe(time.monotonic() - started)
                batches: AsyncIterator[list[bytes]] = stream
                if first is None:  # a long prefill: keep the client's connection warm until it ends
                    while not first_read.done():
                        yield HEARTBEAT
                        await asyncio.wait((first_read,), timeout=self.settings.heartbeat)
                    batches = _chain(first_read, stream)
                else:
                    batches = _chain(None, stream, first)
                while True:
                    try:
                        async for batch in batches:
                            out = forward(batch, current.node)
                            if cut_at is not None and out:
                                self.metrics.stream_migration_seconds.observe(time.monotonic() - cut_at)
                                cut_at = None
                            at = state["terminal"]
                            if at is None:
                                if out:
                                    yield joined(out)
                                continue
                            if out[:at]:
                                yield joined(out[:at])
                            scan.migrated = state["moves"] > 0
                            if await finished(scan, current):
                                outcome = True
                                yield joined(out[at:])
                            else:
                                outcome = False
                                yield self._failed(protocol, state, "the node that wrote this answer failed before "
                                                   "the gateway could record it; send the turn again")
                            return
                        if protocol != "other":
                            raise Broken("the upstream closed the stream without its final event")
                        outcome = True
                        scan.migrated = state["moves"] > 0
                        await finished(scan, current)
                        return
                    except Broken as e:
                        log.warning("upstream %s broke mid-stream: %s", current.node.name, e)
                        cut_at = time.monotonic()
                        await abandon(stream, upstream)
                        done(False)
                        moved = await self._move(cut, move, state, current.node)
                        if moved is None:
                            outcome = None  # the failed node's lease is back already
                            phase = "after_first_event" if state["events"] else "before_first_event"
                            self.metrics.aborted.labels(phase).inc()
                            yield self._failed(protocol, state, f"the upstream node failed mid-stream ({e}); the "
                                               "partial answer above is all there is: send the turn again")
                            return
                        state["moves"] += 1
                        current, upstream, done = moved.lease, moved.resp, moved.release
                        stream = _events(upstream, current.node, self.clock,
                                         self.settings.stall_timeout_for(current.node.up))
                        batches = stream
            finally:
                await abandon(stream, upstream)
                done(outcome)

        # Later silences (a slow tool-call argument, a stalled node) get keep-alive comments from
        # the response itself.
        return EventStreamResponse(body(), headers=passed_headers(resp, node.name),
                                   heartbeat=self.settings.heartbeat, beat=HEARTBEAT)

    async def _move(self, cut: Cut | None, move: Move | None, state: dict[str, Any], failed: Node) -> Moved | None:
        """Another node's continuation of the answer, or None (nothing to continue with, the
        limit reached, or no node would)."""
        if cut is None or move is None:
            return None
        if state["moves"] >= self.settings.migration_limit:
            self.metrics.stream_migrations.labels("limit").inc()
            return None
        moved = await move(cut, failed)
        if moved is not None:
            self.metrics.stream_migrations.labels("continued").inc()
            log.info("the stream from %s continues on %s", failed.name, moved.lease.node.name)
        return moved

    @staticmethod
    def _failed(protocol: Protocol, state: dict[str, Any], message: str) -> bytes:
        return terminal_error(protocol, message, response=state["response"], sequence_number=state["events"])


async def _chain(first: asyncio.Task[list[bytes]] | None, rest: AsyncIterator[list[bytes]],
                 ready: list[bytes] | None = None) -> AsyncIterator[list[bytes]]:
    """The first read (a task, or already read), then the rest of the stream."""
    if ready is not None:
        yield ready
    elif first is not None:
        try:
            yield first.result()
        except StopAsyncIteration:
            raise Broken("the upstream closed the stream before its first event") from None
    async for batch in rest:
        yield batch


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
