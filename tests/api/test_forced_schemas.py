"""Schemas as the libraries write them, on all three protocols: a forced tool call whose
parameters use `$defs`/`$ref` (pydantic's nested and recursive models) is accepted, and numeric
bounds Hearth cannot enforce are a 400 in the protocol's own error shape, never ignored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from tests.api.conftest import serve


class Address(BaseModel):
    city: str
    zip_code: int = Field(ge=0, le=99999)


class Person(BaseModel):
    name: str
    home: Address
    previous: list[Address]
    work: Address | None = None


class Tree(BaseModel):
    label: str
    children: list[Tree] = []


ARGS = {"name": "Ada", "home": {"city": "London", "zip_code": 1}, "previous": []}
CALL = '<tool_call>{"name": "save_person", "arguments": ' + json.dumps(ARGS) + "}</tool_call>"
USER = [{"role": "user", "content": "Save Ada from London."}]
PERSON, TREE = Person.model_json_schema(), Tree.model_json_schema()


def chat(choice: Any) -> tuple[str, dict[str, Any]]:
    tools = [{"type": "function", "function": {"name": n, "parameters": s}}
             for n, s in (("save_person", PERSON), ("plant", TREE))]
    return "/v1/chat/completions", {"messages": USER, "tools": tools, "tool_choice": choice}


def responses(choice: Any) -> tuple[str, dict[str, Any]]:
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in (("save_person", PERSON), ("plant", TREE))]
    return "/v1/responses", {"input": USER, "tools": tools, "tool_choice": choice}


def messages(choice: Any) -> tuple[str, dict[str, Any]]:
    tools = [{"name": n, "input_schema": s} for n, s in (("save_person", PERSON), ("plant", TREE))]
    return "/v1/messages", {"messages": USER, "tools": tools, "tool_choice": choice}


def called(path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The one tool call in an answer: (name, arguments)."""
    if path == "/v1/chat/completions":
        [c] = body["choices"][0]["message"]["tool_calls"]
        return c["function"]["name"], json.loads(c["function"]["arguments"])
    if path == "/v1/responses":
        [c] = [o for o in body["output"] if o["type"] == "function_call"]
        return c["name"], json.loads(c["arguments"])
    [c] = [b for b in body["content"] if b["type"] == "tool_use"]
    return c["name"], c["input"]


@pytest.mark.parametrize("request_of", [
    lambda: chat({"type": "function", "function": {"name": "save_person"}}), lambda: chat("required"),
    lambda: responses({"type": "function", "name": "save_person"}), lambda: responses("required"),
    lambda: messages({"type": "tool", "name": "save_person"}), lambda: messages({"type": "any"}),
])
async def test_a_forced_call_with_defs_and_recursive_refs_is_accepted(tmp_path: Path, request_of: Any) -> None:
    path, body = request_of()
    async with serve(tmp_path, answer=CALL) as h:
        r = await h.post(path, {**body, "max_tokens": 400, "temperature": 0})
        assert r.status_code == 200, r.text
        name, args = called(path, r.json())
        assert name == "save_person" and Person.model_validate(args)


SCHEMA = {"type": "object", "properties": {"score": {"type": "number", "maximum": 0.5}}, "required": ["score"]}


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}}),
    ("/v1/chat/completions", {"messages": USER, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "rate", "parameters": SCHEMA}}]}),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}}}),
    ("/v1/responses", {"input": "hi", "tool_choice": "required", "tools": [
        {"type": "function", "name": "rate", "parameters": SCHEMA}]}),
    ("/v1/messages", {"messages": USER, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}),
    ("/v1/messages", {"messages": USER, "tool_choice": {"type": "any"}, "tools": [
        {"name": "rate", "input_schema": SCHEMA}]}),
])
async def test_a_bound_that_cannot_be_enforced_is_a_400_naming_it(tmp_path: Path, path: str,
                                                                  body: dict[str, Any]) -> None:
    async with serve(tmp_path) as h:
        r = await h.post(path, {**body, "max_tokens": 8})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        assert "maximum 0.5 at" in err["message"] and "properties.score" in err["message"]
        if path.startswith("/v1/messages"):
            assert r.json()["type"] == "error"


async def test_enforceable_bounds_are_accepted(tmp_path: Path) -> None:
    schema = {"type": "object", "required": ["age"], "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "p": {"type": "number", "minimum": 0, "maximum": 1}}}
    async with serve(tmp_path, answer='{"age": 42}') as h:
        rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
        r = await h.post("/v1/chat/completions", {"messages": USER, "max_tokens": 16, "temperature": 0,
                                                  "response_format": rf})
        assert r.status_code == 200, r.text
