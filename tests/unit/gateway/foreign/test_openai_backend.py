"""openai-kind upstreams: OpenAI chat chunks → events, requests → OpenAI chat, and the whole
translation in-process: an Anthropic client with tools in front of a fake OpenAI engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.chat.types import (
    ChatRequest,
    Finish,
    Message,
    ReasoningDelta,
    SamplingParams,
    TextDelta,
    Tool,
    ToolCallDelta,
)
from hearth.errors import BadRequest, NotFound, TooManyRequests, Unavailable
from hearth.gateway.app import create_gateway_app
from hearth.gateway.foreign.wire import chat_json, chunk_events, refusal, usage_of
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.tenants import ApiKey


def test_chunks_become_events() -> None:
    data = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm", "content": "Hi",
                                               "tool_calls": [{"index": 0, "id": "call_1", "function": {
                                                   "name": "get", "arguments": "{\"a\""}}]},
                         "finish_reason": "tool_calls"}]}
    assert chunk_events(data, completion=False) == [ReasoningDelta(0, "hmm"), TextDelta(0, "Hi"),
                                                    ToolCallDelta(0, 0, "call_1", "get", "{\"a\""),
                                                    Finish(0, "tool_calls")]
    assert chunk_events({"choices": [{"index": 1, "text": "x", "finish_reason": "length"}]}, completion=True) == [
        TextDelta(1, "x"), Finish(1, "length")]
    u = usage_of({"usage": {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}})
    assert u is not None and (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (9, 2, 4)


def test_requests_become_openai_chat() -> None:
    req = ChatRequest("m", [Message("user", "hi"), Message("assistant", "ok", reasoning="thought")],
                      SamplingParams(temperature=0, max_tokens=5, stop=["x"], seed=3),
                      tools=[Tool("get", "fetch", {"type": "object"})], tool_choice="get")
    body = chat_json(req, "upstream-id")
    assert body["model"] == "upstream-id" and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    assert (body["temperature"], body["max_tokens"], body["stop"], body["seed"]) == (0, 5, ["x"], 3)
    assert body["tools"][0]["function"]["name"] == "get"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get"}}


@pytest.mark.parametrize(("status", "kind"), [(400, BadRequest), (404, NotFound), (429, TooManyRequests),
                                              (500, Unavailable)])
def test_upstream_refusals_keep_their_message(status: int, kind: type) -> None:
    e = refusal(status, json.dumps({"error": {"message": "context too long"}}))
    assert isinstance(e, kind) and "context too long" in e.message


def sse(*chunks: dict[str, object]) -> httpx.Response:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


@pytest.fixture
def seen() -> list[httpx.Request]:
    return []


@pytest.fixture
def client(tmp_path: Path, seen: list[httpx.Request]) -> Iterator[TestClient]:
    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "qwen"}]})
        return sse({"choices": [{"index": 0, "delta": {"content": "Let me look."}}]},
                   {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_9", "function": {
                       "name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]}}]},
                   {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 7}})

    up = Upstream(name="gpu", url="http://10.0.0.9:8000", kind="openai", api_key="up-key", models={"q": "qwen"})
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60),
                             transport=httpx.MockTransport(engine))
    with TestClient(app) as c:
        yield c


def test_an_anthropic_client_with_tools_in_front_of_an_openai_engine(client: TestClient,
                                                                     seen: list[httpx.Request]) -> None:
    r = client.post("/v1/messages", headers={"x-api-key": "client-secret", "anthropic-version": "2023-06-01"}, json={
        "model": "q", "max_tokens": 50, "system": "Be brief.",
        "tools": [{"name": "weather", "description": "Weather by city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "Weather in Oslo?"}]})
    assert r.status_code == 200, r.text
    msg = r.json()
    assert len(r.headers.get_list("x-request-id")) == 1
    assert msg["model"] == "q" and msg["stop_reason"] == "tool_use"
    assert msg["content"][0] == {"type": "text", "text": "Let me look."}
    assert msg["content"][1]["type"] == "tool_use" and msg["content"][1]["input"] == {"city": "Oslo"}
    assert msg["usage"]["output_tokens"] == 7
    sent = next(s for s in seen if s.url.path == "/v1/chat/completions")
    body = json.loads(sent.content)
    assert body["model"] == "qwen" and body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["tools"][0]["function"]["name"] == "weather"
    assert sent.headers["authorization"] == "Bearer up-key" and "x-api-key" not in sent.headers


def test_responses_chains_are_kept_by_the_gateway(client: TestClient, seen: list[httpx.Request]) -> None:
    first = client.post("/v1/responses", json={"model": "q", "input": "Weather in Oslo?"}).json()
    second = client.post("/v1/responses", json={"model": "q", "input": "And Bergen?",
                                                "previous_response_id": first["id"]})
    assert second.status_code == 200, second.text
    sent = json.loads([s for s in seen if s.url.path == "/v1/chat/completions"][-1].content)
    contents = [m.get("content") for m in sent["messages"]]
    assert "Weather in Oslo?" in contents and "And Bergen?" in contents  # the chain, replayed by the gateway
    assert client.get(f"/v1/responses/{first['id']}").json()["id"] == first["id"]


def test_token_counting_for_a_foreign_model_is_a_clear_400(client: TestClient) -> None:
    r = client.post("/v1/messages/count_tokens", json={"model": "q", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "not available" in r.json()["error"]["message"]


class _Stalls(httpx.AsyncByteStream):
    """One chunk, then nothing: an engine that stopped with the connection open."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        await asyncio.sleep(60)


