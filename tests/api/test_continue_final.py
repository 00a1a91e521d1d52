"""continue_final_message on every chat protocol: the last message is the assistant's partial
answer and the model goes on writing it. The scripted runner answers by offset from the
assistant header, so a continuation of the first k characters of its answer is exactly the
rest: what the node sends must be that rest, and nothing of the part it was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.api.conftest import ANSWER, Harness, serve

USER = {"role": "user", "content": "hi"}
CUT = 8  # "Hello th" | "ere, friend."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _chat(partial: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"model": "fake", "messages": [USER, {"role": "assistant", **partial}], "continue_final_message": True,
            "temperature": 0, **kw}


def _deltas(events: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    return [d["choices"][0]["delta"] for _, d in events if d != "[DONE]" and d.get("choices")]


async def test_chat_continues_the_partial_answer_with_the_rest_only(h: Harness) -> None:
    whole = (await h.post("/v1/chat/completions", {"model": "fake", "messages": [USER], "temperature": 0})).json()
    r = await h.post("/v1/chat/completions", _chat({"content": ANSWER[:CUT]}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == ANSWER[CUT:]
    # A client's partial answer is input (Anthropic's meaning of a prefill): the prompt with
    # it, the completion only what is new (one token a byte, then EOS).
    assert body["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + CUT
    assert body["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] - CUT
    events = await h.sse("/v1/chat/completions", _chat({"content": ANSWER[:CUT]},
                                                        stream_options={"include_usage": True}))
    assert "".join(d.get("content") or "" for d in _deltas(events)) == ANSWER[CUT:]
    assert [d for _, d in events if d != "[DONE]" and d.get("usage")][-1]["usage"] == body["usage"]


async def test_max_tokens_bounds_the_new_tokens(h: Harness) -> None:
    body = (await h.post("/v1/chat/completions", _chat({"content": ANSWER[:CUT]}, max_tokens=5))).json()
    assert body["choices"][0]["message"]["content"] == ANSWER[CUT:CUT + 5]
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5


async def test_the_gateways_continuation_keeps_the_whole_answers_budget_and_counts(h: Harness) -> None:
    """`partial_is_output` (set by the gateway when it continues a cut stream): the partial part
    is this answer's own output, so the continuation ends where the uncut answer would have,
    with the uncut answer's usage."""
    whole = (await h.post("/v1/chat/completions", {"model": "fake", "messages": [USER], "temperature": 0,
                                                   "max_tokens": 12})).json()
    body = (await h.post("/v1/chat/completions", _chat({"content": ANSWER[:CUT]}, max_tokens=12,
                                                       partial_is_output=True))).json()
    assert ANSWER[:CUT] + body["choices"][0]["message"]["content"] == whole["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
    for k in ("prompt_tokens", "completion_tokens"):
        assert body["usage"][k] == whole["usage"][k]


async def test_chat_without_the_flag_answers_a_new_turn(h: Harness) -> None:
    body = (await h.post("/v1/chat/completions", _chat({"content": ANSWER[:CUT]}, continue_final_message=False)))
    assert body.json()["choices"][0]["message"]["content"] == ANSWER


async def test_chat_refuses_a_conversation_without_a_partial_answer(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", {"model": "fake", "messages": [USER], "continue_final_message": True})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "continue_final_message"


async def test_chat_refuses_a_grammar(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", _chat({"content": "{"}, response_format={"type": "json_object"}))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "continue_final_message"


async def test_chat_continues_a_tool_call_cut_mid_arguments(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=CALL) as h:
        partial = {"content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                  "function": {"name": "get_weather", "arguments": '{"city": "Pa'}}]}
        body = (await h.post("/v1/chat/completions", _chat(partial, tools=TOOLS))).json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        # The call goes on: no new announcement, only the rest of its arguments.
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["arguments"] == 'ris"}'
        events = await h.sse("/v1/chat/completions", _chat(partial, tools=TOOLS))
        calls = [c for d in _deltas(events) for c in d.get("tool_calls") or []]
        assert all("id" not in c and c["index"] == 0 for c in calls)
        assert "".join(c["function"]["arguments"] for c in calls) == 'ris"}'


async def test_messages_prefill_continues_the_final_assistant_message(h: Harness) -> None:
    base = {"model": "fake", "max_tokens": 64, "temperature": 0, "messages": [{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": ANSWER[:CUT]}]}
    r = await h.post("/v1/messages", base)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == [{"type": "text", "text": ANSWER[CUT:]}]
    events = await h.sse("/v1/messages", base)
    assert "".join(d["delta"].get("text", "") for e, d in events if e == "content_block_delta") == ANSWER[CUT:]
    fresh = (await h.post("/v1/messages", {**base, "continue_final_message": False})).json()
    assert fresh["content"][0]["text"] == ANSWER


async def test_a_messages_prefill_is_input_and_max_tokens_bounds_the_new_tokens(h: Harness) -> None:
    """Anthropic's accounting: `max_tokens: 5` after a prefill gives five new tokens, and
    `output_tokens` counts only those; the prefill is input. The gateway's continuation
    (`partial_is_output`) keeps the whole answer's budget and counts."""
    plain = {"model": "fake", "max_tokens": 64, "temperature": 0, "messages": [USER]}
    whole = (await h.post("/v1/messages", plain)).json()
    base = {**plain, "max_tokens": 5, "messages": [USER, {"role": "assistant", "content": ANSWER[:CUT]}]}
    for stream in (False, True):
        if stream:
            events = await h.sse("/v1/messages", base)
            text = "".join(d["delta"].get("text", "") for e, d in events if e == "content_block_delta")
            delta = next(d for e, d in events if e == "message_delta")
            reason, usage = delta["delta"]["stop_reason"], delta["usage"]
        else:
            msg = (await h.post("/v1/messages", base)).json()
            text, reason, usage = msg["content"][0]["text"], msg["stop_reason"], msg["usage"]
        assert (text, reason, usage["output_tokens"]) == (ANSWER[CUT:CUT + 5], "max_tokens", 5)
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
        whole_prompt = sum(whole["usage"][k] for k in ("input_tokens", "cache_read_input_tokens",
                                                       "cache_creation_input_tokens"))
        assert prompt == whole_prompt + CUT
    gw = (await h.post("/v1/messages", {**base, "max_tokens": 12, "partial_is_output": True})).json()
    assert gw["content"][0]["text"] == ANSWER[CUT:12] and gw["usage"]["output_tokens"] == 12


async def test_messages_continue_a_partial_tool_use_block(tmp_path: Path) -> None:
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    async with serve(tmp_path, answer=CALL) as h:
        body = {"model": "fake", "max_tokens": 128, "temperature": 0, "tools": tools, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "partial_json": '{"city": "Pa'}]}]}
        events = await h.sse("/v1/messages", body)
        deltas = [d["delta"] for e, d in events if e == "content_block_delta"]
        assert "".join(x["partial_json"] for x in deltas) == 'ris"}'
        assert [d["delta"]["stop_reason"] for e, d in events if e == "message_delta"] == ["tool_use"]
        misplaced = {**body, "continue_final_message": False}
        r = await h.post("/v1/messages", misplaced)
        assert r.status_code == 400 and "partial_json" in r.text


async def test_responses_continue_the_trailing_output_items(h: Harness) -> None:
    body = {"model": "fake", "continue_final_message": True, "temperature": 0, "input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ANSWER[:CUT]}]}]}
    r = await h.post("/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.json()["output_text"] == ANSWER[CUT:]
    events = await h.sse("/v1/responses", body)
    assert "".join(d["delta"] for e, d in events if e == "response.output_text.delta") == ANSWER[CUT:]
    r = await h.post("/v1/responses", {**body, "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


async def test_a_session_turn_stores_the_continued_answer_whole(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", {**_chat({"content": ANSWER[:CUT]}), "session_id": "cont-1"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == ANSWER[CUT:]
    history = (await h.client.get("/v1/sessions/cont-1/history")).json()["data"]
    assert [(m["role"], m["content"]) for m in history] == [("user", "hi"), ("assistant", ANSWER)]
