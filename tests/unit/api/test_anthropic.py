"""Anthropic Messages request bodies → ChatRequest (no model, no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearth.api.anthropic.messages import CountTokensIn, MessagesIn, to_chat_request
from hearth.chat.types import ChatRequest, Message, ToolCall
from hearth.errors import BadRequest
from hearth.http.parsing import validate

WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def parse(**body: Any) -> ChatRequest:
    body.setdefault("max_tokens", 16)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return to_chat_request(validate(MessagesIn, body), "msg_1")


def bad(match: str, **body: Any) -> BadRequest:
    with pytest.raises(BadRequest, match=match) as e:
        parse(**body)
    return e.value


def test_plain_text_and_sampling() -> None:
    r = parse(model="smollm2", max_tokens=7, temperature=0, top_p=0.5, top_k=3, stop_sequences=["\n\n"],
              metadata={"user_id": "u"})
    assert r.model == "smollm2" and r.request_id == "msg_1"
    assert r.messages == [Message("user", "hi")]
    s = r.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop) == (7, 0, 0.5, 3, ["\n\n"])


def test_max_tokens_is_required() -> None:
    with pytest.raises(BadRequest, match="max_tokens") as e:
        to_chat_request(validate(MessagesIn, {"messages": [{"role": "user", "content": "hi"}]}), "m")
    assert e.value.param == "max_tokens"


def test_count_tokens_body_needs_no_max_tokens() -> None:
    r = to_chat_request(validate(CountTokensIn, {"messages": [{"role": "user", "content": "hi"}]}), "m")
    assert r.messages == [Message("user", "hi")]


@pytest.mark.parametrize("system", ["Be brief.", [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]])
def test_system_as_string_or_text_blocks(system: Any) -> None:
    r = parse(system=system)
    assert r.messages[0].role == "system"
    assert r.messages[0].content in ("Be brief.", "Be\nbrief.")


def test_text_blocks_with_cache_control_are_joined() -> None:
    r = parse(messages=[{"role": "user", "content": [
        {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "two"}]}])
    assert r.messages == [Message("user", "one\ntwo")]


@pytest.mark.parametrize("kind", ["image", "document"])
def test_image_input_is_rejected(kind: str) -> None:
    block = {"type": kind, "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    e = bad("no vision", messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, block]}])
    assert e.param == "messages[0].content[1]"


def test_image_inside_a_tool_result_is_rejected() -> None:
    block = {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}
    bad("no vision", messages=[{"role": "user", "content": [block]}])


def test_tool_use_round_trip_history() -> None:
    r = parse(tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C, sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "timeout"}]},
            {"type": "text", "text": "Thanks!"}]},
    ])
    user, assistant, tool1, tool2, thanks = r.messages
    assert user == Message("user", "Weather in Paris?")
    assert assistant.role == "assistant" and assistant.content == "Let me check."
    assert assistant.reasoning == "I should call the tool."
    assert assistant.tool_calls == [ToolCall("toolu_1", "get_weather", json.dumps({"city": "Paris"}))]
    assert tool1 == Message("tool", "18C, sunny", tool_call_id="toolu_1")
    assert tool2 == Message("tool", "Error: timeout", tool_call_id="toolu_2")
    assert thanks == Message("user", "Thanks!")
    assert r.tools[0].name == "get_weather" and r.tools[0].parameters == WEATHER["input_schema"]
    assert r.tools[0].description == "Weather for a city"


def test_tool_result_without_content_is_empty() -> None:
    r = parse(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}])
    assert r.messages == [Message("tool", "", tool_call_id="t")]


@pytest.mark.parametrize(("messages", "match"), [
    ([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}], "cannot hold"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}], "cannot hold"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}],
     "must be an object"),
    ([{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}], "needs id and name"),
    ([{"role": "user", "content": [{"type": "tool_result"}]}], "needs tool_use_id"),
    ([{"role": "tool", "content": "x"}], "messages.0.role"),
    ([], "messages"),
])
def test_malformed_messages(messages: list[Any], match: str) -> None:
    bad(match, messages=messages)


@pytest.mark.parametrize(("choice", "want"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"}, "get_weather"),
])
def test_tool_choice(choice: dict[str, Any], want: str) -> None:
    r = parse(tools=[WEATHER], tool_choice=choice)
    assert r.tool_choice == want and r.parallel_tool_calls


def test_disable_parallel_tool_use() -> None:
    r = parse(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert r.parallel_tool_calls is False


@pytest.mark.parametrize(("body", "match"), [
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "not in tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "needs a name"),
    ({"tool_choice": {"type": "any"}}, "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"tools": [{"name": "f"}]}, "input_schema is required"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
])
def test_bad_tools(body: dict[str, Any], match: str) -> None:
    bad(match, **body)


def test_thinking() -> None:
    r = parse(max_tokens=64, thinking={"type": "enabled", "budget_tokens": 32})
    assert (r.reasoning.enable, r.reasoning.budget) == (True, 32)
    assert parse(thinking={"type": "disabled"}).reasoning.enable is False
    assert parse().reasoning.enable is None
    bad("budget_tokens", thinking={"type": "enabled"})


def test_hearth_extensions() -> None:
    body = validate(MessagesIn, {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                 "cancel_id": "c1", "cache_prompt": False, "ignore_eos": True})
    assert body.cancel_id == "c1"
    assert to_chat_request(body, "m").cache_prompt is False
    assert to_chat_request(body, "m").sampling.ignore_eos is True
    plain = validate(MessagesIn, {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert to_chat_request(plain, "m").sampling.ignore_eos is False


def test_session_fields_become_a_session_turn() -> None:
    body = validate(MessagesIn, {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                 "session_id": "s1", "replace_system": True, "session_wait": False})
    turn = to_chat_request(body, "m").session
    assert turn is not None and (turn.session_id, turn.replace_system, turn.wait) == ("s1", True, False)
    e = bad("session ids", session_id="../etc")
    assert e.param == "session_id"


def test_out_of_range_sampling_is_a_bad_request() -> None:
    bad("temperature", temperature=-1)


def test_output_config_effort_and_json_schema_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = parse(output_config={"effort": "max", "format": {"type": "json_schema", "schema": schema}},
              thinking={"type": "adaptive", "display": "summarized"})
    assert (r.reasoning.enable, r.reasoning.effort, r.reasoning.budget) == (True, "high", None)
    assert r.response_format is not None
    assert (r.response_format.type, r.response_format.schema) == ("json_schema", schema)
    assert parse(output_config={"effort": "low"}).reasoning.effort == "low"
    assert parse().response_format is None
    bad("output_config.format.type", output_config={"format": {"type": "xml", "schema": {}}})


def test_system_turns_inside_messages_stay_where_they_are() -> None:
    """Claude Code puts its environment block in a `system` turn after the user's first message."""
    r = parse(system="You are an agent.", messages=[
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                        "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "Be brief."}])
    assert [(m.role, m.content) for m in r.messages] == [
        ("system", "You are an agent."), ("user", "List the files."), ("system", "# Environment"),
        ("system", "Be brief.")]


def test_blocks_a_local_model_cannot_use_are_skipped_not_refused() -> None:
    r = parse(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Search."},
                                     {"type": "container_upload", "file_id": "f"}]},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "Found nothing."}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "ok"}, {"type": "search_result", "source": "s", "title": "t", "content": []}]}]}])
    assert [(m.role, m.content) for m in r.messages] == [("user", "Search."), ("assistant", "Found nothing."),
                                                         ("tool", "ok")]


