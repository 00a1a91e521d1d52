"""Grammars for structured output and forced tool calls, checked by llama.cpp's own parser."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from hearth.chat.structured import response_format_grammar, schema_grammar, tool_call_grammar
from hearth.chat.tools import OutputPlan, plan_output
from hearth.chat.types import ChatRequest, Message, ResponseFormat, Tool
from hearth.errors import BadRequest

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {
    "location": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["location"]})
TIME = Tool("get_time", "", {"type": "object", "properties": {"tz": {"type": "string"}}})


@pytest.fixture(scope="module")
def vocab() -> Iterator[Any]:
    """The default model's vocabulary only (no weights): enough to parse grammars. llama.cpp and
    the default model are part of every setup (scripts/setup.sh): no skip if they are missing."""
    import llama_cpp as L

    from hearth.models import embedded_model_path

    path = embedded_model_path()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    yield L.llama_model_get_vocab(model)
    L.llama_model_free(model)


def parses(vocab: Any, grammar: str) -> bool:
    import llama_cpp as L

    smpl = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not smpl:
        return False
    L.llama_sampler_free(smpl)
    return True


def test_bad_grammar_is_rejected(vocab: Any) -> None:
    assert not parses(vocab, "root ::= undefined-rule")


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "json"])
@pytest.mark.parametrize("parallel", [False, True])
def test_tool_call_grammars_are_valid_gbnf(vocab: Any, fmt: str, parallel: bool) -> None:
    for tools in ([WEATHER], [WEATHER, TIME], [Tool("no_params")]):
        assert parses(vocab, tool_call_grammar(tools, fmt, parallel))


def test_hermes_grammar_writes_the_wrapper_with_fixed_names() -> None:
    g = tool_call_grammar([WEATHER, TIME], "hermes", parallel=False)
    assert 'root ::= "<tool_call>\\n" call "\\n</tool_call>"' in g
    assert '"\\"get_weather\\""' in g and '"\\"get_time\\""' in g
    assert re.search(r"^call ::= call-0 \| call-1", g, re.M)
    assert "{0,1}" in tool_call_grammar([WEATHER, TIME], "hermes", parallel=True)
    assert '"\\"parameters\\""' in tool_call_grammar([WEATHER], "llama3", parallel=False)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False, "title": "Person"},
    {"type": "array", "items": {"type": "number"}, "maxItems": 3},
    {"$defs": {"p": {"type": "string"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}},
])
def test_schema_grammars_are_valid_gbnf(vocab: Any, schema: dict[str, Any]) -> None:
    g = schema_grammar(schema)
    assert re.search(r"^root ::=", g, re.M) and parses(vocab, g)


def test_response_formats() -> None:
    assert response_format_grammar(None) is None
    assert response_format_grammar(ResponseFormat("text")) is None
    assert "root ::=" in (response_format_grammar(ResponseFormat("json_object")) or "")
    with pytest.raises(BadRequest):
        schema_grammar({"type": "object", "properties": {"a": {"$ref": "#/missing"}}})
    with pytest.raises(BadRequest):
        response_format_grammar(ResponseFormat("yaml"))


def plan(**kw: Any) -> OutputPlan:
    return plan_output(ChatRequest("m", [Message("user", "x")], **kw), "hermes")


def test_tool_choice_plans() -> None:
    assert plan().parser is None and plan().grammar is None
    auto = plan(tools=[WEATHER])
    assert auto.parser == "hermes" and auto.grammar is None and auto.tools_in_prompt == [WEATHER]
    none = plan(tools=[WEATHER], tool_choice="none")
    assert none.parser is None and none.tools_in_prompt == []
    named = plan(tools=[WEATHER, TIME], tool_choice="get_time")
    assert named.parser == "hermes" and named.grammar and "get_weather" not in named.grammar
    required = plan(tools=[WEATHER, TIME], tool_choice="required")
    assert required.grammar and "get_weather" in required.grammar and "get_time" in required.grammar
    forced_other = plan_output(ChatRequest("m", [], tools=[WEATHER], tool_choice="required"), "mistral")
    assert forced_other.parser == "json"
    rf = plan(response_format=ResponseFormat("json_schema", {"type": "object"}))
    assert rf.parser is None and rf.grammar


@pytest.mark.parametrize("kw", [{"tools": [WEATHER], "tool_choice": "nope"}, {"tool_choice": "required"}])
def test_bad_tool_choice_is_a_400(kw: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as e:
        plan(**kw)
    assert e.value.param == "tool_choice"


def test_schema_in_grammar_survives_json_roundtrip() -> None:
    schema = {"type": "object", "properties": {"x": {"const": "a\"b"}}}
    assert json.loads(json.dumps(schema)) == schema and "root ::=" in schema_grammar(schema)
