"""POST /v1/messages and count_tokens in-process: Anthropic's message, its SSE order, its error
envelope from every layer (validation, routing, auth, engine failure), the time cap."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import ANSWER, Harness, parse_sse, past_the_time_cap, serve

BODY = {"model": "fake", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


def anthropic_error(body: dict[str, object], kind: str) -> None:
    assert body["type"] == "error" and body["error"]["type"] == kind, body  # type: ignore[index]
    assert set(body["error"]) == {"type", "message"}  # type: ignore[arg-type]


async def test_message(h: Harness) -> None:
    r = await h.post("/v1/messages", BODY)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["model"] == "fake"
    assert msg["content"] == [{"type": "text", "text": ANSWER}]
    assert msg["stop_reason"] == "end_turn" and msg["usage"]["output_tokens"] == len(ANSWER) + 1


async def test_stream_event_order(h: Harness) -> None:
    events = await h.sse("/v1/messages", BODY)
    # the ping after message_start, then no heartbeat pings (a loaded machine may add some)
    events = events[:2] + [(e, d) for e, d in events[2:] if e != "ping"]
    kinds = [e for e, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta") == ANSWER
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


async def test_count_tokens_matches_the_prompt(h: Harness) -> None:
    r = await h.post("/v1/messages/count_tokens", {k: v for k, v in BODY.items() if k != "max_tokens"})
    counted = r.json()["input_tokens"]
    assert counted == (await h.post("/v1/messages", BODY)).json()["usage"]["input_tokens"]


async def test_every_error_is_in_anthropics_envelope(h: Harness) -> None:
    r = await h.post("/v1/messages", {**BODY, "max_tokens": 0})
    assert r.status_code == 400
    anthropic_error(r.json(), "invalid_request_error")
    r = await h.post("/v1/messages", {**BODY, "model": "nope"})
    assert r.status_code == 404
    anthropic_error(r.json(), "not_found_error")
    r = await h.client.get("/v1/messages")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    anthropic_error(r.json(), "invalid_request_error")
    r = await h.client.post("/v1/messages/batches")
    assert r.status_code == 404
    anthropic_error(r.json(), "not_found_error")


async def test_auth_refusals_are_in_anthropics_envelope(tmp_path: Path) -> None:
    async with serve(tmp_path, api_keys=["k1"]) as h:
        r = await h.post("/v1/messages", BODY)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        anthropic_error(r.json(), "authentication_error")
        r = await h.post("/v1/chat/completions", BODY)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert (await h.post("/v1/messages", BODY, headers={"x-api-key": "k1"})).status_code == 200


async def test_engine_failure_is_a_500_before_the_answer_and_an_error_event_after(h: Harness) -> None:
    assert h.runner is not None
    h.runner.fail_decodes = 1
    r = await h.post("/v1/messages", BODY)
    assert r.status_code == 500
    anthropic_error(r.json(), "api_error")
    h.runner.fail_decodes = 1
    events = await h.sse("/v1/messages", BODY)
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "api_error"


async def test_the_time_cap_stops_with_max_tokens_and_stop_details(tmp_path: Path) -> None:
    async with serve(tmp_path, answer="x" * 2000, request_timeout=0.2) as h:
        msg = (await past_the_time_cap(h, "/v1/messages", {**BODY, "max_tokens": 1500}, 0.2)).json()
        assert (msg["stop_reason"], msg["stop_details"]) == ("max_tokens", {"type": "timeout"})
        events = parse_sse((await past_the_time_cap(h, "/v1/messages", {**BODY, "max_tokens": 1500, "stream": True},
                                                     0.2)).text)
        delta = next(d for e, d in events if e == "message_delta")
        assert delta["delta"]["stop_reason"] == "max_tokens" and delta["stop_details"] == {"type": "timeout"}
