"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, streaming and not.

Every answer from these routes is in Anthropic's shapes: errors by the one error policy
(`hearth.http.errors`, which picks the envelope by path); the output side (content blocks,
SSE) is in `stream.py`.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.anthropic.stream import PING, collect, hearth_fields, message_body, stop_reason, stream_events
from hearth.api.context import node
from hearth.api.http import runs
from hearth.api.http.run_options import (
    ConversationFields,
    RunFields,
    RunLimits,
    SessionFields,
    run_limits,
    shape,
)
from hearth.chat.types import (
    ChatRequest,
    Message,
    ReasoningOptions,
    ResponseFormat,
    SamplingParams,
    Tool,
    ToolCall,
    new_id,
)
from hearth.config import Settings
from hearth.errors import BadRequest, GenerationFailed
from hearth.http.cache_keys import body_key
from hearth.http.errors import ApiError, respond
from hearth.http.parsing import OpenBody, read_json, validate

log = logging.getLogger("hearth.api")

# Text blocks of one message are joined with a newline: clients split paragraphs (or a
# reminder and the question) into blocks, and gluing them together would merge words.
BLOCK_JOINER = "\n"

# Blocks a turn may hold that carry nothing for a local model (server tool calls and results
# run by Anthropic, container uploads, compaction markers, block types newer than this
# server): accepted and skipped, never a 400. Only a known block in the wrong place is refused.
USER_BLOCKS = ("text", "tool_result", "image", "document")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")


class BlockIn(OpenBody):
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[BlockIn] | None = None
    is_error: bool = False
    thinking: str | None = None  # thinking
    tool_name: str | None = None  # tool_reference (tool search): a deferred tool now loaded
    cache_control: dict[str, Any] | None = None  # a prompt cache breakpoint (`cache_through`)
    # Hearth's extension for continuing a cut answer: a tool_use block's input as the partial
    # JSON text streamed so far (in place of `input`); only in the message being continued.
    partial_json: str | None = None


class MessageIn(OpenBody):
    # Claude Code sends "system" turns inside `messages` (its environment block, reminders).
    role: Literal["user", "assistant", "system"]
    content: str | list[BlockIn]


class ToolIn(OpenBody):
    type: str | None = None  # "custom" or absent; Anthropic's server tools carry versioned types
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    input_schema: dict[str, Any] | None = None
    # Tool search: a deferred tool stays out of the prompt until a tool_reference loads it.
    defer_loading: bool = False
    cache_control: dict[str, Any] | None = None


class ToolChoiceIn(OpenBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingIn(OpenBody):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)


class OutputFormatIn(OpenBody):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfigIn(OpenBody):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormatIn | None = None


class CountTokensIn(OpenBody):
    model: str | None = None
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[BlockIn] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None
    output_config: OutputConfigIn | None = None
    output_format: OutputFormatIn | None = None  # the structured-outputs beta's name for output_config.format
    session_id: str | None = None  # Hearth sessions (docs/sessions.md); count_tokens ignores it
    cache_control: dict[str, Any] | None = None  # automatic caching: a breakpoint after the last block


class MessagesIn(CountTokensIn, SessionFields, RunFields, ConversationFields):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    # A final assistant message is a prefill the answer continues (Anthropic's meaning): null
    # continues one when the last message is the assistant's; false answers it with a new turn.
    continue_final_message: bool | None = None
    # Hearth's own, set by the gateway's stream continuation (gateway/failover/cuts/): the final
    # assistant message is this answer's own output so far, counted in max_tokens and in the
    # output tokens. A client's prefill is input: max_tokens bounds the new tokens (docs/api.md).
    partial_is_output: bool = False

    def continues(self) -> bool:
        last = self.messages[-1].role == "assistant"
        return last if self.continue_final_message is None else self.continue_final_message


# ---- request → ChatRequest ------------------------------------------------------------------


def _no_vision(where: str, kind: str) -> BadRequest:
    return BadRequest(f"{where}: {kind} input is not supported: this model has no vision", param=where)


def _skip(at: str, kind: str) -> None:
    log.debug("%s: skipped a %r block (nothing a local model can use)", at, kind)


