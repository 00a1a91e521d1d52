"""The official anthropic SDK (and raw SSE) against a real Hearth server with the real default model."""

from __future__ import annotations

import json
import threading
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Anthropic

from hearth.models import DEFAULT_MODEL_ID
from tests.e2e.test_http import wait_idle
from tests.helpers import EXACT as NO_PREFIX_REUSE
from tests.helpers import Server

pytestmark = pytest.mark.slow

# This SDK has no typed sampling arguments any more (temperature, top_p, top_k): they go in the body.
T0 = {"temperature": 0}
# See test_openai_sdk.py: compare full recomputations only. Also used wherever a test relies on
# what the model writes: recomputed at temperature 0, a prompt takes the same path on every run,
# whatever earlier tests left in the slots.
EXACT = {**T0, **NO_PREFIX_REUSE}
# At temperature 0 the default model writes this story to any max_tokens up to 1,500 without
# stopping (a fixed path, see EXACT), so a run with it lasts until it is cancelled: 1,500 tokens
# are seconds of work on any machine, where the cancels below land within a round trip.
LONG_STORY = "Write a very long story about a dragon."

WEATHER = {"name": "get_weather", "description": "Get the current weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server: Server) -> Anthropic:
    return Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=600)  # a deadline, not speed


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_create(client: Anthropic) -> None:
    m = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=24, system="Answer briefly.",
                               messages=user("What is the capital of France?"), extra_body=T0)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == DEFAULT_MODEL_ID
    assert len(m.content) == 1 and m.content[0].type == "text" and len(m.content[0].text) > 3
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10
    assert 0 < m.usage.output_tokens <= 24 and m.usage.cache_creation_input_tokens == 0


def test_stream_text_and_final_message(client: Anthropic) -> None:
    with client.messages.stream(model=DEFAULT_MODEL_ID, max_tokens=24, extra_body=T0,
                                messages=user("Write a haiku about a warm hearth.")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text) > 10
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


@pytest.mark.parametrize("prompt", ["List three colors.", "Explain what a CPU does in one sentence."])
def test_streamed_text_equals_non_streamed_text_at_temperature_0(client: Anthropic, prompt: str) -> None:
    kw: dict[str, Any] = {"model": DEFAULT_MODEL_ID, "max_tokens": 32, "messages": user(prompt),
                          "extra_body": EXACT}
    full = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in full.content]
    assert final.stop_reason == full.stop_reason
    assert final.usage.output_tokens == full.usage.output_tokens
    assert final.usage.input_tokens == full.usage.input_tokens


def test_stop_sequence(client: Anthropic) -> None:
    m = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=40, extra_body=EXACT,
                               messages=user("Count from 1 to 10, separated by commas."), stop_sequences=["5"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "5"
    assert "5" not in m.content[0].text


def test_beta_query_and_count_tokens_match_a_real_request(client: Anthropic) -> None:
    kw: dict[str, Any] = {"model": DEFAULT_MODEL_ID, "system": [{"type": "text", "text": "Be terse."}],
                          "messages": [*user("Hi"), {"role": "assistant", "content": "Hello!"}, *user("Weather?")],
                          "tools": [WEATHER]}
    counted = client.messages.count_tokens(**kw).input_tokens
    assert client.beta.messages.count_tokens(**kw).input_tokens == counted  # POST ...?beta=true
    m = client.beta.messages.create(max_tokens=4, extra_body=EXACT, **kw)
    assert m.usage.input_tokens == counted and m.usage.cache_read_input_tokens == 0
    cached = client.messages.create(max_tokens=4, **kw)  # the same prompt again: its prefix is reused
    assert cached.usage.input_tokens + (cached.usage.cache_read_input_tokens or 0) == counted
    without_tools = client.messages.count_tokens(**{**kw, "tools": []}).input_tokens
    assert counted > without_tools or counted == without_tools  # SmolLM2's template may ignore tools


def test_tool_result_history_round_trip(client: Anthropic) -> None:
    m = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=24, extra_body=EXACT, tools=[WEATHER], messages=[
        *user("What is the weather in Paris?"),
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C and sunny"}]},
    ])
    assert m.content and m.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_forced_tool_use_then_tool_result(client: Anthropic) -> None:
    # A forced tool_choice is grammar-constrained, so even the tiny model produces a tool_use.
    # EXACT: the streamed call is compared with this one, so both recompute the prompt (the
    # second would otherwise reuse the first's prefix and could differ in the last bits)
    first = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=64, extra_body=EXACT, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   messages=user("What is the weather in Paris?"))
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.id.startswith("toolu_") and call.name == "get_weather" and isinstance(call.input, dict)
    with client.messages.stream(model=DEFAULT_MODEL_ID, max_tokens=64, extra_body=EXACT, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=user("What is the weather in Paris?")) as stream:
        streamed = stream.get_final_message()
    assert next(b for b in streamed.content if b.type == "tool_use").input == call.input
    second = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=24, extra_body=EXACT, tools=[WEATHER],
                                    messages=[*user("What is the weather in Paris?"),
                                              {"role": "assistant", "content": first.content},
                                              {"role": "user", "content": [{"type": "tool_result",
                                                                            "tool_use_id": call.id,
                                                                            "content": "18C and sunny"}]}])
    assert second.content


