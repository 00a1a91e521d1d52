"""The prompt cache's protocol side without a server: conversation keys (hearth.http.cache_keys),
Anthropic cache_control breakpoints → `ChatRequest.cache_through`, and the usage split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import Headers

from hearth.api.anthropic.messages import MessagesIn, to_chat_request
from hearth.api.anthropic.stream import usage_dict
from hearth.api.openai.responses_stream import usage_object
from hearth.chat.types import ChatRequest, Message, Timings, Usage
from hearth.errors import BadRequest
from hearth.http.cache_keys import MAX_KEY_CHARS, body_key, bounded, conversation_key
from hearth.http.parsing import validate

AGENTS = Path(__file__).parents[2] / "fixtures" / "agents"
SESSION = "aa9c75f0-25f3-4dd7-ac96-326a34a6cd65"
CLAUDE_USER_ID = json.dumps({"device_id": "c889", "account_uuid": "", "session_id": SESSION})
EPHEMERAL = {"type": "ephemeral"}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((AGENTS / name).read_text())


# ---- conversation keys -------------------------------------------------------------------------


def key(headers: dict[str, str] | None = None, **body: Any) -> str | None:
    return conversation_key(body_key(**body), Headers(headers or {}))


def test_each_source_alone() -> None:
    assert key(prompt_cache_key="pck") == "pck"
    assert key(metadata={"user_id": CLAUDE_USER_ID}) == SESSION
    assert key(metadata={"user_id": "user-42"}) == "user-42"  # not Claude Code's JSON: the whole string
    assert key({"X-Claude-Code-Session-Id": "cc"}) == "cc"
    assert key({"session-id": "codex"}) == "codex"
    assert key({"session_id": "underscored"}) == "underscored"
    assert key({"thread-id": "thread"}) == "thread"
    assert key() is None


def test_first_found_wins() -> None:
    every = {"x-claude-code-session-id": "cc", "session-id": "sid", "session_id": "sid_", "thread-id": "tid"}
    assert key(every, prompt_cache_key="pck", metadata={"user_id": CLAUDE_USER_ID}) == "pck"
    assert key(every, metadata={"user_id": CLAUDE_USER_ID}) == SESSION
    assert key(every) == "cc"
    assert key({k: v for k, v in every.items() if k != "x-claude-code-session-id"}) == "sid"
    assert key({"session_id": "sid_", "thread-id": "tid"}) == "sid_"


@pytest.mark.parametrize("user_id", [
    "{not json", "{}", '{"session_id": 7}', '{"session_id": ""}', "[1, 2]", "{" * 100_000])
def test_a_user_id_that_is_not_claude_codes_json_is_the_key_as_it_is(user_id: str) -> None:
    assert key(metadata={"user_id": user_id}) == bounded(user_id)


def test_empty_or_foreign_values_count_as_not_sent() -> None:
    assert key({"session-id": "h"}, prompt_cache_key="", metadata={"user_id": ""}) == "h"
    assert key({"session-id": "h"}, metadata={"user_id": 42}) == "h"
    assert key({"session-id": ""}) is None


def test_a_long_key_is_hashed_to_a_bounded_stable_one() -> None:
    long = "k" * (MAX_KEY_CHARS + 1)
    hashed = key(prompt_cache_key=long)
    assert hashed is not None and hashed != long and len(hashed) <= MAX_KEY_CHARS
    assert hashed == key({"session-id": long})  # the same conversation whichever way it came
    assert key(prompt_cache_key=long + "x") != hashed
    assert key(prompt_cache_key="k" * MAX_KEY_CHARS) == "k" * MAX_KEY_CHARS


@pytest.mark.parametrize(("name", "expected"), [
    ("claude-code-first.json", SESSION),  # metadata.user_id's session_id (the header says the same)
    ("codex-first.json", "01a20657-3df9-70c1-9309-ae95e006f8a0"),  # prompt_cache_key, before session-id
])
def test_what_the_real_clis_send(name: str, expected: str) -> None:
    captured = fixture(name)
    body = captured["body"]
    assert key(captured["headers"], prompt_cache_key=body.get("prompt_cache_key"),
               metadata=body.get("metadata")) == expected


# ---- cache_control → cache_through ------------------------------------------------------------


def parse(**body: Any) -> ChatRequest:
    body.setdefault("max_tokens", 16)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return to_chat_request(validate(MessagesIn, body), "msg_1")


def text(t: str, marked: bool = False) -> dict[str, Any]:
    return {"type": "text", "text": t, **({"cache_control": EPHEMERAL} if marked else {})}


def test_no_breakpoint() -> None:
    assert parse(system=[text("sys")]).cache_through is None


def test_a_system_block_keeps_through_the_system_message() -> None:
    r = parse(system=[text("a", marked=True), text("b")], messages=[{"role": "user", "content": [text("hi")]}])
    assert r.messages[0].role == "system" and r.cache_through == 0


def test_a_tool_keeps_through_message_0() -> None:
    tool = {"name": "t", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}
    assert parse(tools=[tool], system="sys").cache_through == 0


def test_the_last_breakpoint_wins() -> None:
    r = parse(system=[text("sys", marked=True)], messages=[
        {"role": "user", "content": [text("one", marked=True)]},
        {"role": "assistant", "content": [text("two")]},
        {"role": "user", "content": [text("three", marked=True)]},
        {"role": "assistant", "content": "four"}])
    assert r.cache_through == 3 and r.messages[3] == Message("user", "three")


def test_a_block_keeps_through_the_message_that_holds_it() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "out"}
    turns = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [call]}]
    # the user turn becomes [user "before", tool "out", user "after"] at messages 3..5 (after the system's)
    user = {"role": "user", "content": [text("before"), {**result, "cache_control": EPHEMERAL}, text("after")]}
    r = parse(system="sys", messages=[*turns, user])
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "user", "tool", "user"]
    assert r.cache_through == 4
    inner = {**result, "content": [text("out", marked=True)]}  # marked inside the tool result
    assert parse(system="sys", messages=[*turns, {**user, "content": [text("before"), inner, text("after")]}]
                 ).cache_through == 4
    assert parse(system="sys", messages=[*turns, {**user, "content": [text("before", marked=True), result]}]
                 ).cache_through == 3
    assert parse(system="sys", messages=[*turns, {"role": "assistant", "content": [{**call, "cache_control":
                                                                                   EPHEMERAL}]}]).cache_through == 3


def test_top_level_cache_control_keeps_everything() -> None:
    r = parse(cache_control=EPHEMERAL, system="sys", messages=[{"role": "user", "content": "a"},
                                                                {"role": "assistant", "content": "b"},
                                                                {"role": "user", "content": "c"}])
    assert r.cache_through == 3 == len(r.messages) - 1


def test_claude_codes_breakpoints() -> None:
    """Its system blocks and its last turn (a `system` turn after the user's) are marked."""
    body = fixture("claude-code-first.json")["body"]
    r = to_chat_request(validate(MessagesIn, body), "msg_1")
    assert [m.role for m in r.messages] == ["system", "user", "system"]
    assert r.cache_through == 2


def test_cache_control_must_be_an_object() -> None:
    with pytest.raises(BadRequest, match=r"tools\.0\.cache_control") as e:
        parse(tools=[{"name": "t", "input_schema": {"type": "object"}, "cache_control": "yes"}])
    assert e.value.param == "tools.0.cache_control"


# ---- usage -------------------------------------------------------------------------------------


def test_anthropics_split_sums_to_the_prompt() -> None:
    u = usage_dict(Usage(prompt_tokens=100, completion_tokens=3, cached_tokens=60, cache_write_tokens=30))
    assert u == {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 30,
                 "cache_read_input_tokens": 60}
    # written tokens a slot also served (not in the durable cache yet) count once, as read
    u = usage_dict(Usage(prompt_tokens=100, completion_tokens=3, cached_tokens=99, cache_write_tokens=80))
    assert (u["input_tokens"], u["cache_creation_input_tokens"], u["cache_read_input_tokens"]) == (0, 1, 99)


def test_responses_report_cache_writes() -> None:
    u = usage_object(Usage(prompt_tokens=100, completion_tokens=3, cached_tokens=60, cache_write_tokens=30))
    assert u["input_tokens"] == 100
    assert u["input_tokens_details"] == {"cached_tokens": 60, "cache_write_tokens": 30}


def test_timings_name_the_tier() -> None:
    assert Timings(cached_tokens=5, cache_tier="disk").as_llama_server()["cache_tier"] == "disk"
    assert Timings().as_llama_server()["cache_tier"] is None
