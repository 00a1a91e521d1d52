"""Protocol-neutral requests and events: every API module parses into these and serializes
from them, and every backend consumes and produces them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from hearth.chat.cancel import CancelToken

# Re-exported: the layers above the backends take the engine's sampling, logprob, loop-detection
# and stop types from here.
from hearth.engine.repetition import RepetitionSpec as RepetitionSpec
from hearth.engine.types import InvalidParam as InvalidParam
from hearth.engine.types import SamplingParams as SamplingParams
from hearth.engine.types import StopKind as StopKind
from hearth.engine.types import TokenLogprob as TokenLogprob
from hearth.tenants import OPEN, Caller

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Message:
    role: str
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(slots=True)
class ResponseFormat:
    """Structured output. "text" is free text; "json_object" any JSON object; "json_schema"
    JSON that validates against `schema`. Enforced by grammar-constrained decoding."""

    type: str = "text"  # text | json_object | json_schema
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = False


@dataclass(slots=True)
class ReasoningOptions:
    """How the model may think. `enable` / `effort` reach the chat template (enable_thinking,
    reasoning_effort); `budget` forces the end-of-thinking marker after that many tokens."""

    enable: bool | None = None
    effort: str | None = None  # low | medium | high
    budget: int | None = None


@dataclass(slots=True)
class SessionTurn:
    """A turn in a server-side session (the request carries only the new messages)."""

    session_id: str
    replace_system: bool = False  # a different leading system message replaces the stored one
    discard_thinking: bool = False  # keep the reply's reasoning out of the stored transcript
    wait: bool = True  # wait for a running turn of the same session (else 409 session_busy)
    create: bool = True  # an unknown id creates the session (else 404 session_not_found)
    caller: Caller = OPEN  # who asks: a session of another tenant is not found (hearth.tenants)


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: list[Message]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    tools: list[Tool] = field(default_factory=list)
    # "none" | "auto" | "required" | the name of one function to call; None means "auto"
    tool_choice: str | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning: ReasoningOptions = field(default_factory=ReasoningOptions)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: new_id("req-"))
    timeout: float | None = None  # wall-clock cap in seconds
    cancel: CancelToken | None = None
    cache_prompt: bool = True
    session: SessionTurn | None = None
    # The client's conversation key (prompt_cache_key, Claude Code's session id, Codex's
    # session-id header; docs/api.md says which, in what order): the conversation's KV is kept
    # in priority between turns. None: none sent.
    cache_key: str | None = None
    # Index in `messages` of the last message a client marked with an Anthropic cache_control
    # breakpoint (the prompt up to the end of that message is kept in the durable prompt cache).
    cache_through: int | None = None
    # Set by the session manager, with `messages` the whole transcript: the session's length cap.
    max_len: int | None = None
    repetition: RepetitionSpec | None = None  # loop detection (None: off)
    # In auto mode, also take a call written as bare or fenced JSON, without the template's
    # markers (hearth/chat/tool_parsers/lenient.py): the request's lenient_tool_calls, else the server's.
    lenient_tool_calls: bool = True
    # The last message is the assistant's partial answer: the model continues it
    # (hearth/chat/continuation.py); the events carry only what is new.
    continue_final: bool = False
    # The continued message is this answer's own earlier output (the gateway's stream
    # continuation): its tokens count against max_tokens and as completion tokens. False: a
    # client's prefill, counted as prompt (Anthropic's meaning), max_tokens bounding the new tokens.
    partial_is_output: bool = False
    # The body's cache_salt (vLLM's name): prompts under different salts share no cached KV.
    cache_salt: str | None = None
    # The prompt-cache namespace (hearth.engine.types.EngineRequest.cache_ns): the HTTP layer
    # sets it from the caller's tenant and `cache_salt` (hearth.tenants). "": the default one.
    cache_ns: str = ""
    # Seconds the model stays loaded after this request (Ollama's keep_alive: 0 unloads it at
    # once, negative keeps it); None: the server's --keep-alive.
    keep_alive: float | None = None
    # Who asks, and in which admission class (hearth.engine.fair_share): the protocol sets
    # `priority` to the class the body asks for (None: none), the HTTP layer to the class it runs
    # in (the key's default, capped by its ceiling), with the caller's tenant and weight.
    tenant: str = ""
    weight: float = 1.0
    priority: str | None = None


@dataclass(slots=True)
class CompletionRequest:
    """A raw prompt (text or token ids), no chat template (legacy /v1/completions)."""

    model: str
    prompt: str | list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    request_id: str = field(default_factory=lambda: new_id("req-"))
    timeout: float | None = None
    cancel: CancelToken | None = None
    cache_prompt: bool = True
    repetition: RepetitionSpec | None = None
    cache_ns: str = ""  # as ChatRequest.cache_ns
    keep_alive: float | None = None  # as ChatRequest's
    tenant: str = ""  # these three as ChatRequest's
    weight: float = 1.0
    priority: str | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # prompt tokens written to the prompt cache at breakpoints

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# ---- events ---------------------------------------------------------------------------


@dataclass(slots=True)
class Started:
    """First event of every stream: the prompt is tokenized and admitted to the queue."""

    prompt_tokens: int
    cached_tokens: int = 0


@dataclass(slots=True)
class TextDelta:
    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    n_tokens: int = 0


@dataclass(slots=True)
class ReasoningDelta:
    index: int
    text: str
    n_tokens: int = 0


@dataclass(slots=True)
class ToolCallDelta:
    """A tool call for candidate `index`: announced once with id and name, then arguments."""

    index: int
    call_index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class Finish:
    index: int
    reason: str  # stop | length | tool_calls | cancelled | error
    stop_reason: str | int | None = None
    error: str | None = None  # what went wrong with this candidate (a malformed tool call)


@dataclass(slots=True)
class Timings:
    """Where a run's time went, measured in the backend. The prompt phase runs from the moment
    the request has its slot to its first generated token (prefill plus one sample); the
    generation phase from that token to the last."""

    cached_tokens: int = 0  # prompt tokens reused from the KV cache (not prefilled)
    prompt_tokens: int = 0  # prompt tokens prefilled
    prompt_ms: float = 0.0
    predicted_tokens: int = 0
    predicted_ms: float = 0.0
    cache_tier: str | None = None  # where the cached prefix came from: slot, ram, disk (None: nothing)
    prefill_chunks: int = 0  # prompt chunks the prefill took (chunked prefill: one per engine step)

    def as_llama_server(self) -> dict[str, float | int | str | None]:
        """llama-server's `timings` object, field for field, and Hearth's `cache_tier`."""
        def per_ms(n: int, ms: float) -> float:
            return ms / n if n else 0.0

        def per_s(n: int, ms: float) -> float:
            return n * 1000.0 / ms if ms > 0 else 0.0

        return {"cache_n": self.cached_tokens,
                "prompt_n": self.prompt_tokens, "prompt_ms": round(self.prompt_ms, 3),
                "prompt_per_token_ms": round(per_ms(self.prompt_tokens, self.prompt_ms), 3),
                "prompt_per_second": round(per_s(self.prompt_tokens, self.prompt_ms), 3),
                "predicted_n": self.predicted_tokens, "predicted_ms": round(self.predicted_ms, 3),
                "predicted_per_token_ms": round(per_ms(self.predicted_tokens, self.predicted_ms), 3),
                "predicted_per_second": round(per_s(self.predicted_tokens, self.predicted_ms), 3),
                "cache_tier": self.cache_tier}


@dataclass(slots=True)
class Done:
    """Last event: totals for the whole request."""

    usage: Usage
    error: str | None = None
    timings: Timings | None = None


ChatEvent = Started | TextDelta | ReasoningDelta | ToolCallDelta | Finish | Done