def _texts(blocks: list[BlockIn], where: str) -> str:
    """The text of a list that may hold only text blocks (system, tool_result content). In a
    tool result, a tool_reference (tool search's answer) reads as the name of the tool it loads."""
    parts = []
    for i, b in enumerate(blocks):
        at = f"{where}[{i}]"
        if b.type in ("image", "document"):
            raise _no_vision(at, b.type)
        if b.type == "text" and b.text is not None:
            parts.append(b.text)
        elif b.type == "tool_reference" and b.tool_name:
            parts.append(f"Tool loaded: {b.tool_name}")
        elif b.type in (*USER_BLOCKS, *ASSISTANT_BLOCKS):
            raise BadRequest(f"{at}: expected a text block, got {b.type!r}", param=at)
        else:
            _skip(at, b.type)
    return BLOCK_JOINER.join(parts)


def _tool_result(b: BlockIn, where: str) -> Message:
    if not b.tool_use_id:
        raise BadRequest(f"{where}: a tool_result block needs tool_use_id", param=f"{where}.tool_use_id")
    content = b.content if isinstance(b.content, str) else _texts(b.content or [], f"{where}.content")
    if b.is_error:  # the template has no error flag: say it in the text, so the model sees it
        content = f"Error: {content}"
    return Message("tool", content, tool_call_id=b.tool_use_id)


def _user(blocks: list[BlockIn], where: str) -> list[Message]:
    """A user turn: its text blocks become user messages and each tool_result a tool message,
    in the order given."""
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append(Message("user", BLOCK_JOINER.join(texts)))
            texts.clear()

    for i, b in enumerate(blocks):
        at = f"{where}[{i}]"
        if b.type == "text" and b.text is not None:
            texts.append(b.text)
        elif b.type == "tool_result":
            flush()
            out.append(_tool_result(b, at))
        elif b.type in ("image", "document"):
            raise _no_vision(at, b.type)
        elif b.type in ASSISTANT_BLOCKS:
            raise BadRequest(f"{at}: a user message cannot hold a {b.type!r} block", param=at)
        else:
            _skip(at, b.type)
    flush()
    return out or [Message("user", "")]


def _assistant(blocks: list[BlockIn], where: str, partial: bool = False) -> Message:
    texts, thoughts, calls = [], [], []
    for i, b in enumerate(blocks):
        at = f"{where}[{i}]"
        if b.type == "text" and b.text is not None:
            texts.append(b.text)
        elif b.type == "thinking":
            thoughts.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue  # encrypted by Anthropic: nothing a local model can read
        elif b.type == "tool_use":
            if not b.id or not b.name:
                raise BadRequest(f"{at}: a tool_use block needs id and name", param=at)
            if b.partial_json is not None:
                if not partial or i != len(blocks) - 1:
                    raise BadRequest(f"{at}.partial_json: only the last block of a message being continued "
                                     "(continue_final_message) may carry partial input", param=f"{at}.partial_json")
                calls.append(ToolCall(b.id, b.name, b.partial_json))
                continue
            if not isinstance(b.input, dict):
                raise BadRequest(f"{at}.input: must be an object", param=f"{at}.input")
            calls.append(ToolCall(b.id, b.name, json.dumps(b.input, ensure_ascii=False)))
        elif b.type in USER_BLOCKS:
            raise BadRequest(f"{at}: an assistant message cannot hold a {b.type!r} block", param=at)
        else:
            _skip(at, b.type)
    return Message("assistant", BLOCK_JOINER.join(texts), tool_calls=calls or None,
                   reasoning=BLOCK_JOINER.join(thoughts) or None)


def to_messages(body: CountTokensIn, starts: list[int] | None = None, continues: bool = False) -> list[Message]:
    """The system prompt, then each turn. A `system` turn inside `messages` stays a system
    message at its position; the template decides whether it can stand there (see
    hearth.chat.system_turns). `starts`, if given, gets the index of each turn's first message."""
    out: list[Message] = []
    if body.system is not None:
        system = body.system if isinstance(body.system, str) else _texts(_no_billing(body.system), "system")
        out.append(Message("system", system))
    for i, m in enumerate(body.messages):
        where = f"messages[{i}].content"
        if starts is not None:
            starts.append(len(out))
        if isinstance(m.content, str):
            out.append(Message(m.role, m.content))
        elif m.role == "system":
            out.append(Message("system", _texts(m.content, where)))
        elif m.role == "user":
            out.extend(_user(m.content, where))
        else:
            out.append(_assistant(m.content, where, partial=continues and i == len(body.messages) - 1))
    return out


