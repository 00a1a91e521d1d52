"""An upstream's answer on its way to the client: relayed as it comes, renamed, and read in
passing.

Upstream streams are relayed read by read: the whole events of each read (split at the blank
line) in one write, never an event cut in two. Until the first event comes a heartbeat comment
goes out every `heartbeat` seconds (a long prefill), and the first of them counts as the first
byte: before it a broken stream is still retried on another node (`retry.Retry`); after it a
failure goes on on another node (failover/resume.py) or ends the stream with the protocol's
terminal error (protocols.py).

On the way, answers name the model as the client did (the alias, not the upstream's id), and a
`Scan` (scan.py) picks up what the gateway records: usage (cached and prompt tokens) and a Responses id
and output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.responses import Response

from hearth.gateway.failover.cuts import Cut
from hearth.gateway.failover.resume import Moved, Resumer
from hearth.gateway.failover.retry import Retry
from hearth.gateway.fleet.pool import Lease, Node, Release
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.protocols import (
    Protocol,
    first_response,
    is_ndjson,
    is_terminal,
    renamer,
    terminal_error,
)
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.turn.after import TurnEnd
from hearth.gateway.turn.scan import Scan
from hearth.gateway.upstream.headers import passed_headers
from hearth.gateway.upstream.http import Answer, Stalled, within
from hearth.http.sse import EventStreamResponse
from hearth.protocols.ollama_wire import ANSWER_ID_HEADER, NdjsonResponse

log = logging.getLogger("hearth.gateway")

HEARTBEAT = b": keep-alive\n\n"


class Broken(Exception):
    """The upstream stream failed (transport error, or it ended with no terminal event)."""


@dataclass(slots=True)
class RelayState:
    """One relayed stream as the client has it so far."""

    terminal: int | None = None  # the place of the terminal event in the current read's events
    events: int = 0  # events the client got
    response: dict[str, Any] | None = None  # a Responses stream's response (from response.created)
    moves: int = 0  # how often it went on on another node


@dataclass(slots=True)
class _First:
    """The first read of a stream: done within the first heartbeat (`ready`), or still running."""

    task: asyncio.Task[list[bytes]]
    ready: list[bytes] | None


class Relay:
    """Relays upstream answers to the client; one per gateway."""

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock

    def whole(self, content: bytes, node: Node, alias: str, protocol: Protocol,
              answer_id: str | None = None) -> tuple[bytes, Scan]:
        """A non-streamed successful answer: renamed, and what it says (`answer_id`: as its node
        named it in `ANSWER_ID_HEADER`)."""
        content = renamer(node.up.models[alias], alias, protocol)(content)
        scan = Scan(responses=protocol == "responses")
        scan.named(answer_id)
        scan.feed(content)
        if protocol == "responses":
            scan.feed_response(content)
        return content, scan

    async def stream(self, resp: Answer, lease: Lease, alias: str, protocol: Protocol, started: float,
                     end: TurnEnd, release: Release, cut: Cut | None = None,
                     resumer: Resumer | None = None) -> Response:
        """The upstream's event stream as the client's. Raises Retry when it broke before the
        first byte (the lease already released); past it, `release` runs when the stream ends,
        and `end.record` before the protocol's terminal event goes out (that event waits for it;
        if it says False the client gets the terminal error instead). A stream that breaks past
        the first byte goes on on another node (`resumer`, at most --migration-limit times) when
        `cut` can say what to send it (failover/cuts/); else it ends with the terminal error."""
        node = lease.node
        ndjson = is_ndjson(protocol)
        events = _events(resp, node, self.clock, self.settings.stall_timeout_for(node.up), ndjson)
        # The first read runs as a task so that waiting for it can time out (a heartbeat goes out)
        # without cancelling the read; every later read is awaited by the response body itself.
        # NDJSON has no comment line to beat with: its first line is awaited whole, so a failure
        # before it is still retried elsewhere (a long prefill sends nothing, as Ollama does).
        first_read: asyncio.Task[list[bytes]] = asyncio.create_task(_next(events))
        try:  # before the first byte: a failure here is still retried elsewhere
            await asyncio.wait((first_read,), timeout=None if ndjson else self.settings.heartbeat)
            first = _First(first_read, first_read.result() if first_read.done() else None)
        except Broken as e:
            await _abandon(first_read, events, resp)
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name}: {e}") from e
        except StopAsyncIteration:  # closed without a single event: nothing reached the client, retry
            await _abandon(first_read, events, resp)
            release(False)
            raise Retry("broken_before_first_byte", f"{node.name} sent an empty stream") from None
        except BaseException:
            await _abandon(first_read, events, resp)
            release(None)
            raise
        body = self._body(first, events, resp, lease, release, alias, protocol, started, end, cut, resumer)
        if ndjson:
            return NdjsonResponse(body, headers=passed_headers(resp, node.name))
        # Later silences (a slow tool-call argument, a stalled node) get keep-alive comments from
        # the response itself.
        return EventStreamResponse(body, headers=passed_headers(resp, node.name),
                                   heartbeat=self.settings.heartbeat, beat=HEARTBEAT)

    async def _body(self, first: _First, stream: AsyncGenerator[list[bytes], None], upstream: Answer,
                    current: Lease, done: Release, alias: str, protocol: Protocol, started: float,
                    end: TurnEnd, cut: Cut | None, resumer: Resumer | None) -> AsyncIterator[bytes]:
        scan = Scan(responses=protocol == "responses")
        scan.named(upstream.headers.get(ANSWER_ID_HEADER))  # Ollama's: its objects carry no id
        state = RelayState()
        joined = _lines if is_ndjson(protocol) else _joined

        outcome: bool | None = None
        cut_at: float | None = None
        watch = end.turn.watch
        gone = False  # the client left before the end
        failed: str | None = None
        try:
            self.metrics.ttft.observe(time.monotonic() - started)
            if watch is not None:
                watch.relayed()
            batches: AsyncIterator[list[bytes]] = _chain(first.task if first.ready is None else None, stream,
                                                         first.ready)  # lazy: runs once the loop below reads it
            if first.ready is None:  # a long prefill: keep the client's connection warm until it ends
                while not first.task.done():
                    yield HEARTBEAT
                    await asyncio.wait((first.task,), timeout=self.settings.heartbeat)
            while True:
                try:
                    async for batch in batches:
                        out = _forward(batch, current.node, alias, protocol, cut, scan, state)
                        if cut_at is not None and out:
                            self.metrics.stream_migration_seconds.observe(time.monotonic() - cut_at)
                            cut_at = None
                        at = state.terminal
                        if at is None:
                            if out:
                                yield joined(out)
                            continue
                        if out[:at]:
                            yield joined(out[:at])
                        scan.migrated = state.moves > 0
                        outcome = await end.record(scan, current)
                        if not outcome:
                            failed = "the node that wrote this answer failed before the gateway could record it"
                        yield joined(out[at:]) if outcome else self._failed(
                            protocol, state, "the node that wrote this answer failed before the gateway could "
                            "record it; send the turn again")
                        return
                    if protocol != "other":
                        raise Broken("the upstream closed the stream without its final event")
                    outcome = True
                    scan.migrated = state.moves > 0
                    await end.record(scan, current)
                    return
                except Broken as e:
                    cut_at = time.monotonic()
                    await _abandon(first.task, stream, upstream)
                    done(False)
                    if watch is not None:
                        watch.broke(current.node.name, str(e))
                    moved = await self._resume(e, current.node, state, cut, resumer)
                    if moved is None:
                        outcome = None  # the failed node's lease is back already
                        failed = f"the upstream node failed mid-stream ({e})"
                        yield self._failed(protocol, state, f"the upstream node failed mid-stream ({e}); the "
                                           "partial answer above is all there is: send the turn again")
                        return
                    state.moves += 1
                    scan.moved(moved.lease.node.name, moved.resp.headers.get(ANSWER_ID_HEADER))
                    if watch is not None:
                        watch.moved()
                    current, upstream, done = moved.lease, moved.resp, moved.release
                    stream = _events(upstream, current.node, self.clock,
                                     self.settings.stall_timeout_for(current.node.up), is_ndjson(protocol))
                    batches = stream
        except (GeneratorExit, asyncio.CancelledError):
            gone = outcome is None and failed is None
            raise
        finally:
            await _abandon(first.task, stream, upstream)
            done(outcome)
            if watch is not None:
                watch.finish(scan, 200, cancelled="disconnect" if gone else None, error=failed)

    async def _resume(self, e: Broken, failed: Node, state: RelayState, cut: Cut | None,
                      resumer: Resumer | None) -> Moved | None:
        """The stream broke past the first byte: its continuation on another node, or None (the
        client then gets the protocol's terminal error)."""
        log.warning("upstream %s broke mid-stream: %s", failed.name, e)
        moved = await resumer.move(cut, failed, state.moves) if cut is not None and resumer is not None else None
        if moved is None:
            self.metrics.aborted.labels("after_first_event" if state.events else "before_first_event").inc()
        return moved

    @staticmethod
    def _failed(protocol: Protocol, state: RelayState, message: str) -> bytes:
        return terminal_error(protocol, message, response=state.response, sequence_number=state.events)


def _joined(out: list[bytes]) -> bytes:
    return b"\n\n".join(out) + b"\n\n"


def _lines(out: list[bytes]) -> bytes:
    return b"\n".join(out) + b"\n"


async def _abandon(first_read: asyncio.Task[list[bytes]], events: AsyncGenerator[list[bytes], None],
                   resp: Answer) -> None:
    first_read.cancel()
    with contextlib.suppress(BaseException):
        await first_read
    with contextlib.suppress(Exception):
        await events.aclose()
    await resp.aclose()


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
                  stall: float | None = None, ndjson: bool = False) -> AsyncGenerator[list[bytes], None]:
    """Upstream bytes → the whole SSE events (without their blank line) of each read, never an
    event cut in two; `ndjson`: the whole lines (without their newline). A transport failure, or
    `stall` seconds without a byte, raises Broken (only the read is timed: a slow client holding
    up the relay is not the upstream stalling). Every read marks the node as alive
    (`Node.last_bytes`)."""
    buf = b""
    sep = b"\n" if ndjson else b"\n\n"
    try:
        async for chunk in within(resp.aiter_raw(), stall):
            node.last_bytes = clock()
            buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
            end = buf.rfind(sep)
            if end < 0:
                continue
            whole, buf = buf[:end], buf[end + len(sep):]
            batch = [e for e in whole.split(sep) if e]
            if batch:
                yield batch
    except httpx.HTTPError as e:
        raise Broken(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
    except Stalled as e:
        raise Broken(str(e)) from e


def _forward(batch: list[bytes], node: Node, alias: str, protocol: Protocol, cut: Cut | None, scan: Scan,
             state: RelayState) -> list[bytes]:
    """The events of one upstream read as the client gets them (a continuation's rewritten by
    `cut`); `state.terminal` is set to the terminal event's place."""
    rename = renamer(node.up.models[alias], alias, protocol)
    out: list[bytes] = []
    for raw in batch:
        if state.moves and scan.part_looks < 3:
            scan.feed_part(raw)  # the continuation's own id: its node's ledger row (turn/settle.py)
        for event in cut.rewrite(rename(raw)) if cut is not None and state.moves else [rename(raw)]:
            if cut is not None:
                cut.feed(event)
            scan.feed(event)
            state.events += 1
            if state.response is None and protocol == "responses":
                state.response = first_response(event)
            if state.terminal is None and is_terminal(protocol, event):
                state.terminal = len(out)
                if protocol == "responses":
                    scan.feed_response(event)
            out.append(event)
    return out
