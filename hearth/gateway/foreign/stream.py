"""One answer streamed from an `openai`-kind upstream, as the node's protocol layer reads it:
its chunks become `ChatEvent`s; a cancel (or the time cap) closes the upstream response, which
stops the upstream's work, and the stream ends `cancelled` (`length` with stop reason `timeout`
for the cap, counted from the first generated token, as on a Hearth node, whose prefill is
never cut). A stream that breaks (transport error, stall, closed without a finish) goes on on
another upstream through `go_on` where it can (failover/openai.py), at most --migration-limit
times; else, and for an error the engine reports in-band, it ends with Finish(error) +
Done(error).

`held.ok` tells the stream's close how it ended (the lease's outcome)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx

from hearth.chat.cancel import CancelToken
from hearth.chat.types import (
    ChatEvent,
    Done,
    Finish,
    ReasoningDelta,
    Started,
    StopKind,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from hearth.gateway.failover.openai import Continuer, Echo, Held, joined_usage
from hearth.gateway.fleet.pool import Node, Pool
from hearth.gateway.foreign.wire import chunk_events, usage_of
from hearth.gateway.turn.watch import TurnWatch
from hearth.gateway.upstream.http import Answer, Stalled, lines_of, within

log = logging.getLogger("hearth.gateway")

# How long the close of a finished stream waits for the bytes after [DONE] (the body's end: the
# last chunk of a chunked body, usually in the same packet). The connection goes back to the
# client's pool only when its response was read to the end; closed before that, it is closed, and
# every request opened a new connection (issue 39 item 8: a third of the gateway's CPU at 64
# clients, and a socket in TIME_WAIT per request).
DRAIN_S = 1.0


class UpstreamError(Exception):
    """The engine reported an error in its stream."""


class Cut(Exception):
    """The stream ended without its finish."""


BROKEN = (httpx.HTTPError, ValueError, Cut, UpstreamError, Stalled, RuntimeError)


async def drained(lines: AsyncIterator[str]) -> None:
    """`lines` read to the end (at most DRAIN_S; what they say is not used), so that their
    connection can be kept alive; an error or the time running out only means it is not."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in lines:
                pass
    except (TimeoutError, httpx.HTTPError, Stalled):
        pass


@dataclass(slots=True)
class Account:
    """What the stream has produced so far, over all its parts (a continuation is a new part)."""

    usage: Usage = field(default_factory=Usage)  # the current part's report
    finished: set[int] = field(default_factory=set)  # choices that have their finish
    chunks: int = 0  # the current part's content chunks: its completion tokens when it reports no usage
    before: int = 0  # content chunks of the earlier parts (the partial answer a continuation was given)
    text: str = ""  # the answer's text so far (choice 0): what a continuation is given
    plain: bool = True  # only text so far: reasoning and tool calls are not continued
    moves: int = 0
    echo: Echo = field(default_factory=lambda: Echo(""))  # a continuation's repetition of the partial answer
    cut_at: float | None = None  # when the stream broke, until its continuation's first event
    cap: asyncio.TimerHandle | None = None  # the time cap, armed at the first generated token
    drain: AsyncIterator[str] | None = None  # the answer's lines past [DONE]: read to the end at the close

    def done(self, error: str | None = None) -> Done:
        return Done(joined_usage(self.usage, self.before, self.chunks), error=error)


