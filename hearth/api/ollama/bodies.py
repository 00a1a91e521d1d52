"""Ollama's /api/chat and /api/generate bodies, and what they become: a `ChatRequest` (chat, and
generate with its template) or a `CompletionRequest` (generate with `raw`).

Decisions:
- `options` not given take Hearth's defaults (those of /v1/chat/completions), not Ollama's
  (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1): one request answers the same on
  every protocol. Options Hearth has no use for (num_gpu, num_thread, mirostat, ...) are
  accepted and ignored, as Ollama ignores options a runner does not know.
- `num_ctx` does not resize the context per request (the server's --ctx does): it is accepted
  and ignored; a prompt that does not fit is the usual 400.
- Images, `suffix` (fill-in-the-middle) and a per-request `template` are a clear 400.
- A tool result names its tool (`tool_name`), not a call id: it is matched to the latest
  assistant call of that name, else given a fresh id (templates read the name and content).
- Hearth's own fields for continuing a partial answer (the gateway's mid-stream failover sends
  them; a client may too; docs/api.md, "Continuing a partial answer"): on /api/chat
  `continue_final_message` (the last message is the assistant's answer so far, as on
  /v1/chat/completions), on /api/generate `partial_response` and `partial_thinking` (the answer
  so far, after the templated prompt; not with `raw`), and on both `partial_is_output` (that
  part is this answer's own output: it counts in `eval_count` and against `num_predict`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from hearth.api.http.run_options import RunFields, RunLimits, keep_alive, run_limits
from hearth.chat.types import (
    ChatRequest,
    CompletionRequest,
    Message,
    ReasoningOptions,
    ResponseFormat,
    SamplingParams,
    Tool,
    ToolCall,
    new_id,
)
from hearth.config import Settings
from hearth.errors import BadRequest
from hearth.http.parsing import OpenBody, sampling_params, validate

NO_IMAGES = "this model does not support images: Hearth serves no vision models"


class OptionsIn(BaseModel):
    """Ollama's `options` (its Modelfile parameters): the sampler's are used, the rest accepted."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    num_ctx: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def sampling(self) -> SamplingParams:
        n = self.num_predict
        if n is not None and (n == 0 or n < -2):
            raise BadRequest("options.num_predict must be >= 1, or -1 (no limit) or -2 (fill the context)",
                             param="options.num_predict")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        try:
            return sampling_params(
                temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                seed=self.seed if self.seed is None or self.seed >= 0 else None,  # -1: random
                max_tokens=n if n is not None and n > 0 else None, stop=stop,
                repetition_penalty=self.repeat_penalty, penalty_last_n=self.repeat_last_n,
                presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty)
        except BadRequest as e:
            raise BadRequest(f"options.{e.message}", param=f"options.{e.param}" if e.param else "options") from e


class FunctionIn(OpenBody):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolIn(OpenBody):
    type: Literal["function"] = "function"
    function: FunctionIn


class CallFunctionIn(OpenBody):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)  # Ollama's: an object


class CallIn(OpenBody):
    id: str | None = None
    function: CallFunctionIn


