"""Issue 23's wire fixes, in process: Responses item references resolved from the store, an
orphan function_call_output refused, explicit nulls taken as the default on every protocol,
/tokenize counting tools as chat does, Anthropic's earlier `output_format`, and the unknown
model's 404 as OpenAI types it (node and gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.api.anthropic.messages import MessagesIn
from hearth.api.anthropic.messages import to_chat_request as anthropic_request
from hearth.engine.fake_runner import FakeSampler
from hearth.engine.types import SamplingParams
from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from tests.api.conftest import ANSWER, Harness, serve
from tests.fakes import SMOL, scripted_backend

USER = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
QWEN = (Path(__file__).parents[1] / "fixtures" / "templates" / "qwen2.5-coder-0.5b-instruct.jinja").read_text()


def openai_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    return err


def prompt_seen(h: Harness) -> str:
    """The longest prompt in the fake model's KV, as text."""
    assert h.runner is not None
    return max((bytes(t for t in kv if t < 256).decode(errors="replace") for kv in h.runner.kv.values()), key=len)


# ---- Responses: item references -------------------------------------------------------------


async def first_answer(h: Harness, **body: Any) -> dict[str, Any]:
    r = await h.post("/v1/responses", {"input": "Say hello.", "temperature": 0, **body})
    assert r.status_code == 200, r.text
    resp: dict[str, Any] = r.json()
    return resp


@pytest.mark.parametrize("reference", [lambda i: {"type": "item_reference", "id": i}, lambda i: {"id": i}])
async def test_an_item_reference_is_the_stored_item(h: Harness, reference: Any) -> None:
    """What the AI SDK's default provider sends for an earlier assistant turn: the model sees
    that turn's text, exactly as if the client had sent the item itself."""
    [item] = (await first_answer(h))["output"]
    assert item["id"].startswith("msg_")
    turn = [{"role": "user", "content": "Say hello."}, reference(item["id"]), {"role": "user", "content": "Again."}]
    r = await h.post("/v1/responses", {"input": turn, "temperature": 0})
    assert r.status_code == 200, r.text
    assert "Say hello." in prompt_seen(h) and ANSWER + "<|im_end|>\n<|im_start|>user\nAgain." in prompt_seen(h)
    spelled = [turn[0], {"role": "assistant", "content": ANSWER}, turn[2]]
    same = (await h.post("/v1/responses", {"input": spelled, "temperature": 0})).json()
    assert r.json()["usage"]["input_tokens"] == same["usage"]["input_tokens"]
    # the resolved item is what the response keeps: a later turn replays it
    later = await h.post("/v1/responses", {"input": "More.", "previous_response_id": r.json()["id"],
                                           "max_output_tokens": 2})
    assert later.status_code == 200 and later.json()["usage"]["input_tokens"] > same["usage"]["input_tokens"]


async def test_an_unknown_or_unstored_item_is_a_404(h: Harness) -> None:
    unstored = (await first_answer(h, store=False))["output"][0]["id"]
    deleted = await first_answer(h)
    assert (await h.client.delete(f"/v1/responses/{deleted['id']}")).status_code == 200
    for item_id in ("msg_0123", unstored, deleted["output"][0]["id"]):
        r = await h.post("/v1/responses", {"input": [{"role": "user", "content": "x"},
                                                     {"type": "item_reference", "id": item_id}]})
        err = openai_error(r, 404, "input")
        assert item_id in err["message"] and "store: false" in err["message"] and err["message"].startswith("input[1]")
    r = await h.post("/v1/responses", {"input": [{"type": "item_reference", "id": 7}]})
    openai_error(r, 400, "input[0].id")


# ---- Responses: function_call_output answers a call ------------------------------------------


CALL = {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_a", "output": "sunny"}
RTOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]  # type: ignore[index]


async def test_an_orphan_function_call_output_is_a_400(greedy: Harness) -> None:
    h = greedy
    r = await h.post("/v1/responses", {"input": [{"role": "user", "content": "Weather?"}, OUTPUT], "tools": RTOOLS})
    err = openai_error(r, 400, "input")
    assert err["type"] == "invalid_request_error" and "call_a" in err["message"]
    r = await h.post("/v1/responses", {"input": [{"role": "user", "content": "Weather?"}, CALL, OUTPUT],
                                       "tools": RTOOLS})
    assert r.status_code == 200, r.text
    # the call may be in the replayed chain
    first = await h.post("/v1/responses", {"input": [{"role": "user", "content": "Weather?"}, CALL], "tools": RTOOLS})
    r = await h.post("/v1/responses", {"input": [OUTPUT], "tools": RTOOLS, "previous_response_id": first.json()["id"]})
    assert r.status_code == 200, r.text


# ---- explicit null is the default --------------------------------------------------------------


