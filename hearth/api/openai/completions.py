"""POST /v1/completions: OpenAI's legacy Completions (a raw prompt, no chat template)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.run_options import SamplerFields, run_limits, shape, stop_fields
from hearth.api.openai.shapes import Chunks, generation_failed, timings_field, usage_dict
from hearth.backends.base import EventStream
from hearth.chat.cancel import CancelToken
from hearth.chat.types import (
    ChatEvent,
    CompletionRequest,
    Done,
    Finish,
    Started,
    TextDelta,
    Timings,
    TokenLogprob,
    Usage,
    new_id,
)
from hearth.errors import BadRequest, GenerationFailed
from hearth.http.auth import caller
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.http.sse import DONE

MAX_PROMPTS = 16


class CompletionIn(OpenBody, SamplerFields):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool = False
    n: int = Field(default=1, ge=1, le=16)
    max_tokens: int = Field(default=16, ge=1)  # null is this default too, as OpenAI's
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None


def prompts_of(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise BadRequest("prompt must not be empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def legacy_logprobs(lps: list[TokenLogprob], offset0: int) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = offset0
    for lp in lps:
        text = lp.token_bytes.decode("utf-8", errors="replace")
        tokens.append(text)
        token_lps.append(lp.logprob)
        tops.append({b.decode("utf-8", errors="replace"): v for _, b, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


async def merge(streams: list[EventStream], n: int) -> AsyncIterator[ChatEvent]:
    """Interleave the event streams of several prompts (n candidates each) into one, with
    candidate `i` of prompt `p` renumbered `p * n + i`. Closing the merged stream closes (and
    so cancels) every source."""
    queue: asyncio.Queue[tuple[int, ChatEvent | None]] = asyncio.Queue()

    async def pump(i: int, s: EventStream) -> None:
        try:
            async for ev in s:
                await queue.put((i, ev))
        finally:
            await s.aclose()
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            p, ev = await queue.get()
            if ev is None:
                remaining -= 1
            elif isinstance(ev, TextDelta | Finish):
                yield replace(ev, index=p * n + ev.index)
            else:
                yield ev
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def read_completion(data: dict[str, Any]) -> tuple[CompletionIn, list[str | list[int]]]:
    """A Completions body and its prompts, as generation reads them (POST
    /v1/prompt-cache/blocks reads it so too)."""
    body = validate(CompletionIn, data)
    if body.suffix:
        raise BadRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
    if body.echo and body.logprobs is not None:
        raise BadRequest("echo together with logprobs (prompt logprobs) is not supported", param="echo")
    prompts = prompts_of(body.prompt)
    if len(prompts) > MAX_PROMPTS:
        raise BadRequest(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    return body, prompts


async def completions(request: Request) -> Response:
    ctx = node(request)
    backend = ctx.backend
    body, prompts = read_completion(await read_json(request))
    model = backend.resolve(body.model)
    parallel = backend.limits(model).parallel
    if len(prompts) * body.n > parallel:
        # each prompt's candidates run at once; more than the slots could never all start
        raise BadRequest(f"{len(prompts)} prompts x n={body.n} need {len(prompts) * body.n} slots; this server "
                         f"runs {parallel} (--parallel)", param="prompt")
    sampling = body.sampling(max_tokens=body.max_tokens, logprobs=body.logprobs is not None,
                             top_logprobs=body.logprobs or 0)
    cid = new_id("cmpl-")
    limits = run_limits(ctx.settings, body)

    who = caller(request)
    namespace = who.namespace(body.cache_salt)
    tier = runs.run_class(who, limits.priority)

    async def open_stream(token: CancelToken) -> EventStream:
        # One engine request per prompt, merged; all of them share the run's cancel token.
        streams: list[EventStream] = []
        try:
            for i, p in enumerate(prompts):
                streams.append(await backend.complete(CompletionRequest(
                    model, p, sampling, n=body.n, request_id=f"{cid}-{i}", timeout=limits.timeout, cancel=token,
                    cache_prompt=body.cache_prompt, repetition=limits.repetition, cache_ns=namespace,
                    keep_alive=limits.keep_alive, tenant=who.tenant, weight=who.weight, priority=tier)))
        except BaseException:
            for s in streams:
                await s.aclose()
            raise
        return streams[0] if len(streams) == 1 else EventStream(merge(streams, body.n))

    registered: dict[str, Any] = {"cancel_id": body.cancel_id, "ids": [cid], "model": model}
    # A stream whose model must load starts at once (runs.opened_later), unless it echoes a prompt
    # of token ids: detokenizing that needs the model before the first chunk.
    echo_tokens = body.echo and any(not isinstance(p, str) for p in prompts)
    if body.stream and not echo_tokens and runs.must_load(backend, model):
        gen = runs.opened_later(request, "completions", open_stream, len(prompts) * body.n, registered)
    else:
        gen = await runs.start(request, "completions", open_stream, **registered)
    echoes = [(p if isinstance(p, str) else await backend.detokenize(model, p)) if body.echo else ""
              for p in prompts]
    created = int(time.time())
    events = gen.events
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return gen.stream(stream_chunks(EventStream(shape(events, body)), cid, model, created, body.n, echoes,
                                        body.logprobs is not None, include_usage))
    return JSONResponse(await gen.collect(
        request, lambda: collect(events, cid, model, created, body.n, echoes, body.logprobs is not None)))


async def collect(events: EventStream, cid: str, model: str, created: int,
                  n: int, echoes: list[str], want_logprobs: bool) -> dict[str, Any]:
    k = len(echoes) * n
    texts: list[list[str]] = [[echoes[i // n]] for i in range(k)]
    lps: list[list[TokenLogprob]] = [[] for _ in range(k)]
    reasons: list[Finish | None] = [None] * k
    totals = Totals()
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                texts[ev.index].append(ev.text)
                lps[ev.index].extend(ev.logprobs or [])
            elif isinstance(ev, Finish):
                reasons[ev.index] = ev
            elif isinstance(ev, Done):
                totals.add(ev)
                if ev.error:
                    raise GenerationFailed(ev.error)
    finally:
        await events.aclose()
    return {
        "id": cid, "object": "text_completion", "created": created, "model": model,
        "system_fingerprint": "hearth",
        "choices": [{"index": i, "text": "".join(texts[i]),
                     "logprobs": legacy_logprobs(lps[i], len(echoes[i // n])) if want_logprobs else None,
                     "finish_reason": f.reason if f else "stop",
                     **stop_fields(f)} for i, f in enumerate(reasons)],
        "usage": usage_dict(totals.usage),
        **timings_field(totals.timings),
    }


def add_timings(a: Timings | None, b: Timings | None) -> Timings | None:
    """Several prompts' timings as one: their tokens add up, they ran side by side."""
    if a is None or b is None:
        return a or b
    return Timings(a.cached_tokens + b.cached_tokens, a.prompt_tokens + b.prompt_tokens, max(a.prompt_ms, b.prompt_ms),
                   a.predicted_tokens + b.predicted_tokens, max(a.predicted_ms, b.predicted_ms),
                   prefill_chunks=a.prefill_chunks + b.prefill_chunks)


