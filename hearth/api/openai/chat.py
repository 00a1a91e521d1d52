"""POST /v1/chat/completions: OpenAI's Chat Completions, streaming and not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.run_options import (
    ConversationFields,
    RunLimits,
    SamplerFields,
    SessionFields,
    run_limits,
    shape,
    stop_fields,
)
from hearth.api.openai.messages import MessageIn, to_message
from hearth.api.openai.shapes import Chunks, generation_failed, timings_field, usage_dict
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    Done,
    Finish,
    ReasoningDelta,
    ReasoningOptions,
    ResponseFormat,
    Started,
    TextDelta,
    Timings,
    TokenLogprob,
    Tool,
    ToolCallDelta,
    Usage,
    new_id,
)
from hearth.config import Settings
from hearth.errors import BadRequest, GenerationFailed
from hearth.http.auth import caller
from hearth.http.cache_keys import body_key
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.http.sse import DONE


class FunctionDef(OpenBody):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolIn(OpenBody):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatCompletionIn(OpenBody, SamplerFields, SessionFields, ConversationFields):
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)  # with a session_id, only the new ones
    stream: bool = False
    n: int = Field(default=1, ge=1, le=16)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    reasoning_budget: int | None = Field(default=None, ge=0)  # thinking tokens before the answer is forced
    grammar: str | None = Field(default=None, min_length=1)  # GBNF (llama.cpp's extension)
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's name: the last message is the assistant's partial answer, to be continued (docs/api.md)
    continue_final_message: bool = False
    # Hearth's own, set by the gateway's stream continuation (gateway/failover/cuts/): the final
    # assistant message is this answer's own output so far, counted in max_tokens and in the
    # output tokens. A client's prefill is input: max_tokens bounds the new tokens (docs/api.md).
    partial_is_output: bool = False


def _tool_choice(choice: str | dict[str, Any] | None) -> str | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise BadRequest("tool_choice must be none, auto, required or a function", param="tool_choice")
        return choice
    name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
    if not isinstance(name, str) or not name:
        raise BadRequest('tool_choice object must be {"type": "function", "function": {"name": ...}}',
                         param="tool_choice")
    return name


def parse_response_format(rf: dict[str, Any] | None) -> ResponseFormat | None:
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}};
    llama.cpp's {"type": "json_object", "schema": {...}} is accepted too."""
    if rf is None:
        return None
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise BadRequest("response_format.schema must be an object", param="response_format.schema")
        return ResponseFormat("json_object", schema)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise BadRequest("response_format.json_schema must be an object with a schema",
                             param="response_format.json_schema")
        return ResponseFormat("json_schema", js.get("schema") or {"type": "object"}, js.get("name"),
                              bool(js.get("strict")))
    raise BadRequest("response_format.type must be text, json_object or json_schema", param="response_format.type")


def to_chat_request(body: ChatCompletionIn, request_id: str, settings: Settings | None = None) -> ChatRequest:
    """The request, complete but for its cancel token (the run's, given when it opens). The
    server's limits (`settings`; none without) are checked last, after the body's own fields."""
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    sampling = body.sampling(max_tokens=body.max_completion_tokens or body.max_tokens, logprobs=body.logprobs,
                             top_logprobs=body.top_logprobs, grammar=body.grammar)
    tools = [Tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or []]
    messages = [to_message(m, i) for i, m in enumerate(body.messages)]
    tool_choice = _tool_choice(body.tool_choice)
    response_format = parse_response_format(body.response_format)
    session = body.session_turn()
    limits = run_limits(settings, body) if settings is not None else RunLimits()
    return ChatRequest(
        model=body.model or "", messages=messages, sampling=sampling, n=body.n, tools=tools,
        tool_choice=tool_choice, parallel_tool_calls=body.parallel_tool_calls, response_format=response_format,
        reasoning=ReasoningOptions(effort=body.reasoning_effort, budget=body.reasoning_budget),
        chat_template_kwargs=body.chat_template_kwargs or {}, request_id=request_id, timeout=limits.timeout,
        keep_alive=limits.keep_alive, cache_prompt=body.cache_prompt, session=session, repetition=limits.repetition,
        lenient_tool_calls=limits.lenient_tool_calls, cache_key=body_key(body.prompt_cache_key),
        cache_salt=body.cache_salt, priority=limits.priority,
        continue_final=body.continue_final_message, partial_is_output=body.partial_is_output)


def read_chat(data: dict[str, Any], request_id: str, settings: Settings | None = None
              ) -> tuple[ChatCompletionIn, ChatRequest]:
    """A Chat Completions body as generation reads it (POST /v1/prompt-cache/blocks reads it so too)."""
    body = validate(ChatCompletionIn, data)
    return body, to_chat_request(body, request_id, settings)


# ---- output ------------------------------------------------------------------------------


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token_bytes.decode("utf-8", errors="replace"),
        "logprob": lp.logprob,
        "bytes": list(lp.token_bytes),
        "top_logprobs": [{"token": b.decode("utf-8", errors="replace"), "logprob": v, "bytes": list(b)}
                         for _, b, v in lp.top],
    }


