"""`$defs`/`$ref` in forced tool calls (schema_refs.py, schema_converter.py): pydantic's nested,
listed, optional and recursive models make grammars llama.cpp parses, with the refs resolved
against the parameters, not against the call wrapper around them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel

from hearth.chat.schema_refs import has_refs, reroot
from hearth.chat.structured import schema_grammar, tool_call_grammar
from hearth.chat.types import Tool
from hearth.errors import BadRequest
from tests.unit.chat.test_structured import parses, vocab  # noqa: F401  (the fixture)


class Address(BaseModel):
    city: str
    zip_code: int


class Person(BaseModel):
    name: str
    home: Address
    previous: list[Address]
    work: Address | None = None


class Tree(BaseModel):
    label: str
    children: list[Tree] = []


SCHEMAS = {"nested": Person.model_json_schema(), "recursive": Tree.model_json_schema()}


def rules(grammar: str) -> dict[str, str]:
    return dict(re.findall(r"^([\w-]+) ::= (.*)$", grammar, re.M))


def test_pydantic_emits_what_the_issue_is_about() -> None:
    assert "$defs" in SCHEMAS["nested"] and has_refs(SCHEMAS["nested"])
    assert SCHEMAS["recursive"].get("$ref", "").startswith("#/$defs/") or has_refs(SCHEMAS["recursive"])


@pytest.mark.parametrize("kind", SCHEMAS)
@pytest.mark.parametrize("fmt", ["hermes", "llama3", "json"])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_with_refs_make_valid_grammars(vocab: Any, kind: str, fmt: str,  # noqa: F811
                                                    parallel: bool) -> None:
    tools = [Tool("save", "", SCHEMAS[kind]), Tool("other", "", {"type": "object", "properties": {}})]
    for chosen in (tools[:1], tools):
        g = tool_call_grammar(chosen, fmt, parallel)
        assert parses(vocab, g), g


def test_the_nested_model_is_one_rule_used_everywhere() -> None:
    r = rules(tool_call_grammar([Tool("save", "", SCHEMAS["nested"])], "hermes", False))
    assert r["Address"].startswith('"{" space')  # the def, written once
    assert r["save-arguments-home"] == "Address"
    assert r["save-arguments-previous-item"] == "Address"
    assert r["save-arguments-work"] == "save-arguments-work-0 | null" and r["save-arguments-work-0"] == "Address"


def test_a_recursive_model_stays_recursive() -> None:
    r = rules(tool_call_grammar([Tool("plant", "", SCHEMAS["recursive"])], "hermes", False))
    assert r["plant-arguments"] == "Tree"
    assert r["Tree-children-item"] == "Tree"  # the rule refers to itself through its children


def test_two_tools_with_the_same_def_name_keep_their_own_shapes() -> None:
    def order(item: dict[str, Any]) -> dict[str, Any]:
        return {"$defs": {"Item": item}, "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}}}

    g = tool_call_grammar([Tool("order", "", order({"type": "object", "properties": {"sku": {"type": "string"}}})),
                           Tool("ship", "", order({"type": "object", "properties": {"kg": {"type": "number"}}}))],
                          "hermes", False)
    r = rules(g)
    first, second = r["order-arguments-items-item"], r["ship-arguments-items-item"]
    assert {first, second} == {"Item", "Item1"}
    assert "sku" in r[f"{first}-sku-kv"] and "kg" in r[f"{second}-kg-kv"]


def test_a_def_named_like_a_primitive_is_not_the_primitive() -> None:
    schema = {"$defs": {"string": {"type": "integer"}}, "type": "object",
              "properties": {"a": {"type": "string"}, "b": {"$ref": "#/$defs/string"}}, "required": ["a", "b"]}
    for g in (schema_grammar(schema), tool_call_grammar([Tool("f", "", schema)], "json", False)):
        r = rules(g)
        b = next(v for k, v in r.items() if k.endswith("b"))
        assert b == "integer" or "integer" in r[b]  # not the string primitive


def test_refs_into_definitions_and_the_root() -> None:
    schema = {"definitions": {"n": {"type": "integer"}}, "type": "object",
              "properties": {"n": {"$ref": "#/definitions/n"}, "again": {"$ref": "#"}}}
    tool_call_grammar([Tool("f", "", schema)], "hermes", False)  # no 400


def test_reroot_rewrites_only_local_refs() -> None:
    schema = {"$defs": {"A": {"$ref": "#/$defs/B"}}, "items": [{"$ref": "#"}, {"$ref": "https://x/y.json"}]}
    assert reroot(schema, "k") == {"$defs": {"A": {"$ref": "#/$defs/k/$defs/B"}},
                                   "items": [{"$ref": "#/$defs/k"}, {"$ref": "https://x/y.json"}]}


@pytest.mark.parametrize("ref", ["#/$defs/missing", "https://example.com/s.json", "other.json#/x"])
def test_unresolvable_refs_are_a_400(ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
    with pytest.raises(BadRequest, match="cannot be turned into a grammar") as e:
        tool_call_grammar([Tool("f", "", schema)], "hermes", False)
    assert e.value.param == "tools"


def test_response_format_with_a_recursive_root_works_too(vocab: Any) -> None:  # noqa: F811
    assert parses(vocab, schema_grammar(SCHEMAS["recursive"]))
