"""What a stream sends, before a protocol serializes it: fewer, larger deltas
(`stream_options.flush_every_n_tokens` / `flush_every_ms`) and reasoning held back
(`stream_thinking: false`). Both only regroup events, so the concatenated stream still
equals the non-streamed response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from hearth.chat.types import ChatEvent, ReasoningDelta, TextDelta, ToolCallDelta

Mergeable = TextDelta | ReasoningDelta | ToolCallDelta


def _merge(a: Mergeable, b: ChatEvent) -> Mergeable | None:
    """`a` and `b` as one event, or None if they cannot be one."""
    if isinstance(a, TextDelta) and isinstance(b, TextDelta) and a.index == b.index:
        lps = (a.logprobs or []) + (b.logprobs or []) if a.logprobs is not None or b.logprobs is not None else None
        return TextDelta(a.index, a.text + b.text, lps, a.n_tokens + b.n_tokens)
    if isinstance(a, ReasoningDelta) and isinstance(b, ReasoningDelta) and a.index == b.index:
        return ReasoningDelta(a.index, a.text + b.text, a.n_tokens + b.n_tokens)
    if (isinstance(a, ToolCallDelta) and isinstance(b, ToolCallDelta) and b.name is None
            and (a.index, a.call_index) == (b.index, b.call_index)):
        return replace(a, arguments=a.arguments + b.arguments)
    return None


def _tokens(ev: ChatEvent) -> int:
    # a tool call's pieces carry no token count: each counts as one
    return ev.n_tokens if isinstance(ev, TextDelta | ReasoningDelta) else 1


async def coalesce(events: AsyncIterator[ChatEvent], every_n: int | None, every_ms: float | None
                   ) -> AsyncIterator[ChatEvent]:
    """Hold deltas until `every_n` tokens or `every_ms` milliseconds have gathered since the
    last send (whichever comes first); the first delta and every non-delta event (finish,
    totals) go out at once, after what was held. A held delta is sent when its time is up
    even if the model sends nothing more meanwhile."""
    held: Mergeable | None = None
    n_held = 0
    last_sent: float | None = None  # None: no delta sent yet, the next one goes at once
    pending: asyncio.Future[ChatEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            if held is not None and every_ms is not None and last_sent is not None:
                wait = every_ms / 1000 - (time.monotonic() - last_sent)
                done, _ = await asyncio.wait({pending}, timeout=max(wait, 0))
                if not done:  # time is up: send what is held, keep waiting for the model
                    yield held
                    held, n_held, last_sent = None, 0, time.monotonic()
                    continue
            try:
                ev = await pending
            except StopAsyncIteration:
                break
            finally:
                pending = None if pending.done() else pending
            if not isinstance(ev, TextDelta | ReasoningDelta | ToolCallDelta):
                if held is not None:
                    yield held
                    held, n_held = None, 0
                yield ev
                continue
            merged = _merge(held, ev) if held is not None else None
            if held is not None and merged is None:  # a different kind of delta: send the held one
                yield held
                held, n_held, last_sent = None, 0, time.monotonic()
            held, n_held = merged or ev, n_held + _tokens(ev)
            due = last_sent is None or (every_n is not None and n_held >= every_n) or (
                every_ms is not None and (time.monotonic() - last_sent) * 1000 >= every_ms)
            if due:
                yield held
                held, n_held, last_sent = None, 0, time.monotonic()
        if held is not None:
            yield held
    finally:
        if pending is not None:  # let it finish cancelling: the generator cannot close while it runs
            pending.cancel()
            await asyncio.wait({pending})
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def hold_reasoning(events: AsyncIterator[ChatEvent]) -> AsyncIterator[ChatEvent]:
    """`stream_thinking: false`: each candidate's reasoning arrives whole, in one event, just
    before the first thing that follows it (its answer, a tool call or its finish), so
    protocols still place reasoning before the answer."""
    held: dict[int, ReasoningDelta] = {}
    try:
        async for ev in events:
            if isinstance(ev, ReasoningDelta):
                h = held.get(ev.index)
                held[ev.index] = ev if h is None else ReasoningDelta(ev.index, h.text + ev.text,
                                                                     h.n_tokens + ev.n_tokens)
                continue
            index = getattr(ev, "index", None)
            if index is not None and index in held:
                yield held.pop(index)
            elif index is None:  # totals: whatever is still held goes first
                for i in sorted(held):
                    yield held.pop(i)
            yield ev
        for i in sorted(held):
            yield held.pop(i)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