class _Choice:
    __slots__ = ("finish", "finish_reason", "logprobs", "reasoning", "text", "tool_calls")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.finish: Finish | None = None

    def add_call(self, ev: ToolCallDelta) -> None:
        call = self.tool_calls.setdefault(ev.call_index, {"id": ev.id, "type": "function",
                                                          "function": {"name": ev.name, "arguments": ""}})
        call["function"]["arguments"] += ev.arguments

    def message(self) -> dict[str, Any]:
        text = "".join(self.text)
        msg: dict[str, Any] = {"role": "assistant", "content": text if text or not self.tool_calls else None,
                               "refusal": None}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
        return msg


async def collect(events: AsyncIterator[ChatEvent], n: int
                  ) -> tuple[list[_Choice], Usage, str | None, Timings | None]:
    choices = [_Choice() for _ in range(n)]
    usage, error, timings = Usage(), None, None
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                choices[ev.index].text.append(ev.text)
                choices[ev.index].logprobs.extend(logprob_entry(lp) for lp in ev.logprobs or [])
            elif isinstance(ev, ReasoningDelta):
                choices[ev.index].reasoning.append(ev.text)
            elif isinstance(ev, ToolCallDelta):
                choices[ev.index].add_call(ev)
            elif isinstance(ev, Finish):
                choices[ev.index].finish_reason = ev.reason
                choices[ev.index].finish = ev
            elif isinstance(ev, Done):
                usage, error, timings = ev.usage, ev.error, ev.timings
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return choices, usage, error, timings


async def chat_completions(request: Request) -> Response:
    ctx = node(request)
    body, creq = read_chat(await read_json(request), new_id("chatcmpl-"), ctx.settings)
    cid, model = creq.request_id, ctx.backend.resolve(creq.model)
    gen = await runs.start_chat(request, "chat", creq, body.cancel_id, stream=bool(body.stream))
    events = gen.events
    created = int(time.time())
    want_logprobs = bool(body.logprobs)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return gen.stream(stream_chunks(shape(events, body), cid, model, created, body.n, want_logprobs,
                                        include_usage))
    choices, usage, error, timings = await gen.collect(request, lambda: collect(events, body.n))
    if error:
        raise GenerationFailed(error)
    return JSONResponse({
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": "hearth",
        # the class it ran in, as OpenAI echoes the tier that served it (hearth.engine.fair_share)
        "service_tier": runs.run_class(caller(request), creq.priority),
        "choices": [{
            "index": i,
            "message": c.message(),
            "logprobs": {"content": c.logprobs, "refusal": None} if want_logprobs else None,
            "finish_reason": c.finish_reason or "stop",
            **stop_fields(c.finish),
        } for i, c in enumerate(choices)],
        "usage": usage_dict(usage),
        **timings_field(timings),
    })


async def stream_chunks(events: AsyncIterator[ChatEvent], cid: str, model: str, created: int, n: int,
                        want_logprobs: bool, include_usage: bool) -> AsyncIterator[bytes]:
    chunk = Chunks(cid, "chat.completion.chunk", created, model, include_usage)

    def choice(index: int, delta: dict[str, Any], finish: str | None = None,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta,
                "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
                "finish_reason": finish}

    # The last finish chunk waits for the totals (they follow at once) to carry the timings.
    last_finish: Finish | None = None
    finished = 0
    try:
        async for ev in events:
            if isinstance(ev, Started):
                for i in range(n):
                    yield chunk([choice(i, {"role": "assistant", "content": ""})])
            elif isinstance(ev, TextDelta):
                if not want_logprobs:
                    if ev.text:
                        yield chunk.content(ev.index, ev.text)  # the per-token path: a prebuilt envelope
                    continue
                lps = [logprob_entry(lp) for lp in ev.logprobs or []]
                if ev.text or lps:
                    yield chunk([choice(ev.index, {"content": ev.text}, logprobs=lps)])
            elif isinstance(ev, ReasoningDelta):
                yield chunk([choice(ev.index, {"reasoning_content": ev.text})])
            elif isinstance(ev, ToolCallDelta):
                call: dict[str, Any] = {"index": ev.call_index}
                if ev.name is not None:  # the announcement
                    call.update(id=ev.id, type="function", function={"name": ev.name, "arguments": ev.arguments})
                else:
                    call["function"] = {"arguments": ev.arguments}
                yield chunk([choice(ev.index, {"tool_calls": [call]})])
            elif isinstance(ev, Finish):
                finished += 1
                if finished < n:
                    yield chunk([choice(ev.index, {}, ev.reason) | stop_fields(ev)])
                else:
                    last_finish = ev
            elif isinstance(ev, Done):
                if last_finish is not None:
                    final = choice(last_finish.index, {}, last_finish.reason) | stop_fields(last_finish)
                    yield chunk([final], extra=timings_field(ev.timings))
                if ev.error:
                    yield generation_failed(ev.error)
                if include_usage:
                    yield chunk([], usage_dict(ev.usage))
        yield DONE
    finally:
        await events.aclose()  # type: ignore[attr-defined]