def test_deferred_tools_join_the_prompt_once_a_tool_reference_loads_them() -> None:
    deferred = {**WEATHER, "name": "get_time", "defer_loading": True}
    search = {"name": "ToolSearch", "input_schema": {"type": "object"}}
    assert [t.name for t in parse(tools=[search, deferred]).tools] == ["ToolSearch"]
    r = parse(tools=[search, deferred], messages=[
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "tool_reference", "tool_name": "get_time"}]}]}])
    assert [t.name for t in r.tools] == ["ToolSearch", "get_time"]
    assert r.messages[-1] == Message("tool", "Tool loaded: get_time", tool_call_id="t1")


def test_the_context_overflow_is_worded_as_anthropic_words_it() -> None:
    from hearth.errors import ContextLimit
    from hearth.http.errors import anthropic_context_message as context_message

    e = ContextLimit("x", n_prompt=11695, limit=32768, max_tokens=32000)
    assert context_message(e) == ("input length and `max_tokens` exceed context limit: 11695 + 32000 > 32768, "
                                  "decrease input length or `max_tokens` and try again")
    assert context_message(ContextLimit("x", n_prompt=40000, limit=32768)) == \
        "prompt is too long: 40000 tokens > 32767 maximum"


def test_claude_codes_billing_line_stays_out_of_the_prompt() -> None:
    """It differs from session to session and would defeat the prefix cache at token one."""
    def system(version: str) -> list[dict[str, str]]:
        return [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.330.{version}; "
                                         "cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "You are a Claude agent."}]

    a, b = parse(system=system("6da")), parse(system=system("83a"))
    assert a.messages[0] == b.messages[0] == Message("system", "You are a Claude agent.")
