"""hearth.chat.schema_bounds: a schema's or grammar's cost is bounded before anything expands it."""

from __future__ import annotations

from typing import Any

import pytest

from hearth.chat import schema_bounds as sb
from hearth.errors import BadRequest

ARRAY = {"type": "array", "items": {"type": "integer"}}


@pytest.mark.parametrize(("schema", "named"), [
    ({**ARRAY, "minItems": 10_000_000}, "minItems 1e+07"),
    ({**ARRAY, "maxItems": 1e12}, "maxItems"),
    ({"type": "string", "maxLength": 5_000}, "maxLength"),
    ({"type": "string", "pattern": "a{1,1000000}"}, "repetition {1,1000000}"),
    ({"type": "string", "pattern": "a" * 2000}, "pattern of 2000"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200)}}, "200 optional properties"),
    ({"type": "object", "properties": {"x" * 300: {"type": "string"}}, "required": ["x" * 300]}, "property name"),
    ({"anyOf": [{**ARRAY, "minItems": 900} for _ in range(20)]}, "adding up"),
])
def test_expensive_schemas_are_refused_naming_the_limit(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(BadRequest, match="the limit is") as e:
        sb.check_schema(schema)
    assert named in e.value.message and e.value.param == "response_format"


def test_deep_and_wide_schemas_are_refused() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(sb.MAX_SCHEMA_DEPTH):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(BadRequest, match="nested deeper"):
        sb.check_schema(deep)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(sb.MAX_SCHEMA_NODES)},
            "required": [f"p{i}" for i in range(sb.MAX_SCHEMA_NODES)]}
    with pytest.raises(BadRequest, match="subschemas"):
        sb.check_schema(wide, "tools")


def test_ordinary_schemas_pass() -> None:
    sb.check_schema({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 100, "pattern": "^[a-z]{1,20}$"},
        "tags": {**ARRAY, "minItems": 1, "maxItems": 10},
        "nested": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
    }, "required": ["name"]})


def test_grammars_are_bounded_by_size_and_nesting() -> None:
    sb.check_grammar('root ::= "a" ("b" | "c")* [()]')
    with pytest.raises(BadRequest, match="bytes"):
        sb.check_grammar('root ::= "' + "a" * (sb.MAX_GRAMMAR_BYTES + 1) + '"')
    deep = "root ::= " + "(" * (sb.MAX_GRAMMAR_NESTING + 1) + '"a"' + ")" * (sb.MAX_GRAMMAR_NESTING + 1)
    with pytest.raises(BadRequest, match="nests groups"):
        sb.check_grammar(deep)
    # parentheses inside literals, classes and comments are not groups
    sb.check_grammar('root ::= "' + "(" * 5000 + '" [' + "(" * 5000 + "] # " + "(" * 5000 + "\n")