@dataclass(slots=True)
class UpstreamStream:
    pool: Pool
    held: Held
    completion: bool  # /v1/completions chunks (else chat)
    cancel: CancelToken
    timeout: float | None
    choices: int
    go_on: Continuer | None
    spawn_close: Callable[[Answer], None]  # closes a response from outside the stream's task
    watch: TurnWatch | None = None  # the turn's ledger row and spans (foreign/turn.py): its failovers
    account: Account = field(default_factory=Account)  # what it produced so far (read at its close)

    async def events(self, resp: Answer) -> AsyncIterator[ChatEvent]:
        loop = asyncio.get_running_loop()
        node = self.held.node
        current = [resp]  # the response a cancel closes: the continuation's once there is one
        self.cancel.on_cancel(lambda: loop.call_soon_threadsafe(lambda: self.spawn_close(current[0])))
        acc = self.account
        try:
            yield Started(0)
            while True:
                try:
                    async for ev in self._part(acc, node, current[0], loop):
                        yield ev
                    if not acc.finished:
                        raise Cut("the upstream ended the stream without a finish reason")
                    self.held.ok = True
                    yield acc.done()
                    return
                except BROKEN as e:
                    if self.cancel.cancelled:
                        for ev in self._cancelled(acc):
                            yield ev
                        return
                    message = f"the upstream node {node.name} failed mid-stream: {e}"
                    moved = await self._continue(acc, node, current[0], e)
                    if moved is None:
                        yield Finish(0, "error")
                        yield acc.done(message)
                        return
                    log.info("the stream from %s continues on %s", node.name, moved.node.name)
                    current[0] = moved.resp
                    node = moved.node
                    if self.cancel.cancelled:  # it came while the continuation was opening
                        self.spawn_close(current[0])
        finally:
            if acc.cap is not None:
                acc.cap.cancel()
            if acc.drain is not None and self.held.ok:
                await drained(acc.drain)
            await current[0].aclose()

    async def _part(self, acc: Account, node: Node, resp: Answer,
                    loop: asyncio.AbstractEventLoop) -> AsyncIterator[ChatEvent]:
        """The events of one upstream answer, to its [DONE] (or its end)."""
        metrics = self.pool.metrics
        lines = within(lines_of(resp), self.pool.settings.stall_timeout_for(node.up))  # no stall cap unless set
        async for line in lines:
            node.last_bytes = self.pool.clock()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                acc.drain = lines
                return
            data = json.loads(payload)
            if isinstance(data, dict) and data.get("error"):
                raise UpstreamError(str(data["error"]))
            for ev in (e for raw in chunk_events(data, self.completion) for e in acc.echo.feed(raw)):
                if acc.cut_at is not None:
                    metrics.stream_migration_seconds.observe(time.monotonic() - acc.cut_at)
                    acc.cut_at = None
                if isinstance(ev, Finish):
                    acc.finished.add(ev.index)
                elif isinstance(ev, TextDelta | ReasoningDelta | ToolCallDelta):
                    if acc.cap is None and self.timeout:
                        acc.cap = loop.call_later(self.timeout, self.cancel.cancel, "timeout")
                    acc.chunks += 1
                    if isinstance(ev, TextDelta) and ev.index == 0:
                        acc.text += ev.text
                    else:
                        acc.plain = False
                yield ev
            acc.usage = usage_of(data) or acc.usage

    def _cancelled(self, acc: Account) -> Iterator[ChatEvent]:
        """The end of a cancelled stream: the time cap ends the output as max_tokens does
        ("length", named); a cancel ends every unfinished choice `cancelled`."""
        timed_out = self.cancel.reason == "timeout"
        for i in range(self.choices):
            if i not in acc.finished:
                yield Finish(i, "length", StopKind.TIMEOUT) if timed_out else Finish(i, "cancelled")
        yield acc.done()

    async def _continue(self, acc: Account, node: Node, resp: Answer, e: BaseException) -> _Moved | None:
        """The broken stream opened again on another upstream, or None: an in-band error is the
        engine's own answer, not a dead engine, and is not continued; nor is an answer with a
        finished choice, reasoning or tool calls, or one past the migration limit."""
        go_on = self.go_on
        if self.watch is not None and not isinstance(e, UpstreamError):  # the engine broke, not answered
            self.watch.broke(node.name, str(e) or type(e).__name__)
        if isinstance(e, UpstreamError) or go_on is None:
            self.held.ok = False
            return None
        if acc.finished or not acc.plain or acc.moves >= self.pool.settings.migration_limit:
            self.pool.metrics.stream_migrations.labels(
                "limit" if acc.plain and not acc.finished else "nothing_to_continue").inc()
            self.held.ok = False
            return None
        log.warning("upstream %s broke mid-stream: %s", node.name, e)
        acc.cut_at = time.monotonic()
        self.held.release(False)
        await resp.aclose()
        moved = await go_on.open(acc.text, acc.before + acc.chunks)
        if moved is None:
            return None
        self.held.lease, new, acc.echo = moved
        acc.moves += 1
        if self.watch is not None:
            self.watch.moved()
        acc.before, acc.chunks, acc.usage = acc.before + acc.chunks, 0, Usage()
        return _Moved(moved[0].node, new)


@dataclass(frozen=True, slots=True)
class _Moved:
    node: Node
    resp: Answer