def _comparable(value: Any) -> Any:
    """An answer without what differs between two identical requests (ids, clocks, the cache)."""
    varying = {"id", "created", "created_at", "completed_at", "timings", "cached_tokens", "cache_read_input_tokens",
               "cache_creation_input_tokens"}
    if isinstance(value, dict):
        if "cache_read_input_tokens" in value:  # Anthropic's input_tokens leaves out what the cache held
            value = {**value, "input_tokens": value["input_tokens"] + value["cache_read_input_tokens"]
                     + (value.get("cache_creation_input_tokens") or 0)}
        return {k: _comparable(v) for k, v in value.items() if k not in varying}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


CHAT = {"messages": USER, "max_tokens": 8}
RESPONSES = {"input": "hi", "max_output_tokens": 8}
COMPLETIONS = {"prompt": "hi", "max_tokens": 8}
MESSAGES = {"messages": USER, "max_tokens": 8}
NULLS = [
    *(("/v1/chat/completions", CHAT, f) for f in (
        "n", "stream", "parallel_tool_calls", "temperature", "top_p", "stop", "max_completion_tokens", "seed",
        "logprobs", "top_logprobs", "tool_choice", "tools", "response_format", "stream_options", "user",
        "presence_penalty", "frequency_penalty", "logit_bias", "reasoning_effort", "metadata", "store",
        "service_tier", "cache_prompt", "stream_thinking", "chat_template_kwargs")),
    *(("/v1/responses", RESPONSES, f) for f in (
        "store", "stream", "parallel_tool_calls", "background", "truncation", "instructions", "tools",
        "tool_choice", "text", "reasoning", "metadata", "temperature", "top_p", "previous_response_id", "user",
        "conversation", "top_logprobs", "service_tier", "include", "prompt_cache_key", "stop", "seed")),
    *(("/v1/completions", COMPLETIONS, f) for f in (
        "stream", "n", "echo", "logprobs", "suffix", "stop", "seed", "temperature", "top_p", "best_of", "user",
        "presence_penalty", "frequency_penalty", "logit_bias", "stream_options")),
    ("/v1/completions", {"prompt": "hi"}, "max_tokens"),
    *(("/v1/messages", MESSAGES, f) for f in (
        "stream", "system", "stop_sequences", "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata",
        "thinking", "service_tier", "output_config", "output_format", "container", "cache_prompt")),
]


@pytest.fixture
async def greedy(tmp_path: Path) -> AsyncIterator[Harness]:
    """The scripted model decoding greedily whatever the request asks, so two requests that
    differ only in a null get the same answer."""
    async with serve(tmp_path) as h:
        runner = h.runner
        assert runner is not None

        def new_sampler(params: SamplingParams) -> FakeSampler:
            return FakeSampler(runner, replace(params, temperature=0.0))

        runner.new_sampler = new_sampler  # type: ignore[method-assign]
        yield h


@pytest.mark.parametrize(("path", "body", "field"), NULLS, ids=[f"{p}:{f}" for p, _, f in NULLS])
async def test_null_is_the_default(greedy: Harness, path: str, body: dict[str, Any], field: str) -> None:
    omitted = await greedy.post(path, body)
    null = await greedy.post(path, {**body, field: None})
    assert omitted.status_code == 200, omitted.text
    assert null.status_code == 200, null.text
    assert _comparable(null.json()) == _comparable(omitted.json())


async def test_null_in_nested_objects_is_the_default(h: Harness) -> None:
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": None, "type": None, "function": {"name": "get_weather", "arguments": None}}]},
        {"role": "user", "content": "ok"}], "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": None, "parameters": None}}], "max_tokens": 4}
    assert (await h.post("/v1/chat/completions", body)).status_code == 200
    block = {"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "is_error": None}
    body = {"max_tokens": 4, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
        {"role": "user", "content": [block]}], "tool_choice": {"type": "auto", "disable_parallel_tool_use": None}}
    assert (await h.post("/v1/messages", body)).status_code == 200


async def test_a_required_field_given_null_is_still_a_400(h: Harness) -> None:
    openai_error(await h.post("/v1/chat/completions", {"messages": None}), 400, "messages")
    r = await h.post("/v1/responses", {"input": None})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input")
    r = await h.post("/v1/messages", {"messages": USER, "max_tokens": None})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


async def test_the_openapi_document_shows_those_fields_nullable(h: Harness) -> None:
    schemas = (await h.client.get("/openapi.json")).json()["components"]["schemas"]
    for model, field in (("ChatCompletionIn", "n"), ("ChatCompletionIn", "parallel_tool_calls"),
                         ("ResponsesIn", "store"), ("ResponsesIn", "background"), ("CompletionIn", "max_tokens"),
                         ("MessagesIn", "stream")):
        prop = schemas[model]["properties"][field]
        assert {"type": "null"} in prop["anyOf"] and "default" in prop, (model, field, prop)
    assert "null" not in str(schemas["MessagesIn"]["properties"]["max_tokens"])  # required: no default


