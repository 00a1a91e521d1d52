"""OpenAI's answers as Hearth sends them: Chat Completions, legacy Completions, Responses,
embeddings and the error envelope. Models for the OpenAPI document and the tests only: the
handlers build these as dicts (`hearth.api.wire` says why)."""

from __future__ import annotations

from typing import Any, Literal

from hearth.api.wire.base import HearthModel, LlamaTimings, ProtocolModel, StopReason

# ---- the error envelope ------------------------------------------------------------------------


class OpenAIErrorBody(HearthModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(HearthModel):
    error: OpenAIErrorBody


# ---- Chat Completions and Completions --------------------------------------------------------


class CompletionUsageDetails(ProtocolModel):
    cached_tokens: int


class CompletionUsage(ProtocolModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CompletionUsageDetails | None = None


class FunctionCall(ProtocolModel):
    name: str | None
    arguments: str


class ToolCall(ProtocolModel):
    id: str | None
    type: Literal["function"]
    function: FunctionCall


class TopLogprob(ProtocolModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ProtocolModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(ProtocolModel):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class HearthStopError(ProtocolModel):
    type: Literal["malformed_tool_call"]
    message: str


class ChatChoice(ProtocolModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str
    stop_reason: StopReason | None = None  # the loop detector or the time cap stopped it
    error: HearthStopError | None = None  # a malformed tool call


class ChatCompletion(ProtocolModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: CompletionUsage
    timings: LlamaTimings | None = None


class LegacyLogprobs(ProtocolModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(ProtocolModel):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str
    stop_reason: StopReason | None = None


class TextCompletion(ProtocolModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[TextChoice]
    usage: CompletionUsage
    timings: LlamaTimings | None = None


# ---- Responses ---------------------------------------------------------------------------------


class ResponseUsage(ProtocolModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] | None = None
    output_tokens_details: dict[str, int] | None = None


class ResponseErrorInfo(ProtocolModel):
    code: str
    message: str


class OutputItem(ProtocolModel):
    """A message, reasoning or function_call item (OpenAI's shapes; fields by type)."""

    type: str
    id: str | None = None


class Response(ProtocolModel):
    id: str
    object: Literal["response"]
    created_at: int
    model: str
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    output: list[OutputItem]
    output_text: str | None = None
    incomplete_details: dict[str, Any] | None
    error: ResponseErrorInfo | None
    usage: ResponseUsage | None
    instructions: str | None = None
    metadata: dict[str, Any] | None = None
    previous_response_id: str | None = None
    stop_reason: StopReason | None = None
    timings: LlamaTimings | None = None


class ResponseDeleted(ProtocolModel):
    id: str
    object: Literal["response"]
    deleted: bool


# ---- embeddings (hearth.api.embeddings) --------------------------------------------------------


class EmbeddingItem(ProtocolModel):
    object: str
    index: int
    embedding: list[float] | str  # a string when encoding_format is base64


class EmbeddingUsage(ProtocolModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(ProtocolModel):
    object: str
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage
