"""Anthropic's answers as Hearth sends them: a message, a token count, the error envelope.
Models for the OpenAPI document and the tests only: the handlers build these as dicts
(`hearth.api.wire` says why)."""

from __future__ import annotations

from typing import Literal

from hearth.api.wire.base import HearthModel, LlamaTimings, ProtocolModel


class AnthropicErrorBody(HearthModel):
    type: str
    message: str


class AnthropicError(HearthModel):
    type: Literal["error"]
    error: AnthropicErrorBody


class AnthropicUsage(ProtocolModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class ContentBlock(ProtocolModel):
    """A text, thinking or tool_use block (Anthropic's shapes; fields by type)."""

    type: str


class AnthropicMessage(ProtocolModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    stop_details: dict[str, str] | None = None  # {"type": "repetition" | "malformed_tool_call", "message"?}
    timings: LlamaTimings | None = None


class TokenCount(ProtocolModel):
    input_tokens: int
