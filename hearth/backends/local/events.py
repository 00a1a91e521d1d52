"""The local backend's run, from slot to events: wait for admission, turn the engine's token
outputs into ChatEvents, and pass the text through the output parsers (reasoning, tool calls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator

from hearth.backends.local.admission import ANON, AdmissionQueue, Claim
from hearth.chat.cancel import CancelToken
from hearth.chat.output import OutputParser
from hearth.chat.types import ChatEvent, Done, Finish, Started, TextDelta, Timings, Usage
from hearth.engine import Engine, EngineRequest
from hearth.engine.types import FinishReason, RequestOutput


async def admit(admission: AdmissionQueue, n: int, cancel: CancelToken | None, timeout: float | None,
                claim: Claim = ANON) -> bool:
    """Wait for `n` slots (the request's own time cap bounds the wait too); False if the run
    was cancelled while it waited."""
    if cancel is None:
        await admission.acquire(n, timeout, claim)
        return True
    if cancel.cancelled:
        return False
    loop = asyncio.get_running_loop()
    acquiring = asyncio.ensure_future(admission.acquire(n, timeout, claim))
    cancel.on_cancel(lambda: loop.call_soon_threadsafe(acquiring.cancel))
    try:
        await acquiring
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if cancel.cancelled and not (task and task.cancelling()):
            return False
        raise
    if cancel.cancelled:  # granted in the same instant it was cancelled
        admission.release(n, claim)
        return False
    return True


async def cancelled_while_queued(n_prompt: int, n: int) -> AsyncIterator[ChatEvent]:
    yield Started(n_prompt)
    for i in range(n):
        yield Finish(i, FinishReason.CANCELLED.value)
    yield Done(Usage(prompt_tokens=n_prompt))


async def engine_events(engine: Engine, ereq: EngineRequest,
                        cancel: CancelToken | None) -> AsyncGenerator[ChatEvent, None]:
    usage = Usage(prompt_tokens=len(ereq.prompt_tokens))
    started = False
    placed = first_token = last_token = 0.0
    chunks = 0  # prompt chunks its prefill took (counted by the engine, final by the first token)

    def watch_cancel() -> None:
        if cancel is not None:
            cancel.counting = True
            cancel.on_cancel(lambda: engine.abort(ereq.request_id))

    observe = None
    if cancel is not None:
        token = cancel
        generated = 0

        def observe(out: RequestOutput) -> None:
            """Every output as the engine hands it over, read or not: the count is exact even
            for the step in which an abort arrived, after the stream closed."""
            nonlocal generated
            for d in out.deltas:
                generated += len(d.token_ids)
            token.generated = generated
            if out.finished:
                token.counted()

    async for out in engine.generate(ereq, after_submit=watch_cancel, validated=True, observe=observe):
        now = time.monotonic()
        chunks = max(chunks, out.prefill_chunks)
        if not started:
            started, placed = True, now
            usage.cached_tokens = out.cached_tokens
            yield Started(out.prompt_tokens, out.cached_tokens)
        for d in out.deltas:
            if d.token_ids:
                first_token, last_token = first_token or now, now
            usage.completion_tokens += len(d.token_ids)
            if d.text or d.logprobs:
                yield TextDelta(d.index, d.text, d.logprobs, len(d.token_ids))
            if d.finish_reason is not None:
                yield Finish(d.index, d.finish_reason.value, d.stop_reason)
        if out.finished:
            usage.cache_write_tokens = out.cache_written
            timings = Timings(usage.cached_tokens, usage.prompt_tokens - usage.cached_tokens,
                              ((first_token or now) - placed) * 1000, usage.completion_tokens,
                              (last_token - first_token) * 1000, cache_tier=out.cache_tier,
                              prefill_chunks=chunks)
            yield Done(usage, error=out.error, timings=timings)


async def parsed(events: AsyncGenerator[ChatEvent, None],
                 parsers: list[OutputParser]) -> AsyncGenerator[ChatEvent, None]:
    """Engine text → reasoning, tool calls and text, per candidate."""
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                for out in parsers[ev.index].feed(ev.text, ev.logprobs, ev.n_tokens):
                    yield out
            elif isinstance(ev, Finish):
                for out in parsers[ev.index].finish(ev.reason, ev.stop_reason):
                    yield out
            else:
                yield ev
    finally:
        await events.aclose()


async def prefilled_usage(events: AsyncGenerator[ChatEvent, None], prefilled: int) -> AsyncGenerator[ChatEvent, None]:
    """A continued answer (`continue_final`): the `prefilled` tokens of its partial part at the
    prompt's end count as completion tokens, not prompt tokens (a cached prefix counts in the
    prompt it is part of, so at most the prompt)."""
    try:
        async for ev in events:
            if isinstance(ev, Started):
                prompt = max(0, ev.prompt_tokens - prefilled)
                ev = Started(prompt, min(ev.cached_tokens, prompt))
            elif isinstance(ev, Done):
                u = ev.usage
                prompt = max(0, u.prompt_tokens - prefilled)
                ev = Done(Usage(prompt, u.completion_tokens + (u.prompt_tokens - prompt), min(u.cached_tokens, prompt),
                                min(u.cache_write_tokens, prompt)), ev.error, ev.timings)
            yield ev
    finally:
        await events.aclose()