def _marked(block: BlockIn) -> bool:
    """A cache_control breakpoint on the block, or on a block inside it (a tool result's)."""
    inner = block.content if isinstance(block.content, list) else []
    return block.cache_control is not None or any(b.cache_control is not None for b in inner)


def cache_through(body: CountTokensIn, messages: list[Message], starts: list[int]) -> int | None:
    """The index in `messages` (converted from `body`, `starts` their turns' first messages) of
    the message that ends at or after the body's last cache_control breakpoint: Anthropic
    orders a prompt tools, system, messages, so the last breakpoint is the one furthest in that
    order. Tools come before any message: a breakpoint there keeps through message 0 (the
    system prompt, when there is one). None: no breakpoint."""
    if body.cache_control is not None:  # automatic caching: after the last block
        return len(messages) - 1
    for i in reversed(range(len(body.messages))):
        turn = body.messages[i]
        blocks = turn.content if isinstance(turn.content, list) else []
        j = next((j for j in reversed(range(len(blocks))) if _marked(blocks[j])), None)
        if j is None:
            continue
        if turn.role == "user":  # one turn, maybe several messages: the one holding block j
            return starts[i] + len(_user(blocks[:j + 1], f"messages[{i}].content")) - 1
        return starts[i]
    system = body.system if isinstance(body.system, list) else []
    if any(_marked(b) for b in system) or any(t.cache_control is not None for t in body.tools or []):
        return 0
    return None


# Claude Code's first system block: billing metadata for Anthropic, meaningless to a model, and
# different in every session (`cc_version=2.1.330.6da`, then `.83a`): it would make the first
# tokens of every new session's prompt differ, so none could reuse another's cached prefix.
BILLING_HEADER = "x-anthropic-billing-header:"


def _no_billing(blocks: list[BlockIn]) -> list[BlockIn]:
    return [b for b in blocks if not (b.type == "text" and (b.text or "").startswith(BILLING_HEADER))]


def _loaded_tools(body: CountTokensIn) -> set[str]:
    """The deferred tools a tool_reference in some tool result has loaded."""
    names: set[str] = set()
    for m in body.messages:
        for b in m.content if isinstance(m.content, list) else []:
            for inner in b.content if b.type == "tool_result" and isinstance(b.content, list) else []:
                if inner.type == "tool_reference" and inner.tool_name:
                    names.add(inner.tool_name)
    return names


def _tools(body: CountTokensIn) -> list[Tool]:
    out = []
    loaded: set[str] | None = None
    for i, t in enumerate(body.tools or []):
        if t.type not in (None, "custom"):
            raise BadRequest(f"tools[{i}]: server tools ({t.type}) are not supported; define a custom tool "
                             "with input_schema", param=f"tools[{i}].type")
        if t.input_schema is None:
            raise BadRequest(f"tools[{i}]: input_schema is required", param=f"tools[{i}].input_schema")
        if t.defer_loading:
            loaded = _loaded_tools(body) if loaded is None else loaded
            if t.name not in loaded:
                continue
        out.append(Tool(t.name, t.description, t.input_schema))
    return out


def _tool_choice(choice: ToolChoiceIn | None, tools: list[Tool]) -> str | None:
    if choice is None:
        return None
    if choice.type in ("any", "tool") and not tools:
        raise BadRequest(f"tool_choice {choice.type!r} needs tools", param="tool_choice")
    if choice.type == "tool":
        if not choice.name:
            raise BadRequest('tool_choice {"type": "tool"} needs a name', param="tool_choice.name")
        if choice.name not in {t.name for t in tools}:
            raise BadRequest(f"tool_choice names {choice.name!r}, which is not in tools", param="tool_choice.name")
        return choice.name
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _reasoning(thinking: ThinkingIn | None, output: OutputConfigIn | None) -> ReasoningOptions:
    # Anthropic's two highest efforts have no counterpart in the templates' low | medium | high.
    effort = output.effort if output is not None else None
    options = ReasoningOptions(effort={"xhigh": "high", "max": "high"}.get(effort or "", effort))
    if thinking is None:
        return options
    if thinking.type == "disabled":
        options.enable = False
        return options
    if thinking.type == "enabled" and thinking.budget_tokens is None:
        raise BadRequest('thinking {"type": "enabled"} needs budget_tokens', param="thinking.budget_tokens")
    options.enable, options.budget = True, thinking.budget_tokens
    return options


