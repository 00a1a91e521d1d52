"""OpenAI's Responses API: POST /v1/responses (streaming and not), and the stored responses
behind GET / DELETE /v1/responses/{id} and POST /v1/responses/{id}/cancel.

Input items (item references resolved from the store) → ChatRequest (responses_input),
ChatEvents → response object and stream events (responses_stream), responses, their input
items and an index of their output items in SQLite (responses_store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.run_options import ConversationFields, OpenAIRunFields, SessionFields, run_limits, shape
from hearth.api.openai import responses_background as background
from hearth.api.openai.responses_store import ScopedResponses, valid_id
from hearth.api.openai.responses_stream import ResponseAssembler, collect, sse_events
from hearth.chat.types import ChatRequest, Message, new_id
from hearth.config import Settings
from hearth.errors import BadRequest, GenerationFailed, HearthError, NotFound
from hearth.http.auth import caller
from hearth.http.cache_keys import body_key
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.http.sse import EventStreamResponse, until_disconnect
from hearth.protocols.responses_input import (
    ToolSet,
    check_call_outputs,
    check_metadata,
    normalize_input,
    partial_message,
    resolve_references,
    split_partial,
    to_messages,
    to_reasoning,
    to_response_format,
    to_tool_choice,
    to_tools,
)
from hearth.protocols.responses_log import KEEP_AFTER_END, EventsExpired, stream_query

log = logging.getLogger("hearth.api")

CANCEL_SETTLE_SECONDS = 5.0  # how long POST .../cancel waits for the run to record its outcome


# With a session_id, input holds only the new items.
class ResponsesIn(OpenBody, OpenAIRunFields, SessionFields, ConversationFields):
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None
    background: bool = False
    conversation: Any = None
    # The input ends with the assistant's partial output, to be continued (docs/api.md)
    continue_final_message: bool = False
    # Hearth's own, set by the gateway's stream continuation (gateway/failover/cuts/): the final
    # assistant message is this answer's own output so far, counted in max_tokens and in the
    # output tokens. A client's prefill is input: max_tokens bounds the new tokens (docs/api.md).
    partial_is_output: bool = False


def stored_responses(request: Request) -> ScopedResponses:
    """The stored responses the request's caller sees (its tenant's; all of them for the admin)."""
    return ScopedResponses(node(request).responses, caller(request))


def _history(body: ResponsesIn, store: ScopedResponses) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    items = store.chain(body.previous_response_id) if valid_id(body.previous_response_id) else None
    if items is None:
        raise NotFound(f"no stored response with id {body.previous_response_id!r}", param="previous_response_id")
    return items


def _check_unsupported(body: ResponsesIn) -> None:
    if body.session_id is not None and body.previous_response_id is not None:
        raise BadRequest("give session_id or previous_response_id, not both: each carries the conversation",
                         param="session_id")
    if body.background and not body.store:
        raise BadRequest("background responses must be stored: background requires store to be true",
                         param="background")
    if body.conversation is not None:
        raise BadRequest("conversations are not supported; use previous_response_id", param="conversation")


@dataclass(frozen=True, slots=True)
class Read:
    """A Responses body as generation reads it: the ChatRequest and what the response echoes."""

    body: ResponsesIn
    creq: ChatRequest
    items: list[Any]  # the input items, references resolved (stored with the response)
    toolset: ToolSet
    text_echo: dict[str, Any]
    reasoning_echo: dict[str, Any] | None
    metadata: dict[str, str]


def read_response(data: dict[str, Any], store: ScopedResponses, request_id: str, settings: Settings) -> Read:
    """A Responses body → ChatRequest, every check generation makes before it runs (POST
    /v1/prompt-cache/blocks reads it so too)."""
    body = validate(ResponsesIn, data)
    _check_unsupported(body)
    items = resolve_references(normalize_input(body.input), store.item)
    history = _history(body, store)
    toolset = to_tools(body.tools)
    if toolset.left_out:
        log.debug("responses: tools the server cannot run, left out of the prompt: %s", toolset.left_out)
    messages = [Message("system", body.instructions)] if body.instructions else []
    messages += to_messages(history, "previous_response", toolset)
    if body.continue_final_message:
        before, tail = split_partial(items)
        messages += [*to_messages(before, tools=toolset), partial_message(tail, toolset, offset=len(before))]
    else:
        messages += to_messages(items, tools=toolset)
    if body.session_id is None:  # in a session, the calls answered are in its transcript
        check_call_outputs(history, items)
    if not any(m.role != "system" for m in messages):
        raise BadRequest("input is empty: give at least one message", param="input")
    response_format, text_echo = to_response_format(body.text)
    reasoning, reasoning_echo = to_reasoning(body.reasoning)
    metadata = check_metadata(body.metadata)
    sampling = body.sampling(max_tokens=body.max_output_tokens)
    tool_choice = to_tool_choice(body.tool_choice, toolset)
    limits = run_limits(settings, body)
    creq = ChatRequest(
        model=body.model or "", messages=messages, sampling=sampling, tools=toolset.tools, tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls, response_format=response_format, reasoning=reasoning,
        request_id=request_id, timeout=limits.timeout, cache_prompt=body.cache_prompt, repetition=limits.repetition,
        keep_alive=limits.keep_alive, session=body.session_turn(), lenient_tool_calls=limits.lenient_tool_calls,
        cache_key=body_key(body.prompt_cache_key), continue_final=body.continue_final_message,
        cache_salt=body.cache_salt, partial_is_output=body.partial_is_output, priority=limits.priority)
    return Read(body, creq, items, toolset, text_echo, reasoning_echo, metadata)


async def create_response(request: Request) -> Response:
    ctx = node(request)
    store = stored_responses(request)
    read = read_response(await read_json(request), store, new_id("resp_"), ctx.settings)
    body, creq, items, toolset, metadata = read.body, read.creq, read.items, read.toolset, read.metadata
    text_echo, reasoning_echo, sampling, rid = read.text_echo, read.reasoning_echo, creq.sampling, creq.request_id
    model = ctx.backend.resolve(creq.model)

    asm = ResponseAssembler({
        "id": rid, "object": "response", "created_at": int(time.time()), "model": model,
        "instructions": body.instructions, "metadata": metadata, "tools": toolset.echo,
        "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": body.parallel_tool_calls,
        "temperature": sampling.temperature, "top_p": sampling.top_p, "max_output_tokens": body.max_output_tokens,
        "text": text_echo, "reasoning": reasoning_echo, "previous_response_id": body.previous_response_id,
        "store": body.store, "background": body.background, "truncation": "disabled", "completed_at": None,
        # the class it runs in, as OpenAI echoes the tier that served it (hearth.engine.fair_share)
        "service_tier": runs.run_class(caller(request), creq.priority),
    }, namespaced=toolset.namespaced)

    # Stored as in_progress before the wait for a slot, so GET and .../cancel see a queued run.
    settled = ctx.responses_settled
    if body.store:  # a background one is `queued` until admitted (responses_background)
        store.put({**asm.response, "status": "queued"} if body.background else asm.response, items)
        settled[rid] = asyncio.Event()

    def settle() -> None:
        event = settled.pop(rid, None)
        if event is not None:
            event.set()

    def save(response: dict[str, Any]) -> None:
        if body.store:
            store.update(response)
            settle()

    if body.background:
        return await _background(request, runs.keyed(request, creq), body, asm, settle)
    try:
        gen = await runs.start_chat(request, "responses", creq, body.cancel_id, stream=bool(body.stream))
    except BaseException:
        if body.store:  # the client got an error, not a response: nothing to keep
            store.delete(rid)
            settle()
        raise
    if body.stream:
        return gen.stream(sse_events(shape(gen.events, body), asm, save))
    try:
        response = await gen.collect(request, lambda: collect(gen.events, asm))
    finally:
        asm.finish()  # no-op unless the client left
        save(asm.response)  # a failed run is stored as failed: GET shows it
    if asm.error:
        raise GenerationFailed(asm.error)
    return JSONResponse(response)


async def _background(request: Request, creq: ChatRequest, body: ResponsesIn, asm: ResponseAssembler,
                      settle: Callable[[], None]) -> Response:
    """A background run (responses_background): answered once admitted, or with its refusal."""
    ctx = node(request)
    launched = background.launch(ctx, creq, body.cancel_id, asm, settle, caller(request))
    try:  # a client that leaves now leaves the run to itself (ClientGone: nobody to answer)
        admitted = await until_disconnect(request, lambda: asyncio.shield(launched.admitted))
    except HearthError:
        stored_responses(request).delete(creq.request_id)  # the client got an error, not a response: nothing to keep
        raise
    if body.stream:
        return EventStreamResponse(launched.log.follow(), heartbeat=ctx.settings.sse_heartbeat)
    return JSONResponse(admitted)


def _not_found(rid: str) -> NotFound:
    return NotFound(f"no stored response with id {rid!r}", param="response_id")


def _stored_id(request: Request) -> str:
    """The path's response id, checked before it goes near the database."""
    rid: str = request.path_params["response_id"]
    if not valid_id(rid):
        raise _not_found(rid)
    return rid


