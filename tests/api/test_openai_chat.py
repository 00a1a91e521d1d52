"""POST /v1/chat/completions in-process: envelope, SSE order, errors, failures, time cap."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import ANSWER, Harness, past_the_time_cap, serve
from tests.helpers import sample

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


async def test_envelope(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "fake"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": ANSWER, "refusal": None},
                                "logprobs": None, "finish_reason": "stop"}]
    usage = body["usage"]
    assert usage["completion_tokens"] == len(ANSWER) + 1  # one byte per token, then EOS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert r.headers["x-request-id"]


async def test_stream_event_order_and_same_text(h: Harness) -> None:
    events = await h.sse("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
    datas = [d for _, d in events]
    assert datas[-1] == "[DONE]"
    chunks = datas[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ANSWER) + 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == ANSWER == (await h.post("/v1/chat/completions", CHAT)).json()["choices"][0]["message"]["content"]


async def test_tool_call_round_trip(tmp_path: Path) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    async with serve(tmp_path, answer=call) as h:
        body = (await h.post("/v1/chat/completions", {**CHAT, "tools": tools})).json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        [tc] = choice["message"]["tool_calls"]
        assert tc["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        events = await h.sse("/v1/chat/completions", {**CHAT, "tools": tools})
        deltas = [d["choices"][0]["delta"] for _, d in events[:-1] if d["choices"]]
        announced = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
        assert announced[0]["function"]["name"] == "get_weather"
        args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d)
        assert args == '{"city": "Paris"}'


async def test_errors_are_openai_envelopes_with_param(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", {**CHAT, "temperature": 500})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "temperature must be between 0 and 100", "type": "invalid_request_error",
                                 "param": "temperature", "code": "invalid_request_error"}
    r = await h.post("/v1/chat/completions", {**CHAT, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"
    r = await h.post("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 3000}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "messages"
    r = await h.client.post("/v1/chat/completions", content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = await h.client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Unknown endpoint GET /v1/nothing"


async def test_engine_failure_is_a_500_before_the_answer_and_in_band_after(h: Harness) -> None:
    assert h.runner is not None
    h.runner.fail_decodes = 1
    r = await h.post("/v1/chat/completions", CHAT)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "generation_failed" and r.json()["error"]["type"] == "server_error"
    h.runner.fail_decodes = 1
    events = await h.sse("/v1/chat/completions", CHAT)
    assert events[-1][1] == "[DONE]"
    assert events[-2][1]["error"]["code"] == "generation_failed"
    assert (await h.post("/v1/chat/completions", CHAT)).status_code == 200  # the engine lives on


async def test_the_time_cap_ends_with_length_and_stop_reason_timeout(tmp_path: Path) -> None:
    """A finish reason the SDKs know (`length`), named by Hearth's `stop_reason`; on completions too."""
    async with serve(tmp_path, answer="x" * 5000, request_timeout=0.2) as h:
        body = (await past_the_time_cap(h, "/v1/chat/completions", {**CHAT, "max_tokens": 1500}, 0.2)).json()
        choice = body["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", "timeout")
        assert 0 < body["usage"]["completion_tokens"] < 1500
        metrics = (await h.client.get("/metrics")).text
        assert sample(metrics, 'hearth_cancellations_total{cause="timeout"}') == 1
        prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        body = (await past_the_time_cap(h, "/v1/completions", {"model": "fake", "prompt": prompt,
                                                               "max_tokens": 1500, "temperature": 0}, 0.2)).json()
        choice = body["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", "timeout")