def _response_format(body: CountTokensIn) -> ResponseFormat | None:
    """`output_config.format`, or the beta's top-level `output_format` it replaced (the same
    object); both given and different is a 400."""
    fmt = body.output_config.format if body.output_config is not None else None
    if body.output_format is not None:
        if fmt is not None and fmt != body.output_format:
            raise BadRequest("output_format is the earlier name of output_config.format; give one, or the same "
                             "format in both", param="output_format")
        fmt = body.output_format
    return None if fmt is None else ResponseFormat("json_schema", fmt.schema_, strict=True)


def to_chat_request(body: CountTokensIn, request_id: str, settings: Settings | None = None) -> ChatRequest:
    """The request, complete but for its cancel token (the run's, given when it opens). A
    count_tokens body has no run fields: the default sampling, no session. The server's limits
    (`settings`; none without) are checked last, after the body's own fields."""
    tools = _tools(body)
    starts: list[int] = []
    run = body if isinstance(body, MessagesIn) else None
    continues = run is not None and run.continues()
    messages = to_messages(body, starts, continues)
    tool_choice = _tool_choice(body.tool_choice, tools)
    reasoning = _reasoning(body.thinking, body.output_config)
    response_format = _response_format(body)
    parallel = body.tool_choice is None or not body.tool_choice.disable_parallel_tool_use
    sampling = run.sampling(stop=run.stop_sequences, max_tokens=run.max_tokens) if run else SamplingParams()
    session = run.session_turn() if run else None
    limits = run_limits(settings, run) if run and settings is not None else RunLimits()
    return ChatRequest(model=body.model or "", messages=messages, sampling=sampling, tools=tools,
                       tool_choice=tool_choice, parallel_tool_calls=parallel, response_format=response_format,
                       reasoning=reasoning, request_id=request_id, timeout=limits.timeout,
                       keep_alive=limits.keep_alive, cache_prompt=run.cache_prompt if run else True, session=session,
                       repetition=limits.repetition, lenient_tool_calls=limits.lenient_tool_calls,
                       priority=limits.priority,
                       cache_key=body_key(run.prompt_cache_key, run.metadata) if run else None,
                       cache_salt=run.cache_salt if run else None,
                       cache_through=cache_through(body, messages, starts), continue_final=continues,
                       partial_is_output=bool(run and run.partial_is_output))


def read_messages(data: dict[str, Any], request_id: str, settings: Settings | None = None
                  ) -> tuple[MessagesIn, ChatRequest]:
    """A Messages body as generation reads it (POST /v1/prompt-cache/blocks reads it so too)."""
    body = validate(MessagesIn, data)
    return body, to_chat_request(body, request_id, settings)


# ---- endpoints ----------------------------------------------------------------------------


async def messages(request: Request) -> Response:
    ctx = node(request)
    body, creq = read_messages(await read_json(request), new_id("msg_"), ctx.settings)
    msg_id, model, stops = creq.request_id, ctx.backend.resolve(creq.model), creq.sampling.stop
    gen = await runs.start_chat(request, "messages", creq, body.cancel_id, stream=bool(body.stream))
    if body.stream:
        return gen.stream(stream_events(shape(gen.events, body), msg_id, model, stops), beat=PING)
    out = await gen.collect(request, lambda: collect(gen.events))
    if out.error:
        raise GenerationFailed(out.error)
    return JSONResponse(message_body(msg_id, model, out.content, stop_reason(out.finish, stops), out.usage)
                        | hearth_fields(out.finish, out.timings))


async def count_tokens(request: Request) -> Response:
    backend = node(request).backend
    body = validate(CountTokensIn, await read_json(request))
    creq = to_chat_request(body, new_id("msg_"))
    return JSONResponse({"input_tokens": len(await backend.tokenize_prompt(creq))})


ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]


async def unrouted(request: Request) -> Response:
    """A wrong method on the routes above (405), or an unknown /v1/messages/… path (404); the
    error policy answers both in Anthropic's envelope."""
    path = request.url.path
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return respond(path, ApiError(405, f"{request.method} is not allowed on {path}; use POST",
                                      headers={"Allow": "POST"}))
    return respond(path, ApiError(404, f"Unknown endpoint {request.method} {path}"))
