"""The Responses assembler and SSE serializer, fed synthetic ChatEvents."""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import AsyncIterator
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent

from hearth.api.openai.responses_stream import ResponseAssembler, collect, sse_events
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

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
# The SDK's event classes by their `type`, to validate what we send against what it expects.
SDK_EVENTS = {typing.get_args(c.model_fields["type"].annotation)[0]: c
              for c in typing.get_args(typing.get_args(ResponseStreamEvent)[0])}


def skeleton() -> dict[str, Any]:
    return {"id": "resp_" + "0" * 32, "object": "response", "created_at": 1, "model": "m", "instructions": None,
            "metadata": {}, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "temperature": 0.0,
            "top_p": 1.0, "text": {"format": {"type": "text"}}, "previous_response_id": None, "store": False}


async def _aiter(events: list[ChatEvent]) -> AsyncIterator[ChatEvent]:
    for ev in events:
        yield ev


def stream(events: list[ChatEvent]) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    ended: list[dict[str, Any]] = []

    async def run() -> list[bytes]:
        return [b async for b in sse_events(_aiter(events), ResponseAssembler(skeleton()), ended.append)]

    body = b"".join(asyncio.run(run())).decode()
    out = []
    for block in body.strip().split("\n\n"):
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == event_line[7:]
        out.append((data["type"], data))
    assert len(ended) == 1
    return out, ended[0]


def non_streamed(events: list[ChatEvent]) -> dict[str, Any]:
    return asyncio.run(collect(_aiter(events), ResponseAssembler(skeleton())))


def check_sequence(events: list[tuple[str, dict[str, Any]]], strict: bool = True) -> None:
    seqs = [d["sequence_number"] for _, d in events]
    assert seqs == list(range(len(events)))
    assert [t for t, _ in events][:2] == ["response.created", "response.in_progress"]
    assert sum(t in TERMINAL for t, _ in events) == 1 and events[-1][0] in TERMINAL
    for type_, data in events:
        if strict or type_ not in TERMINAL:
            SDK_EVENTS[type_].model_validate(data)


TEXT = [Started(10, 4), TextDelta(0, "Hel", n_tokens=1), TextDelta(0, "lo", n_tokens=1), Finish(0, "stop"),
        Done(Usage(10, 2, 4))]


def test_text_stream_and_the_final_object() -> None:
    events, final = stream(TEXT)
    check_sequence(events)
    assert [t for t, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    resp = events[-1][1]["response"]
    assert resp == final
    assert resp["status"] == "completed" and resp["output_text"] == "Hello" and resp["completed_at"]
    assert resp["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                             "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 12}
    (item,) = resp["output"]
    assert item["type"] == "message" and item["status"] == "completed" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]
    assert events[2][1]["item"]["status"] == "in_progress" and events[2][1]["item"]["content"] == []
    Response.model_validate(resp)
    assert non_streamed(TEXT)["output"][0]["content"] == item["content"]


def test_reasoning_then_text_then_tool_calls() -> None:
    evs: list[ChatEvent] = [
        Started(5), ReasoningDelta(0, "think"), ReasoningDelta(0, "ing"), TextDelta(0, "Let me check."),
        ToolCallDelta(0, 0, id="call_a", name="get"), ToolCallDelta(0, 0, arguments='{"x":'),
        ToolCallDelta(0, 0, arguments="1}"), ToolCallDelta(0, 1, id="call_b", name="put", arguments="{}"),
        Finish(0, "tool_calls"), Done(Usage(5, 9))]
    events, final = stream(evs)
    check_sequence(events)
    types = [t for t, _ in events]
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    assert types.count("response.function_call_arguments.done") == 2
    assert final["status"] == "completed"
    rs, msg, fc1, fc2 = final["output"]
    assert rs["type"] == "reasoning" and rs["id"].startswith("rs_") and rs["summary"] == []
    assert rs["content"] == [{"type": "reasoning_text", "text": "thinking"}]
    assert msg["content"][0]["text"] == "Let me check."
    assert (fc1["type"], fc1["call_id"], fc1["name"], fc1["arguments"], fc1["status"]) == (
        "function_call", "call_a", "get", '{"x":1}', "completed")
    assert fc1["id"].startswith("fc_") and (fc2["call_id"], fc2["arguments"]) == ("call_b", "{}")
    assert [d["output_index"] for t, d in events if t == "response.output_item.added"] == [0, 1, 2, 3]
    assert final["output_text"] == "Let me check."
    Response.model_validate(final)
    assert [i["type"] for i in non_streamed(evs)["output"]] == ["reasoning", "message", "function_call",
                                                                "function_call"]


def test_outcomes() -> None:
    def outcome(reason: str, error: str | None = None) -> dict[str, Any]:
        events, final = stream([Started(3), TextDelta(0, "a", n_tokens=1), Finish(0, reason),
                                Done(Usage(3, 1), error=error)])
        # incomplete_details.reason "cancelled" is Hearth's own: the SDK's Literal lacks it
        check_sequence(events, strict=reason != "cancelled")
        assert events[-1][1]["response"] == final
        return final

    r = outcome("length")
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["status"] == "incomplete"
    r = outcome("cancelled")
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "cancelled"}
    r = outcome("error", "engine exploded")
    assert r["status"] == "failed" and r["error"] == {"code": "server_error", "message": "engine exploded"}


def test_a_stream_that_breaks_still_ends_with_one_failed_event() -> None:
    async def broken() -> AsyncIterator[ChatEvent]:
        yield Started(3)
        yield TextDelta(0, "a")
        raise RuntimeError("boom")

    ended: list[dict[str, Any]] = []

    async def run() -> bytes:
        return b"".join([b async for b in sse_events(broken(), ResponseAssembler(skeleton()), ended.append)])

    body = asyncio.run(run()).decode()
    assert body.count("event: response.failed") == 1 and "event: response.completed" not in body
    assert "RuntimeError: boom" in ended[0]["error"]["message"]


def test_a_client_that_leaves_records_a_cancelled_response() -> None:
    ended: list[dict[str, Any]] = []

    async def run() -> None:
        gen = sse_events(_aiter(TEXT), ResponseAssembler(skeleton()), ended.append)
        await gen.__anext__()
        await gen.aclose()

    asyncio.run(run())
    assert ended[0]["status"] == "incomplete" and ended[0]["incomplete_details"] == {"reason": "cancelled"}


def test_a_call_to_a_namespaced_tool_names_its_namespace() -> None:
    """Codex declares its sub-agent tools inside a namespace and expects calls back with
    `namespace` and the inner name."""
    asm = ResponseAssembler(skeleton(), namespaced={"close_agent": ("multi_agent_v1", "close_agent")})
    for ev in [Started(3), ToolCallDelta(0, 0, "call_1", "close_agent", '{"id": "a"}'),
               ToolCallDelta(0, 1, "call_2", "exec_command", "{}"), Finish(0, "tool_calls"), Done(Usage(3, 9))]:
        asm.feed(ev)
    asm.finish()
    first, second = asm.response["output"]
    assert (first["name"], first["namespace"], first["arguments"]) == ("close_agent", "multi_agent_v1", '{"id": "a"}')
    assert second["name"] == "exec_command" and "namespace" not in second
