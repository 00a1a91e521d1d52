"""Ollama's request and answer mapping (hearth/api/ollama): bodies into ChatRequest and
CompletionRequest, events into NDJSON lines and whole answers, fed whole and streamed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearth.api.ollama.bodies import chat_request, generate_request, read_chat, read_generate
from hearth.api.ollama.replies import Clock, gather, stream_lines
from hearth.chat.types import (
    ChatEvent,
    CompletionRequest,
    Done,
    Finish,
    ReasoningDelta,
    Started,
    TextDelta,
    Timings,
    ToolCallDelta,
    Usage,
)
from hearth.errors import BadRequest
from hearth.protocols import ollama_names as names

USER = [{"role": "user", "content": "Hi"}]


def chat(**body: Any) -> Any:
    return chat_request(read_chat({"model": "m", "messages": USER, **body}), "m", "id")


def test_options_become_the_sampler() -> None:
    req = chat(options={"temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "num_predict": 12,
                        "stop": ["x", "y"], "repeat_penalty": 1.2, "repeat_last_n": 32, "presence_penalty": 0.5,
                        "frequency_penalty": 0.25, "num_ctx": 4096, "num_gpu": 1, "mirostat": 0})
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.max_tokens) == (0, 0.5, 7, 0.1, 42, 12)
    assert (s.stop, s.repetition_penalty, s.penalty_last_n) == (["x", "y"], 1.2, 32)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, 0.25)


def test_ollama_sentinels_mean_the_default() -> None:
    s = chat(options={"seed": -1, "num_predict": -1}).sampling
    assert s.seed is None and s.max_tokens is None
    assert chat(options={"num_predict": -2}).sampling.max_tokens is None
    assert chat(options={"stop": "END"}).sampling.stop == ["END"]


@pytest.mark.parametrize(("options", "param"), [
    ({"temperature": -1}, "options.temperature"), ({"num_predict": 0}, "options.num_predict"),
    ({"top_p": 2}, "options.top_p"), ({"repeat_penalty": 0}, "options.repetition_penalty"),
])
def test_bad_options_name_the_field(options: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        chat(options=options)
    assert e.value.param == param and e.value.status == 400


def test_format_think_keep_alive_and_tools() -> None:
    assert chat(format="json").response_format.type == "json_object"  # type: ignore[union-attr]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = chat(format=schema).response_format
    assert rf is not None and (rf.type, rf.schema) == ("json_schema", schema)
    assert chat(format="").response_format is None
    with pytest.raises(BadRequest):
        chat(format="yaml")
    assert chat(think=True).reasoning.enable is True and chat(think=False).reasoning.enable is False
    r = chat(think="high").reasoning
    assert (r.enable, r.effort) == (True, "high")
    assert chat(keep_alive="5m").keep_alive == 300 and chat(keep_alive=-1).keep_alive == float("inf")
    assert chat(keep_alive=0).keep_alive == 0
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert [t.name for t in chat(tools=tools).tools] == ["get_weather"]


def test_a_tool_result_is_matched_to_its_call_by_name() -> None:
    req = chat(messages=[*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}])
    call = req.messages[1].tool_calls[0]  # type: ignore[index]
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert req.messages[2].role == "tool" and req.messages[2].tool_call_id == call.id
    assert req.messages[2].name == "get_weather"


def test_images_are_refused() -> None:
    with pytest.raises(BadRequest, match="images"):
        chat(messages=[{"role": "user", "content": "what is this", "images": ["aGk="]}])
    with pytest.raises(BadRequest, match="images"):
        generate_request(read_generate({"model": "m", "prompt": "x", "images": ["aGk="]}), "m", "id")


def test_generate_with_and_without_template() -> None:
    req = generate_request(read_generate({"model": "m", "prompt": "Hi", "system": "Be brief"}), "m", "id")
    assert not isinstance(req, CompletionRequest)
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief"), ("user", "Hi")]
    raw = generate_request(read_generate({"model": "m", "prompt": "Once", "raw": True}), "m", "id")
    assert isinstance(raw, CompletionRequest) and raw.prompt == "Once"
    for bad in ({"suffix": "end"}, {"template": "{{ .Prompt }}"}, {"context": [1, 2]},
                {"raw": True, "format": "json"}):
        with pytest.raises(BadRequest):
            generate_request(read_generate({"model": "m", "prompt": "x", **bad}), "m", "id")


def test_names_take_ollama_tags() -> None:
    assert names.candidates("smollm2:latest") == ["smollm2:latest", "smollm2"]
    assert names.candidates("qwen2.5-coder:0.5b") == ["qwen2.5-coder:0.5b", "qwen2.5-coder-0.5b"]
    assert names.candidates("plain") == ["plain"]
    assert names.tagged("plain") == "plain:latest" and names.tagged("a:b") == "a:b"
    assert names.timestamp().endswith("000Z")


# ---- answers -------------------------------------------------------------------------------

EVENTS: list[ChatEvent] = [
    Started(5), ReasoningDelta(0, "Let me "), ReasoningDelta(0, "think."), TextDelta(0, "Hel"), TextDelta(0, ""),
    TextDelta(0, "lo"), ToolCallDelta(0, 0, "call_1", "get_weather", ""), ToolCallDelta(0, 0, arguments='{"city"'),
    ToolCallDelta(0, 0, arguments=': "Paris"}'), Finish(0, "tool_calls"),
    Done(Usage(5, 4), timings=Timings(prompt_tokens=5, prompt_ms=2.5, predicted_tokens=4, predicted_ms=10.0)),
]


async def _events(events: list[ChatEvent]) -> AsyncIterator[ChatEvent]:
    for ev in events:
        yield ev


def _stream(events: list[ChatEvent], kind: Any) -> list[dict[str, Any]]:
    async def run() -> list[bytes]:
        return [b async for b in stream_lines(_events(events), kind, "m:latest", Clock())]
    chunks = asyncio.run(run())
    assert all(c.endswith(b"\n") and c.count(b"\n") == 1 for c in chunks)  # one object a line
    return [json.loads(c) for c in chunks]


def _whole(events: list[ChatEvent], kind: Any) -> dict[str, Any]:
    return asyncio.run(gather(_events(events))).body(kind, "m:latest", Clock())


def test_chat_streamed_equals_whole() -> None:
    lines, whole = _stream(EVENTS, "chat"), _whole(EVENTS, "chat")
    assert all(not ln["done"] for ln in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(ln["message"]["content"] for ln in lines) == whole["message"]["content"] == "Hello"
    assert "".join(ln["message"].get("thinking", "") for ln in lines) == whole["message"]["thinking"]
    [with_calls] = [ln for ln in lines if "tool_calls" in ln["message"]]
    assert with_calls["message"]["tool_calls"] == whole["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    final = lines[-1]
    for key in ("done_reason", "prompt_eval_count", "eval_count", "prompt_eval_duration", "eval_duration"):
        assert final[key] == whole[key], key
    assert (final["done_reason"], final["prompt_eval_count"], final["eval_count"]) == ("stop", 5, 4)
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (2_500_000, 10_000_000)
    assert final["total_duration"] >= 0 and final["load_duration"] == 0
    assert lines[0]["model"] == "m:latest" and "created_at" in lines[0]


def test_generate_lines_carry_response_and_thinking() -> None:
    events = [e for e in EVENTS if not isinstance(e, ToolCallDelta)]
    lines, whole = _stream(events, "generate"), _whole(events, "generate")
    assert "".join(ln["response"] for ln in lines) == whole["response"] == "Hello"
    assert "".join(ln.get("thinking", "") for ln in lines) == whole["thinking"] == "Let me think."
    assert "message" not in whole


def test_an_error_ends_the_stream_with_an_error_line() -> None:
    lines = _stream([Started(1), TextDelta(0, "a"), Finish(0, "error"), Done(Usage(1, 1), error="decode failed")],
                    "chat")
    assert lines[-1] == {"error": "decode failed"}


def test_length_and_a_model_unloaded_at_arrival() -> None:
    events: list[ChatEvent] = [Started(1), TextDelta(0, "a"), Finish(0, "length"),
                               Done(Usage(1, 1), timings=Timings(prompt_ms=1.0, predicted_ms=1.0))]
    whole = asyncio.run(gather(_events(events))).body("chat", "m", Clock(arrived=0.0, was_loaded=False))
    assert whole["done_reason"] == "length" and whole["load_duration"] > 0


def test_malformed_arguments_become_an_empty_object() -> None:
    events: list[ChatEvent] = [Started(1), ToolCallDelta(0, 0, "c", "f", "{not json"),
                               Finish(0, "tool_calls", error="malformed tool call"), Done(Usage(1, 1))]
    whole = _whole(events, "chat")
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == {}
    assert whole["error"]["type"] == "malformed_tool_call"
