"""Responses API input items, tools and formats → protocol-neutral types."""

from __future__ import annotations

from typing import Any

import pytest

from hearth.chat.types import Message, Tool, ToolCall
from hearth.errors import BadRequest
from hearth.protocols.responses_input import (
    check_metadata,
    normalize_input,
    to_messages,
    to_reasoning,
    to_response_format,
    to_tool_choice,
    to_tools,
)


def test_a_string_is_one_user_message() -> None:
    items = normalize_input("hi")
    assert items == [{"type": "message", "role": "user", "content": "hi"}]
    assert to_messages(items) == [Message("user", "hi")]


def test_messages_with_parts_and_easy_messages_without_type() -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
    ]
    assert to_messages(items) == [Message("developer", "Be brief."), Message("user", "ab"),
                                  Message("assistant", "ok")]


def test_function_calls_join_the_assistant_turn_and_outputs_become_tool_messages() -> None:
    items: list[Any] = [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get", "arguments": '{"a":1}'},
        {"type": "function_call", "call_id": "call_2", "name": "get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "call_3", "name": "get", "arguments": "{}"},
        {"type": "item_reference", "id": "x"},  # unknown: skipped
    ]
    assert to_messages(items) == [
        Message("user", "weather?"),
        Message("assistant", "Checking.", tool_calls=[ToolCall("call_1", "get", '{"a":1}'),
                                                      ToolCall("call_2", "get", "{}")]),
        Message("tool", "sunny", tool_call_id="call_1"),
        Message("tool", "rain", tool_call_id="call_2"),
        Message("assistant", None, tool_calls=[ToolCall("call_3", "get", "{}")]),
    ]


@pytest.mark.parametrize(("items", "message", "param"), [
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "no vision",
     "input[0].content"),
    ([{"role": "tool", "content": "x"}], "role must be", "input[0].role"),
    ([{"role": "user"}], "needs content", "input[0].content"),
    ([{"role": "user", "content": [{"type": "weird"}]}], "unsupported content part", "input[0].content"),
    ([{"type": "function_call", "name": "f"}], "call_id must be a string", "input[0].call_id"),
    ([{"type": "function_call_output", "call_id": "c"}], "content must be", "input[0].output.content"),
    ([{"content": "x"}], "needs a type", "input[0].type"),
    (["x"], "must be an object", "input[0]"),
])
def test_bad_items_are_400s_naming_the_field(items: list[Any], message: str, param: str) -> None:
    with pytest.raises(BadRequest) as e:
        to_messages(items)
    assert message in e.value.message and e.value.param == param


def test_function_tools_and_their_echo() -> None:
    ts = to_tools([{"type": "function", "name": "get", "description": "d",
                    "parameters": {"type": "object"}, "strict": True}])
    assert ts.tools == [Tool("get", "d", {"type": "object"})]
    assert ts.echo == [{"type": "function", "name": "get", "description": "d", "parameters": {"type": "object"},
                        "strict": True}]
    with pytest.raises(BadRequest, match="name"):
        to_tools([{"type": "function", "name": ""}])
    with pytest.raises(BadRequest, match="type"):
        to_tools([{"name": "untyped"}])


# Codex CLI 0.169's first request declares these (tests/fixtures/agents/codex/first.json).
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent.",
                        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}},
                       {"type": "function", "name": "get", "parameters": {"type": "object"}}]}
HOSTED = [{"type": "web_search", "external_web_access": True}, {"type": "file_search", "vector_store_ids": ["v"]},
          {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"}]


def test_namespace_tools_join_the_list_and_hosted_tools_are_left_out() -> None:
    ts = to_tools([{"type": "function", "name": "get", "parameters": {"type": "object"}}, NAMESPACE, *HOSTED])
    # the namespaced `get` collides with the top-level one, so the model knows it qualified
    assert [t.name for t in ts.tools] == ["get", "close_agent", "multi_agent_v1.get"]
    assert ts.namespaced == {"close_agent": ("multi_agent_v1", "close_agent"),
                             "multi_agent_v1.get": ("multi_agent_v1", "get")}
    assert ts.left_out == ["web_search", "file_search", "code_interpreter", "image_generation"]
    assert ts.echo[1:] == [NAMESPACE, *HOSTED]  # echoed as given
    assert ts.model_name("get", "multi_agent_v1") == "multi_agent_v1.get" and ts.model_name("get", None) == "get"
    # a past call in a namespace is replayed under the name the model knows
    msgs = to_messages([{"type": "function_call", "call_id": "c1", "name": "get", "namespace": "multi_agent_v1",
                         "arguments": "{}"}], tools=ts)
    assert msgs[0].tool_calls == [ToolCall("c1", "multi_agent_v1.get", "{}")]
    only_hosted = to_tools(HOSTED)
    assert only_hosted.tools == [] and len(only_hosted.echo) == 4
    with pytest.raises(BadRequest, match="namespace needs"):
        to_tools([{"type": "namespace", "name": "n"}])


def test_tool_choice() -> None:
    tools = to_tools([{"type": "function", "name": "get"}, NAMESPACE])
    assert to_tool_choice(None, tools) is None
    assert to_tool_choice("required", tools) == "required"
    assert to_tool_choice({"type": "function", "name": "get"}, tools) == "get"
    assert to_tool_choice({"type": "function", "name": "get", "namespace": "multi_agent_v1"},
                          tools) == "multi_agent_v1.get"
    assert to_tool_choice({"type": "function", "name": "close_agent"}, tools) == "close_agent"
    # a hosted tool the server left out cannot be forced: the model chooses
    assert to_tool_choice({"type": "web_search"}, tools) == "auto"
    assert to_tool_choice({"type": "allowed_tools", "mode": "required", "tools": []}, tools) == "required"
    for bad in ("sometimes", {"type": "function"}, {"type": "function", "name": "other"}):
        with pytest.raises(BadRequest):
            to_tool_choice(bad, tools)
    with pytest.raises(BadRequest, match="no tools"):
        to_tool_choice("required", to_tools(None))


def test_text_format() -> None:
    assert to_response_format(None) == (None, {"format": {"type": "text"}})
    assert to_response_format({"format": {"type": "text"}})[0] is None
    fmt = {"type": "json_schema", "name": "P", "schema": {"type": "object"}, "strict": True}
    rf, echo = to_response_format({"format": fmt})
    assert rf is not None and (rf.type, rf.name, rf.schema, rf.strict) == ("json_schema", "P", {"type": "object"},
                                                                           True)
    assert echo == {"format": fmt}
    rf, _ = to_response_format({"format": {"type": "json_object"}})
    assert rf is not None and rf.type == "json_object"
    with pytest.raises(BadRequest, match="schema"):
        to_response_format({"format": {"type": "json_schema", "name": "P"}})
    with pytest.raises(BadRequest, match="type"):
        to_response_format({"format": {"type": "xml"}})


def test_reasoning_and_metadata() -> None:
    opts, echo = to_reasoning({"effort": "low"})
    assert opts.effort == "low" and echo == {"effort": "low", "summary": None}
    assert to_reasoning({"effort": "none"})[0].enable is False
    with pytest.raises(BadRequest):
        to_reasoning({"effort": "max"})
    assert check_metadata({"a": "b"}) == {"a": "b"}
    for bad in ({"a": 1}, {str(i): "v" for i in range(17)}, {"k" * 65: "v"}):
        with pytest.raises(BadRequest):
            check_metadata(bad)