class Totals:
    """What several prompts' runs used, as one: usage and timings added up as each ends."""

    __slots__ = ("timings", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.timings: Timings | None = None

    def add(self, done: Done) -> None:
        self.usage.prompt_tokens += done.usage.prompt_tokens
        self.usage.completion_tokens += done.usage.completion_tokens
        self.usage.cached_tokens += done.usage.cached_tokens
        self.timings = add_timings(self.timings, done.timings)


async def stream_chunks(events: EventStream, cid: str, model: str, created: int,
                        n: int, echoes: list[str], want_logprobs: bool,
                        include_usage: bool) -> AsyncIterator[bytes]:
    chunk = Chunks(cid, "text_completion", created, model, include_usage)

    def finish_choice(ev: Finish) -> dict[str, Any]:
        return {"index": ev.index, "text": "", "logprobs": None, "finish_reason": ev.reason,
                **stop_fields(ev)}

    totals = Totals()
    k = len(echoes) * n
    finished = 0
    last_finish: Finish | None = None  # sent after every prompt's totals, with the timings
    offsets = [len(echoes[i // n]) for i in range(k)]
    try:
        for i, echo in enumerate(echoes):
            if echo:
                for j in range(n):
                    yield chunk([{"index": i * n + j, "text": echo, "logprobs": None, "finish_reason": None}])
        opened = any(echoes)
        async for ev in events:
            if isinstance(ev, Started) and not opened:  # the id goes out before the prefill ends
                opened = True
                yield chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": None}
                             for i in range(len(echoes) * n)])
            elif isinstance(ev, TextDelta):
                idx = ev.index
                lp = legacy_logprobs(ev.logprobs or [], offsets[idx]) if want_logprobs else None
                offsets[idx] += len(ev.text)
                yield chunk([{"index": idx, "text": ev.text, "logprobs": lp, "finish_reason": None}])
            elif isinstance(ev, Finish):
                finished += 1
                if finished < k:
                    yield chunk([finish_choice(ev)])
                else:
                    last_finish = ev
            elif isinstance(ev, Done):
                totals.add(ev)
                if ev.error:
                    yield generation_failed(ev.error)
        if last_finish is not None:
            yield chunk([finish_choice(last_finish)], extra=timings_field(totals.timings))
        if include_usage:
            yield chunk([], usage_dict(totals.usage))
        yield DONE
    finally:
        await events.aclose()