async def get_response(request: Request) -> Response:
    """The stored response; with `?stream=true`, a background response's events after
    `starting_after` (all of them without it), then the live run's until its terminal event."""
    rid = _stored_id(request)
    stream, after = stream_query(request.query_params)
    ctx = node(request)
    stored = stored_responses(request).get(rid)
    if stored is None:
        raise _not_found(rid)
    if not stream:
        return JSONResponse(stored.response)
    if not stored.response.get("background"):
        raise BadRequest(f"{rid} was not created with background: true; only a background response can be "
                         "streamed again (GET it without stream)", param="stream")
    events = ctx.background.logs.get(rid)
    if events is None:
        raise EventsExpired(f"the events of {rid} are no longer kept (they are kept {KEEP_AFTER_END:g} s after "
                            "the run ends, and not across a restart): GET it without stream", param="stream")
    events.check(after)
    return EventStreamResponse(events.follow(after), heartbeat=ctx.settings.sse_heartbeat)


async def delete_response(request: Request) -> Response:
    rid = _stored_id(request)
    if not stored_responses(request).delete(rid):
        raise _not_found(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


async def cancel_response(request: Request) -> Response:
    """Cancel the in-flight run of a stored response and return the response as it ends (or as
    it is, if it already ended or does not end within CANCEL_SETTLE_SECONDS)."""
    rid = _stored_id(request)
    ctx = node(request)
    store = stored_responses(request)
    stored = store.get(rid)
    if stored is None:
        raise _not_found(rid)
    event = ctx.responses_settled.get(rid)
    if ctx.cancels.cancel(ids=[rid]) and event is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), CANCEL_SETTLE_SECONDS)
        stored = store.get(rid)
        if stored is None:  # deleted meanwhile
            raise _not_found(rid)
    return JSONResponse(stored.response)
