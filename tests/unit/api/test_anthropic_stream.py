"""The Anthropic serializer fed synthetic ChatEvent sequences: SSE stream and non-streaming body."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearth.api.anthropic.stream import collect, message_body, stop_reason, stream_events, tool_input
from hearth.backends.base import EventStream
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

USAGE = Usage(prompt_tokens=20, completion_tokens=9, cached_tokens=5)


def events(*evs: ChatEvent, boom: bool = False) -> EventStream:
    async def gen() -> AsyncIterator[ChatEvent]:
        for ev in evs:
            yield ev
        if boom:
            raise RuntimeError("engine exploded")

    return EventStream(gen())


async def sse(stream: EventStream, stops: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    out = []
    async for chunk in stream_events(stream, "msg_1", "m", stops or []):
        text = chunk.decode()
        assert text.endswith("\n\n")
        name, data = text.strip().split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]
        out.append((name[7:], payload))
    return out


async def body(stream: EventStream, stops: list[str] | None = None) -> dict[str, Any]:
    out = await collect(stream)
    assert out.error is None
    return message_body("msg_1", "m", out.content, stop_reason(out.finish, stops or []), out.usage)


def replay(evs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rebuild the content the way a client does, checking that blocks never overlap."""
    content: list[dict[str, Any]] = []
    open_index = None
    for name, p in evs:
        if name == "content_block_start":
            assert open_index is None, "a block opened before the previous one closed"
            assert p["index"] == len(content)
            open_index = p["index"]
            content.append(dict(p["content_block"]))
        elif name == "content_block_delta":
            assert p["index"] == open_index
            d, block = p["delta"], content[p["index"]]
            key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}[d["type"]]
            if key == "partial_json":
                block["_json"] = block.get("_json", "") + d[key]
            else:
                block[key] += d[key]
        elif name == "content_block_stop":
            assert p["index"] == open_index
            open_index = None
    assert open_index is None
    for block in content:
        if "_json" in block:
            block["input"] = json.loads(block.pop("_json"))
    return content


async def test_text_stream() -> None:
    evs = await sse(events(Started(20, 5), TextDelta(0, "Hel"), TextDelta(0, ""), TextDelta(0, "lo"),
                           Finish(0, "stop", 2), Done(USAGE)))
    names = [n for n, _ in evs]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"] == "msg_1"
    assert start["usage"] == {"input_tokens": 15, "output_tokens": 0, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 5}
    delta = evs[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 9
    assert replay(evs) == [{"type": "text", "text": "Hello"}]


async def test_thinking_then_text_then_tool_calls() -> None:
    seq = [Started(20), ReasoningDelta(0, "Let me "), ReasoningDelta(0, "think."), TextDelta(0, "Calling."),
           ToolCallDelta(0, 0, "call_a", "get_weather", ""), ToolCallDelta(0, 0, arguments='{"city": '),
           ToolCallDelta(0, 0, arguments='"Paris"}'), ToolCallDelta(0, 1, "toolu_b", "get_time", '{"tz": "UTC"}'),
           Finish(0, "tool_calls"), Done(USAGE)]
    evs = await sse(events(*seq))
    content = replay(evs)
    assert content == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_b", "name": "get_time", "input": {"tz": "UTC"}},
    ]
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"
    full = await body(events(*seq))
    assert full["content"] == content and full["stop_reason"] == "tool_use"
    assert full["usage"] == {"input_tokens": 15, "output_tokens": 9, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 5}


async def test_late_arguments_for_a_closed_tool_call_are_dropped() -> None:
    evs = await sse(events(Started(1), ToolCallDelta(0, 0, "a", "f", "{}"), ToolCallDelta(0, 1, "b", "g", "{}"),
                           ToolCallDelta(0, 0, arguments="x"), Finish(0, "tool_calls"), Done(USAGE)))
    assert [b["name"] for b in replay(evs)] == ["f", "g"]


@pytest.mark.parametrize(("finish", "stops", "want"), [
    (Finish(0, "stop", 2), ["END"], ("end_turn", None)),
    (Finish(0, "stop", "END"), ["END"], ("stop_sequence", "END")),
    (Finish(0, "length"), [], ("max_tokens", None)),
    (Finish(0, "length", "timeout"), [], ("max_tokens", None)),
    (Finish(0, "tool_calls"), [], ("tool_use", None)),
    (Finish(0, "cancelled"), [], ("cancelled", None)),
    (None, [], ("end_turn", None)),
])
def test_stop_reasons(finish: Finish | None, stops: list[str], want: tuple[str, str | None]) -> None:
    assert stop_reason(finish, stops) == want


async def test_stop_sequence_reaches_both_shapes() -> None:
    seq = [Started(3), TextDelta(0, "a"), Finish(0, "stop", "END"), Done(USAGE)]
    evs = await sse(events(*seq), ["END"])
    assert evs[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    full = await body(events(*seq), ["END"])
    assert (full["stop_reason"], full["stop_sequence"]) == ("stop_sequence", "END")


async def test_cancellation_ends_with_a_terminal_message_delta() -> None:
    evs = await sse(events(Started(3), TextDelta(0, "partial"), Finish(0, "cancelled"),
                           Done(Usage(3, 1))))
    assert [n for n, _ in evs][-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert evs[-2][1]["delta"]["stop_reason"] == "cancelled"


async def test_cancelled_while_queued_has_no_blocks() -> None:
    evs = await sse(events(Started(3), Finish(0, "cancelled"), Done(Usage(3))))
    assert [n for n, _ in evs] == ["message_start", "ping", "message_delta", "message_stop"]


async def test_generation_error_is_an_error_event_and_nothing_after() -> None:
    evs = await sse(events(Started(3), TextDelta(0, "x"), Finish(0, "error"), Done(Usage(3, 1), error="decode failed")))
    assert [n for n, _ in evs][-2:] == ["content_block_stop", "error"]
    assert evs[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "decode failed"}}
    out = await collect(events(Started(3), Finish(0, "error"), Done(Usage(3), error="decode failed")))
    assert out.error == "decode failed"


async def test_an_exception_mid_stream_becomes_an_error_event() -> None:
    evs = await sse(events(Started(3), TextDelta(0, "x"), boom=True))
    assert evs[-1][0] == "error" and evs[-1][1]["error"]["message"] == "internal server error"


async def test_stream_closes_the_event_stream() -> None:
    closed = []
    stream = events(Started(1), Done(Usage(1)))
    stream.on_close(lambda: closed.append(True))
    await sse(stream)
    assert closed == [True]


def test_tool_input_keeps_what_is_not_an_object() -> None:
    assert tool_input('{"a": 1}') == {"a": 1}
    assert tool_input("") == {}
    assert tool_input("[1, 2]") == {"arguments": "[1, 2]"}
    assert tool_input('{"a": ') == {"arguments": '{"a": '}