def test_a_stall_timeout_set_for_an_openai_upstream_ends_its_stream(tmp_path: Path) -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "qwen"}]})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Stalls())

    # --stall-timeout is for Hearth nodes; an openai upstream has none unless its TOML entry sets one
    up = Upstream(name="gpu", url="http://10.0.0.9:8000", kind="openai", models={"q": "qwen"}, stall_timeout=0.3)
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60),
                             transport=httpx.MockTransport(engine))
    with (TestClient(app) as c,
          c.stream("POST", "/v1/chat/completions", json={"model": "q", "stream": True,
                                                         "messages": [{"role": "user", "content": "x"}]}) as r):
        text = "".join(r.iter_text())
    events = [e for e in text.split("\n\n") if e]
    assert '"Hel"' in text and events[-1] == "data: [DONE]"
    assert "no bytes from the upstream for 0.3 s" in text, text


def test_a_foreign_models_stored_responses_are_their_tenants(tmp_path: Path) -> None:
    """The translating layer has no keys: it acts for the tenant the gateway found
    (gateway/edge/delegate.py), so a stored response of one tenant is another's 404."""
    def engine(request: httpx.Request) -> httpx.Response:
        return sse({"choices": [{"index": 0, "delta": {"content": "Sunny."}, "finish_reason": "stop"}]})

    up = Upstream(name="gpu", url="http://10.0.0.9:8000", kind="openai", api_key="up-key", models={"q": "qwen"})
    keys = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60, named_keys=keys,
                                             admin_key="adm"), transport=httpx.MockTransport(engine))
    alice, bob, admin = ({"Authorization": f"Bearer {k}"} for k in ("ka", "kb", "adm"))
    with TestClient(app) as c:
        first = c.post("/v1/responses", json={"model": "q", "input": "Weather?"}, headers=alice).json()
        assert c.get(f"/v1/responses/{first['id']}", headers=alice).status_code == 200
        assert c.get(f"/v1/responses/{first['id']}", headers=admin).status_code == 200
        assert c.get(f"/v1/responses/{first['id']}", headers=bob).status_code == 404
        r = c.post("/v1/responses", json={"model": "q", "input": "More?", "previous_response_id": first["id"]},
                   headers=bob)
        assert r.status_code == 404, r.text


def test_a_tenant_deletes_only_its_own_foreign_response(tmp_path: Path) -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        return sse({"choices": [{"index": 0, "delta": {"content": "Sunny."}, "finish_reason": "stop"}]})

    up = Upstream(name="gpu", url="http://10.0.0.9:8000", kind="openai", api_key="up-key", models={"q": "qwen"})
    keys = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60, named_keys=keys),
                             transport=httpx.MockTransport(engine))  # no admin key: a tenant deletes its own
    alice, bob = ({"Authorization": f"Bearer {k}"} for k in ("ka", "kb"))
    with TestClient(app) as c:
        rid = c.post("/v1/responses", json={"model": "q", "input": "Weather?"}, headers=alice).json()["id"]
        assert c.delete(f"/v1/responses/{rid}", headers=bob).status_code == 404
        assert c.get(f"/v1/responses/{rid}", headers=alice).status_code == 200
        assert c.delete(f"/v1/responses/{rid}", headers=alice).status_code == 200
        assert c.get(f"/v1/responses/{rid}", headers=alice).status_code == 404


class _StallsUntilClosed(httpx.AsyncByteStream):
    """One chunk, then nothing until the gateway closes the response."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        await self.closed.wait()

    async def aclose(self) -> None:
        self.closed.set()


def test_the_time_cap_on_an_openai_upstream_ends_with_length_named_timeout(tmp_path: Path) -> None:
    """The cap counts from the first generated token and ends the answer as max_tokens would,
    with Hearth's stop reason: here the engine sends one piece, then nothing until the cap."""
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "qwen"}]})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_StallsUntilClosed())

    up = Upstream(name="gpu", url="http://10.0.0.9:8000", kind="openai", models={"q": "qwen"})
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60),
                             transport=httpx.MockTransport(engine))
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", json={"model": "q", "timeout": 0.3,
                                                 "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == "Hel"
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", "timeout")
