"""Chat Completions serialization of tool calls and reasoning, and request parsing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearth.api.openai.chat import ChatCompletionIn, collect, stream_chunks, to_chat_request
from hearth.chat.types import (
    ChatEvent,
    Done,
    Finish,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from hearth.errors import BadRequest

EVENTS: list[ChatEvent] = [
    Started(5), ReasoningDelta(0, "hmm"), TextDelta(0, ""), ToolCallDelta(0, 0, "call_a", "get", ""),
    ToolCallDelta(0, 0, arguments='{"x": '), ToolCallDelta(0, 0, arguments="1}"),
    ToolCallDelta(0, 1, "call_b", "put", "{}"), Finish(0, "tool_calls"), Done(Usage(5, 9)),
]


async def gen(events: list[ChatEvent]) -> AsyncIterator[ChatEvent]:
    for ev in events:
        yield ev


async def test_message_with_calls_has_null_content_and_reasoning() -> None:
    choices, _, _, _ = await collect(gen(EVENTS), 1)
    msg = choices[0].message()
    assert msg["content"] is None and msg["reasoning_content"] == "hmm"
    assert msg["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "get", "arguments": '{"x": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "put", "arguments": "{}"}}]
    assert choices[0].finish_reason == "tool_calls"


async def test_stream_deltas() -> None:
    raw = [c async for c in stream_chunks(gen(EVENTS), "id", "m", 0, 1, False, False)]
    chunks = [json.loads(c[len(b"data: "):]) for c in raw if c.strip() != b"data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[1] == {"reasoning_content": "hmm"}
    assert deltas[2] == {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "get", "arguments": ""}}]}
    assert deltas[3] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(d.get("content") != "" for d in deltas[1:])  # empty text deltas are not sent


def body(**kw: Any) -> ChatCompletionIn:
    return ChatCompletionIn.model_validate({"messages": [{"role": "user", "content": "x"}], **kw})


def test_request_fields() -> None:
    req = to_chat_request(body(response_format={"type": "json_schema", "json_schema": {
        "name": "c", "schema": {"type": "object"}, "strict": True}}, reasoning_effort="low", reasoning_budget=64,
        parallel_tool_calls=False, grammar='root ::= "a"'), "r")
    assert req.response_format is not None and req.response_format.schema == {"type": "object"}
    assert req.response_format.strict and req.reasoning.effort == "low" and req.reasoning.budget == 64
    assert not req.parallel_tool_calls and req.sampling.grammar == 'root ::= "a"'
    assert to_chat_request(body(response_format={"type": "text"}), "r").response_format is None
    with pytest.raises(BadRequest):
        to_chat_request(body(response_format={"type": "xml"}), "r")
