"""POST /v1/chat/completions: OpenAI's Chat Completions, streaming and not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.parsing import (
    first_set,
    parse_logit_bias,
    parse_stop,
    read_json,
    sampling_params,
    session_turn,
    validate,
)
from hearth.api.http.run_options import RunFields, repetition, shape, stop_fields, wall_cap
from hearth.api.http.sse import DONE, sse_data
from hearth.backends.base import EventStream
from hearth.chat.cancel import CancelToken
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    Done,
    Finish,
    Message,
    ReasoningDelta,
    ReasoningOptions,
    ResponseFormat,
    Started,
    TextDelta,
    Timings,
    TokenLogprob,
    Tool,
    ToolCall,
    ToolCallDelta,
    Usage,
    new_id,
)
from hearth.errors import BadRequest, GenerationFailed


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send many fields we ignore


class ContentPart(_Open):
    type: str
    text: str | None = None


class FunctionCallIn(_Open):
    name: str
    arguments: str = ""


class ToolCallIn(_Open):
    id: str = Field(default_factory=lambda: new_id("call_"))
    type: Literal["function"] = "function"
    function: FunctionCallIn


class MessageIn(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Open):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolIn(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatCompletionIn(_Open, RunFields):
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool = False
    n: int = Field(default=1, ge=1, le=16)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    repeat_penalty: float | None = None  # llama.cpp's name
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    ignore_eos: bool | None = None
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    reasoning_budget: int | None = Field(default=None, ge=0)  # thinking tokens before the answer is forced
    grammar: str | None = Field(default=None, min_length=1)  # GBNF (llama.cpp's extension)
    chat_template_kwargs: dict[str, Any] | None = None
    cancel_id: str | None = Field(default=None, min_length=1, max_length=256)
    cache_prompt: bool = True
    speculative: bool | None = None  # prompt-lookup speculative decoding (default: the server's --spec-draft)
    # Hearth sessions (docs/sessions.md): the messages are only the new ones
    session_id: str | None = None
    replace_system: bool = False
    discard_thinking: bool = False
    session_wait: bool = True
    session_create: bool = True


def text_of(content: str | list[ContentPart] | None, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type in ("text", "input_text", "output_text") and part.text is not None:
            texts.append(part.text)
        elif part.type in ("image_url", "input_image", "image", "input_audio", "file"):
            raise BadRequest(f"{where}.content[{i}]: {part.type} input is not supported: this model has "
                             "no vision or audio", param=f"{where}.content")
        else:
            raise BadRequest(f"{where}.content[{i}]: unsupported content part type {part.type!r}",
                             param=f"{where}.content")
    return "".join(texts)


def to_message(m: MessageIn, i: int) -> Message:
    where = f"messages[{i}]"
    content = text_of(m.content, where)
    if m.role == "tool":
        if not m.tool_call_id:
            raise BadRequest(f"{where}: a tool message needs tool_call_id", param=f"{where}.tool_call_id")
        if content is None:
            raise BadRequest(f"{where}: a tool message needs content", param=f"{where}.content")
    elif m.role == "assistant":
        if content is None and not m.tool_calls:
            raise BadRequest(f"{where}: an assistant message needs content or tool_calls",
                             param=f"{where}.content")
    elif content is None:
        raise BadRequest(f"{where}: a {m.role} message needs content", param=f"{where}.content")
    if m.tool_calls and m.role != "assistant":
        raise BadRequest(f"{where}: only assistant messages carry tool_calls", param=f"{where}.tool_calls")
    calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
    return Message(m.role, content, m.name, calls or None, m.tool_call_id, m.reasoning_content)


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


def to_chat_request(body: ChatCompletionIn, request_id: str) -> ChatRequest:
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    sampling = sampling_params(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        repetition_penalty=first_set(body.repetition_penalty, body.repeat_penalty), seed=body.seed,
        stop=parse_stop(body.stop), logit_bias=parse_logit_bias(body.logit_bias),
        max_tokens=body.max_completion_tokens or body.max_tokens, ignore_eos=body.ignore_eos,
        logprobs=body.logprobs, top_logprobs=body.top_logprobs, grammar=body.grammar, speculative=body.speculative,
    )
    tools = [Tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or []]
    return ChatRequest(
        model=body.model or "", messages=[to_message(m, i) for i, m in enumerate(body.messages)],
        sampling=sampling, n=body.n, tools=tools, tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls, response_format=parse_response_format(body.response_format),
        reasoning=ReasoningOptions(effort=body.reasoning_effort, budget=body.reasoning_budget),
        chat_template_kwargs=body.chat_template_kwargs or {}, request_id=request_id, timeout=body.timeout,
        cache_prompt=body.cache_prompt, session=session_turn(body.session_id, body.replace_system,
                                                             body.discard_thinking, body.session_wait,
                                                             body.session_create))


# ---- output ------------------------------------------------------------------------------


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token_bytes.decode("utf-8", errors="replace"),
        "logprob": lp.logprob,
        "bytes": list(lp.token_bytes),
        "top_logprobs": [{"token": b.decode("utf-8", errors="replace"), "logprob": v, "bytes": list(b)}
                         for _, b, v in lp.top],
    }


def usage_dict(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


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
    backend = node(request).backend
    body = validate(ChatCompletionIn, await read_json(request))
    cid = new_id("chatcmpl-")
    creq = to_chat_request(body, cid)
    creq.timeout = wall_cap(node(request).settings, body)
    creq.repetition = repetition(node(request).settings, body)
    model = backend.resolve(creq.model)

    def open_stream(token: CancelToken) -> Awaitable[EventStream]:
        creq.cancel = token
        return backend.chat(creq)

    gen = await runs.start(request, "chat", open_stream, cancel_id=body.cancel_id, session_id=body.session_id,
                           ids=[cid])
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


def timings_field(timings: Timings | None) -> dict[str, Any]:
    """llama-server's `timings`, on a response or its final chunk."""
    return {"timings": timings.as_llama_server()} if timings is not None else {}


async def stream_chunks(events: AsyncIterator[ChatEvent], cid: str, model: str, created: int, n: int,
                        want_logprobs: bool, include_usage: bool) -> AsyncIterator[bytes]:
    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None,
              extra: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                               "model": model, "system_fingerprint": "hearth", "choices": choices}
        if include_usage:
            obj["usage"] = usage
        return sse_data(obj | (extra or {}))

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
                lps = [logprob_entry(lp) for lp in ev.logprobs or []] if want_logprobs else None
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
                    yield sse_data({"error": {"message": ev.error, "type": "server_error",
                                              "param": None, "code": "generation_failed"}})
                if include_usage:
                    yield chunk([], usage_dict(ev.usage))
        yield DONE
    finally:
        await events.aclose()  # type: ignore[attr-defined]
