"""POST /api/chat and POST /api/generate: Ollama's generation endpoints, streamed as NDJSON by
default, one object with `stream: false`. An answer names the model as the request did (with
`:latest` when untagged), as Ollama echoes it.

Both go through `hearth.api.http.runs` as every protocol does (registered for /v1/cancel, keys,
tenants and metrics; a client that leaves stops the engine work, streamed or not). A request
with no messages (chat) or no prompt (generate) loads its model and answers at once, Ollama's
way to preload one; with `keep_alive: 0` it unloads the model instead (`done_reason` "load" or
"unload").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.run_options import keep_alive
from hearth.api.ollama.bodies import OllamaFields, chat_request, generate_request, read_chat, read_generate
from hearth.api.ollama.replies import Clock, Kind, gather, stream_lines
from hearth.chat.types import ChatEvent, CompletionRequest, new_id
from hearth.errors import GenerationFailed
from hearth.http.auth import caller
from hearth.http.parsing import read_json
from hearth.protocols import ollama_names as names
from hearth.protocols.ollama_wire import ANSWER_ID_HEADER, NdjsonResponse


async def chat(request: Request) -> Response:
    ctx = node(request)
    body = read_chat(await read_json(request))
    model = names.resolve(ctx.backend, body.model)
    if not body.messages:
        return await _load_or_unload(request, body, model, "chat")
    creq = chat_request(body, model, new_id("chatcmpl-"), ctx.settings)
    clock = Clock(was_loaded=not runs.must_load(ctx.backend, model))
    gen = await runs.start_chat(request, "ollama_chat", creq, body.cancel_id, stream=body.stream)
    return await _answer(request, gen, "chat", names.tagged(body.model), body.stream, clock, creq.request_id)


async def generate(request: Request) -> Response:
    ctx = node(request)
    body = read_generate(await read_json(request))
    model = names.resolve(ctx.backend, body.model)
    if not body.prompt and not body.system:
        return await _load_or_unload(request, body, model, "generate")
    creq = generate_request(body, model, new_id("cmpl-"), ctx.settings)
    clock = Clock(was_loaded=not runs.must_load(ctx.backend, model))
    if isinstance(creq, CompletionRequest):
        who = caller(request)
        complete = replace(creq, cache_ns=who.namespace(body.cache_salt), tenant=who.tenant, weight=who.weight,
                           priority=runs.run_class(who, creq.priority))
        gen = await runs.start(request, "ollama_generate",
                               lambda token: ctx.backend.complete(replace(complete, cancel=token)),
                               cancel_id=body.cancel_id, ids=[creq.request_id], model=model)
    else:
        gen = await runs.start_chat(request, "ollama_generate", creq, body.cancel_id, stream=body.stream)
    return await _answer(request, gen, "generate", names.tagged(body.model), body.stream, clock, creq.request_id)


async def _answer(request: Request, gen: runs.Generation, kind: Kind, model: str, stream: bool,
                  clock: Clock, answer_id: str) -> Response:
    events: AsyncIterator[ChatEvent] = gen.events
    named = {ANSWER_ID_HEADER: answer_id}  # the ledger row's id: Ollama's objects have none
    if stream:
        return NdjsonResponse(stream_lines(events, kind, model, clock), named, close=gen.events.aclose,
                              on_disconnect=gen.disconnected)
    whole = await gen.collect(request, lambda: gather(events))
    if whole.done is not None and whole.done.error:
        raise GenerationFailed(whole.done.error)
    return JSONResponse(whole.body(kind, model, clock), headers=named)


async def _load_or_unload(request: Request, body: OllamaFields, model: str, kind: Kind) -> Response:
    """Ollama's preload (an empty request) and unload (the same with keep_alive 0)."""
    loading = node(request).backend.model_loading
    seconds = keep_alive(body.keep_alive)
    reason = "unload" if seconds == 0 else "load"
    if loading is not None:
        if reason == "unload":
            await loading.unload_model(model)
        else:
            await loading.load_model(model, seconds)
    out: dict[str, Any] = {"model": names.tagged(body.model), "created_at": names.timestamp()}
    out |= {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    return JSONResponse(out | {"done_reason": reason, "done": True})