# ---- /tokenize counts what chat prompts ---------------------------------------------------------


@pytest.mark.parametrize("template", [SMOL, QWEN], ids=["tools-as-text", "native-tools"])
async def test_tokenize_counts_the_tools_as_chat_does(tmp_path: Path, template: str) -> None:
    (tmp_path / "fake.gguf").write_bytes(b"fake weights")
    backend, runner = scripted_backend(ANSWER, template, path=tmp_path / "fake.gguf")
    async with serve(tmp_path, backend=backend, runner=runner) as h:
        for extra in ({}, {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "required"}):
            chat = await h.post("/v1/chat/completions", {"messages": USER, "max_tokens": 2, **extra})
            assert chat.status_code == 200, chat.text
            counted = await h.post("/tokenize", {"messages": USER, **extra})
            assert counted.status_code == 200, counted.text
            assert counted.json()["count"] == chat.json()["usage"]["prompt_tokens"], extra
        bare = (await h.post("/tokenize", {"messages": USER})).json()["count"]
        assert (await h.post("/tokenize", {"messages": USER, "tools": [WEATHER]})).json()["count"] > bare
        r = await h.post("/tokenize", {"messages": USER, "tool_choice": "any"})
        openai_error(r, 400, "tool_choice")


# ---- Anthropic: output_format, the beta's name for output_config.format -----------------------


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HUGE = {"type": "array", "items": {"type": "integer"}, "minItems": 10_000_000}


def test_output_format_is_output_config_format() -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    alias = anthropic_request(MessagesIn.model_validate({**MESSAGES, "output_format": fmt}), "msg_1")
    current = anthropic_request(MessagesIn.model_validate({**MESSAGES, "output_config": {"format": fmt}}), "msg_1")
    assert alias.response_format == current.response_format and alias.response_format is not None
    assert alias.response_format.schema == SCHEMA


async def test_output_format_reaches_the_grammar_and_a_conflict_is_a_400(h: Harness) -> None:
    r = await h.post("/v1/messages", {**MESSAGES, "output_format": {"type": "json_schema", "schema": HUGE}})
    assert r.status_code == 400 and "the limit is" in r.json()["error"]["message"]
    same = {"type": "json_schema", "schema": SCHEMA}
    r = await h.post("/v1/messages", {**MESSAGES, "output_format": same, "output_config": {"format": same}})
    assert r.status_code == 200, r.text
    other = {"type": "json_schema", "schema": {"type": "object"}}
    r = await h.post("/v1/messages", {**MESSAGES, "output_format": same, "output_config": {"format": other}})
    assert r.status_code == 400 and r.json()["type"] == "error"
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "output_format" in err["message"]


# ---- the unknown model's 404 ------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/chat/completions", {"messages": USER}),
    ("POST", "/v1/completions", {"prompt": "hi"}),
    ("POST", "/v1/responses", {"input": "hi"}),
    ("POST", "/tokenize", {"content": "hi"}),
    ("GET", "/v1/models/gpt-4o", None),
])
async def test_an_unknown_model_is_openais_model_not_found(h: Harness, method: str, path: str,
                                                           body: dict[str, Any] | None) -> None:
    r = await h.client.request(method, path, json={**body, "model": "gpt-4o"} if body else None)
    err = openai_error(r, 404, "model")
    assert err["type"] == "invalid_request_error" and err["code"] == "model_not_found" and "gpt-4o" in err["message"]


async def test_anthropics_unknown_model_stays_not_found_error(h: Harness) -> None:
    r = await h.post("/v1/messages", {**MESSAGES, "model": "claude-opus-4-1"})
    assert r.status_code == 404 and r.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": r.json()["error"]["message"]}}


def test_the_gateways_unknown_model_is_the_same_404(tmp_path: Path) -> None:
    up = Upstream(name="a", url="http://127.0.0.1:9101", models={"smol": "up-model"})
    settings = GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60)
    app = create_gateway_app(settings, transport=httpx.MockTransport(lambda r: httpx.Response(200, json={})))
    with TestClient(app) as c:
        for method, path, body in (("POST", "/v1/chat/completions", {"model": "gpt-4o", "messages": USER}),
                                   ("POST", "/v1/responses", {"model": "gpt-4o", "input": "hi"}),
                                   ("GET", "/v1/models/gpt-4o", None)):
            r = c.request(method, path, json=body)
            assert r.status_code == 404, r.text
            err = r.json()["error"]
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "model_not_found", "model")
        r = c.post("/v1/messages", json={"model": "claude", "max_tokens": 5, "messages": USER})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