def test_sdk_error_classes(client: Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=anthropic.omit, messages=user("hi"))
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "max_tokens: Field required"}}
    with pytest.raises(anthropic.BadRequestError, match="no vision"):
        client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "What is this?"}]}])
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="claude-opus-4-7", max_tokens=8, messages=user("hi"))
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="session ids are"):
        client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=8, messages=user("hi"),
                               extra_body={"session_id": "../s1"})
    with pytest.raises(anthropic.ConflictError) as conflict:  # a session's first turn decides its system prompt
        client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=2, messages=user("hi"),
                               extra_body={"session_id": "anthropic-errors"})
        client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=2, messages=user("hi"), system="Other.",
                               extra_body={"session_id": "anthropic-errors"})
    assert conflict.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.count_tokens(model=DEFAULT_MODEL_ID, messages=user("hi"),
                                     thinking={"type": "enabled"})  # type: ignore[typeddict-item]


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/v1/messages", b'{"messages": [}', 400),
    ("POST", "/v1/messages", b"[1]", 400),
    ("POST", "/v1/messages", b'{"max_tokens": "lots", "messages": [{"role": "user", "content": "hi"}]}', 400),
    # a prompt that fills the context alone (a max_tokens past it alone is lowered and served)
    ("POST", "/v1/messages", b'{"max_tokens": 4, "messages": [{"role": "user", "content": "' + b"word " * 20000
     + b'"}]}', 400),
    ("GET", "/v1/messages", None, 405),
    ("DELETE", "/v1/messages/count_tokens", None, 405),
    ("POST", "/v1/messages/batches", b"{}", 404),
])
def test_raw_errors_use_anthropics_envelope(server: Server, method: str, path: str, body: bytes | None,
                                            status: int) -> None:
    r = httpx.request(method, server.url + path, content=body, timeout=60,
                      headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()
    assert err["type"] == "error" and set(err["error"]) == {"type", "message"}
    assert err["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_raw_sse_wire_format(server: Server) -> None:
    body = {"model": DEFAULT_MODEL_ID, "max_tokens": 12, "stream": True, "messages": user("Hi"), **EXACT}
    with httpx.stream("POST", f"{server.url}/v1/messages?beta=true", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    names = [n for n, _ in events]
    assert all(p["type"] == n for n, p in events)
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] > 5
    open_block, seen = None, []
    for n, p in events[2:-2]:
        if n == "ping":  # a heartbeat: on a loaded machine a step can outlast --sse-heartbeat (5 s)
            continue
        if n == "content_block_start":
            assert open_block is None and p["index"] == len(seen)
            open_block = p["index"]
            seen.append(p["content_block"]["type"])
        elif n == "content_block_delta":
            assert p["index"] == open_block and p["delta"]["type"] == "text_delta"
        else:
            assert n == "content_block_stop" and p["index"] == open_block
            open_block = None
    assert open_block is None and seen == ["text"]
    end = events[-2][1]
    assert end["delta"]["stop_reason"] in ("end_turn", "max_tokens") and end["usage"]["output_tokens"] > 0


def test_cancel_by_message_id_ends_the_stream_cleanly(client: Anthropic, server: Server) -> None:
    with client.messages.stream(model=DEFAULT_MODEL_ID, max_tokens=1500, extra_body=EXACT,
                                messages=user(LONG_STORY)) as stream:
        cancelled: list[int] = []
        for ev in stream:
            if ev.type == "message_start":
                msg_id = ev.message.id
            if ev.type == "content_block_delta" and not cancelled:
                r = httpx.post(f"{server.url}/v1/cancel", json={"message_id": msg_id}, timeout=30)
                cancelled.append(r.json()["cancelled"])
        final = stream.get_final_message()
    assert cancelled == [1]
    assert final.stop_reason == "cancelled"  # type: ignore[comparison-overlap]
    assert 0 < final.usage.output_tokens < 1500


def test_cancel_id_on_a_non_streaming_message(client: Anthropic, server: Server) -> None:
    """Cancelled mid-run: the cancel is sent once the server is decoding this message (not raced
    against its registration), and the story cannot end on its own before it lands (LONG_STORY)."""
    wait_idle(server)
    before = server.metric("hearth_generated_tokens_total")
    result: dict[str, Any] = {}

    def run() -> None:
        result["m"] = client.messages.create(model=DEFAULT_MODEL_ID, max_tokens=1500, messages=user(LONG_STORY),
                                             extra_body={**EXACT, "cancel_id": "anthropic-e2e-cancel"})

    t = threading.Thread(target=run)
    t.start()
    server.wait_metric("hearth_generated_tokens_total", lambda v: v > before)
    r = httpx.post(f"{server.url}/v1/cancel", json={"cancel_id": "anthropic-e2e-cancel"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"cancelled": 1}, r.text
    t.join(120)
    assert not t.is_alive()
    m = result["m"]
    assert m.stop_reason == "cancelled" and 0 < m.usage.output_tokens < 1500
