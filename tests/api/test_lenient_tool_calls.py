"""Tool calls the model writes without its template's tags (bare or fenced JSON), on every chat
protocol, streamed and not; and the switch that turns them off, per request and per server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import serve

CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
FENCED = f"```json\n{CALL}\n```\n"
ARGS = {"city": "Paris", "unit": "c"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
          "required": ["city"]}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CHAT = {"model": "fake", "messages": USER, "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]}
RESPONSES = {"model": "fake", "input": "Weather in Paris?", "temperature": 0,
             "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]}
MESSAGES = {"model": "fake", "messages": USER, "max_tokens": 200, "temperature": 0,
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}]}


def chat_text(events: list[tuple[str | None, Any]]) -> str:
    return "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-1] if d["choices"])


@pytest.mark.parametrize("answer", [CALL, FENCED])
async def test_chat_takes_a_bare_or_fenced_call(tmp_path: Path, answer: str) -> None:
    async with serve(tmp_path, answer=answer) as h:
        choice = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        [tc] = choice["message"]["tool_calls"]
        assert tc["id"].startswith("call_") and tc["type"] == "function"
        assert tc["function"]["name"] == "get_weather" and json.loads(tc["function"]["arguments"]) == ARGS

        events = await h.sse("/v1/chat/completions", CHAT)
        assert chat_text(events) == ""
        deltas = [d["choices"][0]["delta"] for _, d in events[:-1] if d["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather"
        assert json.loads("".join(c["function"]["arguments"] for c in calls)) == ARGS
        finish = [d["choices"][0]["finish_reason"] for _, d in events[:-1] if d["choices"]]
        assert finish[-1] == "tool_calls"


async def test_chat_parallel_calls_as_a_list(tmp_path: Path) -> None:
    two = json.dumps([{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome")])
    async with serve(tmp_path, answer=two) as h:
        msg = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]["message"]
        assert [json.loads(c["function"]["arguments"])["city"] for c in msg["tool_calls"]] == ["Paris", "Rome"]
        one = (await h.post("/v1/chat/completions", {**CHAT, "parallel_tool_calls": False})).json()
        assert len(one["choices"][0]["message"]["tool_calls"]) == 1


async def test_chat_parallel_calls_one_per_line(tmp_path: Path) -> None:
    """Several bare calls, one per line (the 0.5B coder's parallel calls): calls, streamed or not;
    a line that is not a call keeps the whole answer text, byte for byte."""
    lines = "\n".join(json.dumps({"name": "get_weather", "arguments": {"city": c}}) for c in ("Paris", "Rome"))
    async with serve(tmp_path, answer=lines) as h:
        msg = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]["message"]
        assert [json.loads(c["function"]["arguments"])["city"] for c in msg["tool_calls"]] == ["Paris", "Rome"]
        events = await h.sse("/v1/chat/completions", CHAT)
        calls = [c for _, d in events[:-1] if d["choices"] for c in d["choices"][0]["delta"].get("tool_calls", [])]
        assert [c["index"] for c in calls if c.get("id")] == [0, 1] and chat_text(events) == ""
    mixed = lines + '\n{"name": "get_weather", "arguments": {"city": 7}}'
    async with serve(tmp_path, answer=mixed) as h:
        msg = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]["message"]
        assert msg["content"] == mixed and not msg.get("tool_calls")
        assert chat_text(await h.sse("/v1/chat/completions", CHAT)) == mixed


@pytest.mark.parametrize("answer", [
    '{"name": "get_weather", "arguments": {"unit": "c"}}',  # fails the schema: city is required
    '{"city": "Paris"}',  # a JSON answer
    f"Calling: {CALL}",
    f"```json\n{CALL}\n```\n```json\n{CALL}\n```",
])
async def test_chat_json_that_is_not_a_call_is_the_same_text_streamed_or_not(tmp_path: Path, answer: str) -> None:
    async with serve(tmp_path, answer=answer) as h:
        choice = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] == answer
        assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]
        assert chat_text(await h.sse("/v1/chat/completions", CHAT)) == answer


async def test_chat_switch_off_per_request_and_per_server(tmp_path: Path) -> None:
    off = {**CHAT, "lenient_tool_calls": False}
    async with serve(tmp_path, answer=FENCED) as h:
        choice = (await h.post("/v1/chat/completions", off)).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] == FENCED
        assert chat_text(await h.sse("/v1/chat/completions", off)) == FENCED
        none = {**CHAT, "tool_choice": "none"}
        assert (await h.post("/v1/chat/completions", none)).json()["choices"][0]["message"]["content"] == FENCED
        r = await h.post("/v1/chat/completions", {**CHAT, "lenient_tool_calls": "no"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert r.json()["error"]["param"] == "lenient_tool_calls"
    async with serve(tmp_path, answer=FENCED, lenient_tool_calls=False) as h:
        choice = (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] == FENCED
        on = (await h.post("/v1/chat/completions", {**CHAT, "lenient_tool_calls": True})).json()["choices"][0]
        assert on["finish_reason"] == "tool_calls"


async def test_responses_function_call_item(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=FENCED) as h:
        body = (await h.post("/v1/responses", RESPONSES)).json()
        [item] = body["output"]
        assert (item["type"], item["name"], item["status"]) == ("function_call", "get_weather", "completed")
        assert item["call_id"].startswith("call_") and json.loads(item["arguments"]) == ARGS
        events = await h.sse("/v1/responses", RESPONSES)
        done = events[-1][1]["response"]
        assert [i["type"] for i in done["output"]] == ["function_call"]
        assert not any(d.get("type") == "response.output_text.delta" for _, d in events)
        off = (await h.post("/v1/responses", {**RESPONSES, "lenient_tool_calls": False})).json()
        assert [i["type"] for i in off["output"]] == ["message"] and off["output_text"] == FENCED


async def test_messages_tool_use_block(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=CALL) as h:
        body = (await h.post("/v1/messages", MESSAGES)).json()
        assert body["stop_reason"] == "tool_use"
        [block] = body["content"]
        assert (block["type"], block["name"], block["input"]) == ("tool_use", "get_weather", ARGS)
        assert block["id"]
        events = [d for _, d in await h.sse("/v1/messages", MESSAGES)]
        start = next(e for e in events if e["type"] == "content_block_start")
        assert (start["content_block"]["type"], start["content_block"]["name"]) == ("tool_use", "get_weather")
        assert next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"
        off = (await h.post("/v1/messages", {**MESSAGES, "lenient_tool_calls": False})).json()
        assert off["stop_reason"] == "end_turn" and off["content"] == [{"type": "text", "text": CALL}]
        r = await h.post("/v1/messages", {**MESSAGES, "lenient_tool_calls": 1})
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
