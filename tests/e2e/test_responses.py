"""The Responses API through the official openai SDK and raw HTTP/SSE, against the real model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from hearth.models import DEFAULT_MODEL_ID
from tests.e2e.test_http import wait_idle
from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow

SHORT = "Reply with one word: yes or no. Is the sky blue?"  # the default model answers "No" and stops
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)  # a deadline, not speed


def create(client: OpenAI, input: Any, **kw: Any) -> Any:
    """At temperature 0, recomputing the prompt (EXACT): the tests look at what the model wrote
    (it stopped, it called, it answered), which then takes the same path on every run, whatever
    earlier tests left in the slots."""
    kw.setdefault("max_output_tokens", 24)
    kw.setdefault("extra_body", EXACT)
    return client.responses.create(model=DEFAULT_MODEL_ID, input=input, temperature=0, **kw)


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs from an SSE line iterator; checks every event names its type."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            assert line != "data: [DONE]"
            data = json.loads(line[6:])
            assert data["type"] == name
            yield name, data
            name = None


def check_sequence(types: list[str], seqs: list[int]) -> None:
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert types[:2] == ["response.created", "response.in_progress"]
    assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL


def test_string_input(client: OpenAI) -> None:
    r = create(client, "Name three primary colors.", metadata={"run": "e2e"})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == DEFAULT_MODEL_ID
    assert r.status in ("completed", "incomplete") and r.error is None
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and len(r.output_text) > 5
    assert r.usage is not None and r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.metadata == {"run": "e2e"} and r.store is True and r.temperature == 0


def test_item_input_and_instructions(client: OpenAI) -> None:
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi, my name is Ada."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada!"}]},
        {"type": "reasoning", "id": "rs_x", "summary": []},  # tolerated, skipped
        {"role": "user", "content": "What is my name?"},
    ]
    plain = create(client, items)
    r = create(client, items, instructions="You are a helpful assistant who speaks like a pirate.")
    assert r.instructions == "You are a helpful assistant who speaks like a pirate."
    assert r.usage.input_tokens > plain.usage.input_tokens  # the instructions are in the prompt
    assert r.output_text


def test_stream_with_the_sdk(client: OpenAI) -> None:
    types, seqs, deltas = [], [], []
    with client.responses.stream(model=DEFAULT_MODEL_ID, input=SHORT, temperature=0, max_output_tokens=40,
                                 extra_body=EXACT) as s:
        for ev in s:
            types.append(ev.type)
            seqs.append(ev.sequence_number)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        final = s.get_final_response()
    check_sequence(types, seqs)
    assert types[-1] == "response.completed" and final.status == "completed"
    assert final.output_text == "".join(deltas) and deltas
    assert types.index("response.output_item.added") < types.index("response.content_part.added") \
        < types.index("response.output_text.delta") < types.index("response.output_text.done") \
        < types.index("response.content_part.done") < types.index("response.output_item.done")


def test_stream_over_raw_http(server: Server) -> None:
    with httpx.stream("POST", f"{server.url}/responses", timeout=120, json={
            "input": SHORT, "temperature": 0, "max_output_tokens": 40, "stream": True, **EXACT}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(sse(r.iter_lines()))
    types = [t for t, _ in events]
    check_sequence(types, [d["sequence_number"] for _, d in events])
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    created, final = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["id"] == final["id"]
    text = "".join(d["delta"] for t, d in events if t == "response.output_text.delta")
    assert final["status"] == "completed" and final["output_text"] == text
    done = next(d["item"] for t, d in events if t == "response.output_item.done")
    assert done == final["output"][0]


@pytest.mark.parametrize("prompt", ["Write a haiku about the sea.", "Explain what a CPU does in one sentence."])
def test_streamed_text_equals_non_streamed_text_at_temperature_0(client: OpenAI, prompt: str) -> None:
    full = create(client, prompt, max_output_tokens=32, extra_body=EXACT)
    stream = create(client, prompt, max_output_tokens=32, extra_body=EXACT, stream=True)
    deltas, final = [], None
    for ev in stream:
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type in TERMINAL:
            final = ev.response
    assert final is not None and "".join(deltas) == full.output_text == final.output_text
    assert final.status == full.status and final.usage.output_tokens == full.usage.output_tokens


def test_previous_response_id_chains_turns(client: OpenAI, server: Server) -> None:
    first = create(client, "Hi, my name is Ada.", instructions="Be brief.")
    second = create(client, "What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # the whole first turn (its input and output; not its instructions) is replayed
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens - 10
    third = create(client, "And again?", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        create(client, "x", previous_response_id="resp_" + "0" * 32)
    r = httpx.post(f"{server.base_url}/responses", json={"input": "x", "previous_response_id": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "previous_response_id" and r.json()["error"]["code"] == "not_found"


def test_function_call_items_are_replayed_as_tool_turns(client: OpenAI) -> None:
    r = create(client, [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature_c": 21, "sky": "sunny"}'},
    ], tools=[WEATHER])
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.tools[0].name == "get_weather"


def test_function_call_loop_through_previous_response_id(client: OpenAI) -> None:
    first = create(client, "What is the weather in Paris?", tools=[WEATHER], max_output_tokens=64,
                   tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and calls, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert isinstance(json.loads(call.arguments), dict)
    second = create(client, [{"type": "function_call_output", "call_id": call.call_id,
                              "output": '{"temperature_c": 21, "sky": "sunny"}'}],
                    previous_response_id=first.id, tools=[WEATHER], max_output_tokens=32)
    assert second.output[-1].type == "message" and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens


class Person(BaseModel):
    name: str
    age: int


def test_a_forced_function_call_streams_as_a_function_call_item(client: OpenAI) -> None:
    types, deltas = [], []
    with client.responses.stream(model=DEFAULT_MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                 max_output_tokens=64, extra_body=EXACT) as s:
        for ev in s:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                deltas.append(ev.delta)
        final = s.get_final_response()
    check_sequence(types, list(range(len(types))))
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.arguments == "".join(deltas)
    assert "response.function_call_arguments.done" in types


def test_structured_output_with_parse(client: OpenAI) -> None:
    r = client.responses.parse(model=DEFAULT_MODEL_ID, input="Ada is 36 years old. Give her name and age.",
                               text_format=Person, temperature=0, max_output_tokens=64, extra_body=EXACT)
    assert r.text is not None and r.text.format.type == "json_schema"
    assert isinstance(r.output_parsed, Person)


def test_get_and_delete_stored_responses(client: OpenAI, server: Server) -> None:
    r = create(client, SHORT)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status
    assert got.usage == r.usage
    d = httpx.delete(f"{server.base_url}/responses/{r.id}")
    assert d.status_code == 200 and d.json() == {"id": r.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    assert httpx.delete(f"{server.base_url}/responses/{r.id}").status_code == 404
    unstored = create(client, SHORT, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    for bad in ("resp_1", "x%27%20OR%201=1", "resp_" + "z" * 32):
        assert httpx.get(f"{server.base_url}/responses/{bad}").status_code == 404


def _long_stream(server: Server, **kw: Any) -> Any:
    return httpx.stream("POST", f"{server.base_url}/responses", timeout=120, json={
        "input": "Tell me a long story.", "max_output_tokens": 1500, "ignore_eos": True, "stream": True, **kw})


def test_cancel_endpoint_stops_a_stored_stream(server: Server) -> None:
    wait_idle(server)
    with _long_stream(server) as r:
        events = sse(r.iter_lines())
        rid = next(d for t, d in events if t == "response.created")["response"]["id"]
        n = 0
        for t, _ in events:
            n += t == "response.output_text.delta"
            if n == 3:
                break
        c = httpx.post(f"{server.base_url}/responses/{rid}/cancel", timeout=30)
        at_cancel = server.metric("hearth_generated_tokens_total")
        rest = list(events)
    assert c.status_code == 200, c.text
    assert c.json()["id"] == rid and c.json()["status"] == "incomplete"
    assert c.json()["incomplete_details"] == {"reason": "cancelled"}
    t, final = rest[-1]
    assert t == "response.incomplete" and final["response"]["incomplete_details"] == {"reason": "cancelled"}
    assert 3 <= final["response"]["usage"]["output_tokens"] < 1500
    assert httpx.get(f"{server.base_url}/responses/{rid}").json()["status"] == "incomplete"
    assert httpx.post(f"{server.base_url}/responses/resp_{'0' * 32}/cancel").status_code == 404
    wait_idle(server)
    # It stopped at once, counted on the server (how far the server ran ahead of the 3 deltas read
    # is timing): past the cancel's answer, at most the step it was in, 1 + --spec-draft (8) tokens.
    assert server.metric("hearth_generated_tokens_total") - at_cancel <= 9


def test_v1_cancel_by_response_id_and_cancel_id(server: Server) -> None:
    for body, key in (({}, "response_id"), ({"cancel_id": "resp-run-1", "store": False}, "cancel_id")):
        wait_idle(server)
        with _long_stream(server, **body) as r:
            events = sse(r.iter_lines())
            rid = next(d for t, d in events if t == "response.created")["response"]["id"]
            target = rid if key == "response_id" else "resp-run-1"
            c = httpx.post(f"{server.base_url}/cancel", json={key: target}, timeout=10)
            assert c.json() == {"cancelled": 1}
            t, final = list(events)[-1]
        assert t == "response.incomplete" and final["response"]["incomplete_details"] == {"reason": "cancelled"}
    wait_idle(server)


def test_hosted_and_namespace_tools_are_accepted(client: OpenAI) -> None:
    """Codex CLI's tools, in short: a hosted web_search (left out of the prompt) and a namespace
    whose function comes back named as declared, with its namespace."""
    ns = {"type": "namespace", "name": "crm", "description": "CRM tools", "tools": [
        {"type": "function", "name": "lookup", "description": "Find a person.",
         "parameters": {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]}}]}
    r = client.responses.create(model=DEFAULT_MODEL_ID, input="Look up Ada.", temperature=0, max_output_tokens=60,
                                store=False, extra_body={"tools": [{"type": "web_search"}, ns],
                                                         "tool_choice": {"type": "function", "name": "lookup"}})
    call = r.output[0]
    assert (call.type, call.name, json.loads(call.arguments).keys()) == ("function_call", "lookup", {"who"})
    assert call.model_dump()["namespace"] == "crm"
    assert [t["type"] for t in r.model_dump()["tools"]] == ["web_search", "namespace"]


def test_max_output_tokens_makes_an_incomplete_response(client: OpenAI) -> None:
    r = create(client, "Write a long essay about the history of Rome.", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 5
    assert r.output[0].status == "incomplete"


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content", "no vision"),
    ({"input": "x", "tools": [{"name": "untyped"}]}, "tools[0].type", "with a type"),
    ({"input": "x", "session_id": "s1", "previous_response_id": "resp_" + "0" * 32}, "session_id", "not both"),
    ({"input": "x", "session_id": "../x"}, "session_id", "session ids"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "X"}}}, "text.format.schema", "schema"),
    ({"input": []}, "input", "empty"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "no tools"),
])
def test_bad_requests_are_400s_in_the_openai_envelope(server: Server, body: dict[str, Any], param: str,
                                                      words: str) -> None:
    r = httpx.post(f"{server.base_url}/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"]
