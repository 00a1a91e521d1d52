"""The shared run options through the whole app over the scripted runner: the server's loop
detection default, flush control and stream_thinking on a stream, timings on every protocol."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import serve

LOOP = "la " * 60  # the scripted model sings one token over and over


async def test_the_servers_default_stops_a_loop_and_a_request_can_turn_it_off(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=LOOP, repetition_detection=True) as h:
        body = {"messages": [{"role": "user", "content": "sing"}], "max_tokens": 150, "temperature": 0}
        on = (await h.post("/v1/chat/completions", body)).json()
        assert on["choices"][0]["finish_reason"] == "stop" and on["choices"][0]["stop_reason"] == "repetition"
        assert on["usage"]["completion_tokens"] < 100
        off = (await h.post("/v1/chat/completions", {**body, "repetition_detection": False})).json()
        assert "stop_reason" not in off["choices"][0] and off["usage"]["completion_tokens"] >= 150 - 1
        assert on["timings"]["predicted_n"] == on["usage"]["completion_tokens"]


async def test_flush_and_held_reasoning_regroup_the_stream_without_changing_it(tmp_path: Path) -> None:
    answer = "<think>" + "mull " * 10 + "</think>" + "word " * 20
    async with serve(tmp_path, answer=answer) as h:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "temperature": 0}
        whole = (await h.post("/v1/chat/completions", body)).json()["choices"][0]["message"]
        events = await h.sse("/v1/chat/completions", {**body, "stream_thinking": False,
                                                      "stream_options": {"flush_every_n_tokens": 5}})
        deltas = [d["choices"][0]["delta"] for _, d in events if d != "[DONE]" and d["choices"]]
        reasoning = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
        content = [d["content"] for d in deltas if d.get("content")]
        assert reasoning == [whole["reasoning_content"]]  # whole, in one event
        assert "".join(content) == whole["content"]
        # Grouped: after the first event, none but the last carries fewer than 5 tokens (the fake
        # tokenizer is one token a character). How many events that makes depends on how many
        # engine steps reach the loop together (engine/handoff.py), so the count is not asserted.
        assert all(len(c) >= 5 for c in content[1:-1]) and len(content) < len(whole["content"])
        final = [d for _, d in events if d != "[DONE]" and d["choices"] and d["choices"][0]["finish_reason"]]
        assert final[-1]["timings"]["predicted_n"] > 0
        user = [{"role": "user", "content": "hi"}]
        for path, payload in (("/v1/messages", {"messages": user, "max_tokens": 9}),
                              ("/v1/responses", {"input": "hi", "max_output_tokens": 9}),
                              ("/v1/completions", {"prompt": "hi", "max_tokens": 9})):
            payload["temperature"] = 0
            r = (await h.post(path, payload)).json()
            assert r["timings"]["predicted_n"] == 9 and r["timings"]["prompt_n"] + r["timings"]["cache_n"] > 0
