"""Tool calls, structured output and tool round trips through the openai SDK, with the real
default model (SmolLM2-135M, whose template knows no tools: Hearth teaches them in the prompt,
and grammars make forced calls valid even for a model this small)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow

# Recompute the prompt wherever a test relies on what the model writes at temperature 0 (a call
# that fits max_tokens, a non-empty answer) or compares two runs: ASK is sent by most tests here,
# and a prefix reused from an earlier one can change the last bits of the logits. Recomputed, each
# request takes the same path on every run, whatever ran before it.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)


def check_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The arguments parse and follow the tool's schema (checked by hand: no jsonschema here)."""
    args = json.loads(arguments)
    assert isinstance(args, dict)
    if name == "get_weather":
        assert set(args) == {"location", "unit"}
        assert isinstance(args["location"], str) and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert name == "get_time" and set(args) == {"timezone"} and isinstance(args["timezone"], str)
    return args


def test_named_tool_choice_returns_a_valid_call(client: OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       temperature=0, max_tokens=60, extra_body=EXACT)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    check_arguments("get_weather", calls[0].function.arguments)  # type: ignore[union-attr]


def test_required_tool_choice_calls_one_of_the_tools(client: OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                       tool_choice="required", parallel_tool_calls=False,
                                       temperature=0, max_tokens=60, extra_body=EXACT)
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    check_arguments(calls[0].function.name, calls[0].function.arguments)  # type: ignore[union-attr]


def test_auto_tool_choice_answers_or_calls(client: OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER],  # type: ignore[list-item]
                                       temperature=0, max_tokens=40, extra_body=EXACT)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls and choice.message.tool_calls[0].function.name  # type: ignore[union-attr]
    else:
        assert choice.message.content and "<tool_call>" not in choice.message.content


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(client: OpenAI) -> None:
    # parallel calls allowed: up to one call per tool
    kw: dict[str, Any] = dict(model="default", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                              temperature=0, max_tokens=120, extra_body=EXACT)
    full = client.chat.completions.create(**kw)
    calls: dict[int, dict[str, str]] = {}
    finish, announced = None, 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            if tc.id is not None:
                announced += 1
                assert tc.type == "function" and tc.function and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.function and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
        assert not delta.content
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" == full.choices[0].finish_reason
    expected = [(c.function.name, c.function.arguments) for c in full.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    assert announced == len(calls) == len(expected) >= 1
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == expected


class City(BaseModel):
    name: str
    country: str
    population: int


def test_structured_output_through_the_sdk_parse_helper(client: OpenAI) -> None:
    r = client.chat.completions.parse(model="default", messages=[{"role": "user", "content": "Describe Paris."}],
                                      response_format=City, temperature=0, max_tokens=80, extra_body=EXACT)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and isinstance(msg.parsed, City)
    assert City.model_validate_json(msg.content or "") == msg.parsed


def test_json_object_response_format_is_an_object(client: OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Give me a JSON."}],
                                       response_format={"type": "json_object"}, temperature=0, max_tokens=60)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    else:
        assert (r.choices[0].message.content or "").startswith("{")


def test_tool_round_trip(client: OpenAI) -> None:
    call = {"name": "get_weather", "arguments": '{"location": "Paris", "unit": "celsius"}'}
    messages: list[Any] = [*ASK,
                           {"role": "assistant", "content": None,
                            "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
                           {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    r = client.chat.completions.create(model="default", messages=messages, tools=[WEATHER],  # type: ignore[list-item]
                                       tool_choice="none", temperature=0, max_tokens=30, extra_body=EXACT)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None


def test_bad_tool_choice_and_bad_grammar_are_400s(client: OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER],  # type: ignore[list-item]
                                       tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=5)
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                   json={"messages": ASK, "max_tokens": 5, "grammar": "root ::= undefined"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "messages": ASK, "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}}}})
    assert r.status_code == 400