class MessageIn(OpenBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[CallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None  # OpenAI's name, which some clients send here too


class OllamaFields(RunFields):
    """What /api/chat and /api/generate share. Hearth's own run fields (cancel_id, timeout,
    cache_salt, lenient_tool_calls, ...) come from `RunFields`; its top-level sampler fields
    are not Ollama's and are ignored: `options` holds the sampler."""

    model: str = Field(min_length=1, max_length=1024)
    stream: StrictBool = True
    options: OptionsIn | None = None
    format: str | dict[str, Any] | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    images: list[str] | None = None

    def sampling_fields(self) -> dict[str, Any]:
        return {}


class ChatIn(OllamaFields):
    messages: list[MessageIn] = Field(default_factory=list)
    tools: list[ToolIn] | None = None
    continue_final_message: StrictBool = False  # Hearth's (the module's docstring)
    partial_is_output: StrictBool = False


class GenerateIn(OllamaFields):
    prompt: str = ""
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    raw: StrictBool = False
    context: list[int] | None = None
    partial_response: str | None = None  # Hearth's (the module's docstring)
    partial_thinking: str | None = None
    partial_is_output: StrictBool = False

    def partial(self) -> Message | None:
        """The answer so far, to continue; None: none given."""
        if self.partial_response is None and not self.partial_thinking:
            return None
        return Message("assistant", self.partial_response or "", reasoning=self.partial_thinking or None)


def response_format(fmt: str | dict[str, Any] | None) -> ResponseFormat | None:
    """`format`: "json" (any JSON value the model writes as an object) or a JSON schema."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat("json_object")
    if isinstance(fmt, dict):
        return ResponseFormat("json_schema", fmt or {"type": "object"})
    raise BadRequest(f'format must be "json" or a JSON schema object, got {fmt!r}', param="format")


def reasoning(think: bool | str | None) -> ReasoningOptions:
    if think is None:
        return ReasoningOptions()
    if isinstance(think, bool):
        return ReasoningOptions(enable=think)
    return ReasoningOptions(enable=True, effort=think)


def _arguments(args: dict[str, Any] | str) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def to_messages(messages: list[MessageIn]) -> list[Message]:
    out: list[Message] = []
    calls_by_name: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.images:
            raise BadRequest(f"{where}.images: {NO_IMAGES}", param=f"{where}.images")
        if m.tool_calls and m.role != "assistant":
            raise BadRequest(f"{where}: only assistant messages carry tool_calls", param=f"{where}.tool_calls")
        calls = [ToolCall(c.id or new_id("call_"), c.function.name, _arguments(c.function.arguments))
                 for c in m.tool_calls or []]
        calls_by_name.update((c.name, c.id) for c in calls)
        if m.role == "tool":
            name = m.tool_name
            call_id = m.tool_call_id or (calls_by_name.get(name) if name else None) or new_id("call_")
            out.append(Message("tool", m.content, name=name, tool_call_id=call_id))
        else:
            out.append(Message(m.role, m.content, tool_calls=calls or None, reasoning=m.thinking or None))
    return out


def _limits(settings: Settings | None, body: OllamaFields) -> RunLimits:
    if settings is None:  # no server: the body's own fields only
        return RunLimits(keep_alive=keep_alive(body.keep_alive))
    return run_limits(settings, body)


def _common(body: OllamaFields) -> SamplingParams:
    if body.images:
        raise BadRequest(f"images: {NO_IMAGES}", param="images")
    return (body.options or OptionsIn()).sampling()


def chat_request(body: ChatIn, model: str, request_id: str, settings: Settings | None = None) -> ChatRequest:
    sampling = _common(body)
    messages = to_messages(body.messages)
    tools = [Tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or []]
    limits = _limits(settings, body)
    return ChatRequest(
        model=model, messages=messages, sampling=sampling, tools=tools, response_format=response_format(body.format),
        reasoning=reasoning(body.think), request_id=request_id, timeout=limits.timeout, keep_alive=limits.keep_alive,
        cache_prompt=body.cache_prompt, repetition=limits.repetition, lenient_tool_calls=limits.lenient_tool_calls,
        cache_salt=body.cache_salt, priority=limits.priority, continue_final=body.continue_final_message,
        partial_is_output=body.partial_is_output)


def generate_request(body: GenerateIn, model: str, request_id: str, settings: Settings | None = None
                     ) -> ChatRequest | CompletionRequest:
    """`raw`: the prompt as it is, no template (a `CompletionRequest`); else the model's template
    over `system` and the prompt as one user turn."""
    sampling = _common(body)
    if body.suffix:
        raise BadRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
    if body.template:
        raise BadRequest("template: a per-request template is not supported; the model's own is used",
                         param="template")
    if body.context:
        raise BadRequest("context: the token context of an earlier answer is not supported; send the "
                         "conversation as messages to /api/chat (its prefix is cached either way)",
                         param="context")
    limits = _limits(settings, body)
    partial = body.partial()
    if body.raw:
        if body.format or body.think:
            raise BadRequest("raw takes no format or think: they need the model's template", param="raw")
        if partial is not None:
            raise BadRequest("partial_response: a raw prompt is continued by sending it with the answer so far "
                             "appended", param="partial_response")
        return CompletionRequest(model=model, prompt=body.prompt, sampling=sampling, request_id=request_id,
                                 timeout=limits.timeout, cache_prompt=body.cache_prompt,
                                 repetition=limits.repetition, keep_alive=limits.keep_alive,
                                 priority=limits.priority)
    messages = ([Message("system", body.system)] if body.system else []) + [Message("user", body.prompt)]
    return ChatRequest(
        model=model, messages=messages + ([partial] if partial is not None else []), sampling=sampling,
        response_format=response_format(body.format), reasoning=reasoning(body.think), request_id=request_id,
        timeout=limits.timeout, keep_alive=limits.keep_alive, cache_prompt=body.cache_prompt,
        repetition=limits.repetition, lenient_tool_calls=limits.lenient_tool_calls, cache_salt=body.cache_salt,
        priority=limits.priority, continue_final=partial is not None, partial_is_output=body.partial_is_output)


def read_chat(data: dict[str, Any]) -> ChatIn:
    return validate(ChatIn, data)


def read_generate(data: dict[str, Any]) -> GenerateIn:
    return validate(GenerateIn, data)
