"""Schemas as the libraries write them, with the real default model through the official SDKs:
forced calls whose parameters use `$defs`/`$ref` (pydantic's nested models) on chat, Responses
and Messages, and numeric bounds that the grammar holds the model to. The grammar decides the
shape, so the assertions are that the arguments parse and validate (and the numbers lie in
range), never what the model chose to write. Every string and list is bounded, so the answer
ends within max_tokens whatever the model writes. (A recursive model is not here: at
temperature 0 this model nests children until max_tokens; tests/api/test_forced_schemas.py
shows such a call accepted, tests/unit/chat/test_schema_refs.py its grammar.)"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from anthropic import Anthropic
from openai import OpenAI
from pydantic import BaseModel, Field

from hearth.models import DEFAULT_MODEL_ID
from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow
T0 = {**EXACT, "temperature": 0}  # the anthropic SDK takes sampling arguments in the body


class Address(BaseModel):
    city: str = Field(max_length=24)
    zip_code: int = Field(ge=10000, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    home: Address
    previous: list[Address] = Field(max_length=2)
    work: Address | None = None


ASK = "Save the person Ada Lovelace, 36 years old, who lives in London."
PERSON = Person.model_json_schema()
AGE = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150},
                                        "score": {"type": "number", "minimum": 0, "maximum": 1}},
       "required": ["age", "score"], "additionalProperties": False}


@pytest.fixture(scope="module")
def oai(server: Server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def ant(server: Server) -> Anthropic:
    return Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=600)


def test_chat_forced_call_with_nested_defs(oai: OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {"name": "save_person", "parameters": PERSON}}]
    r = oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": ASK}], tools=tools,
                                    tool_choice="required", temperature=0, max_tokens=400, extra_body=EXACT)
    [call] = r.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "save_person"
    p = Person.model_validate(json.loads(call.function.arguments))
    assert 0 <= p.age <= 150 and 10000 <= p.home.zip_code <= 99999


def test_responses_forced_call_with_nested_defs(oai: OpenAI) -> None:
    tools: Any = [{"type": "function", "name": "save_person", "parameters": PERSON, "strict": True}]
    r = oai.responses.create(model=DEFAULT_MODEL_ID, input=ASK, tools=tools, tool_choice="required", temperature=0,
                             max_output_tokens=400, extra_body=EXACT)
    [call] = [o for o in r.output if o.type == "function_call"]
    Person.model_validate(json.loads(call.arguments))


def test_messages_forced_call_with_nested_defs(ant: Anthropic) -> None:
    r = ant.messages.create(model=DEFAULT_MODEL_ID, max_tokens=400,
                            messages=[{"role": "user", "content": ASK}],
                            tools=[{"name": "save_person", "input_schema": PERSON}],
                            tool_choice={"type": "tool", "name": "save_person"}, extra_body=T0)
    [use] = [b for b in r.content if b.type == "tool_use"]
    Person.model_validate(use.input)


def in_range(value: Any) -> None:
    jsonschema.validate(value, AGE)  # the bounds included


def test_chat_strict_schema_with_bounds(oai: OpenAI) -> None:
    r = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, temperature=0, max_tokens=60, extra_body=EXACT,
        messages=[{"role": "user", "content": "How old is the oldest tree on Earth? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "age", "schema": AGE, "strict": True}})
    in_range(json.loads(r.choices[0].message.content or ""))


def test_responses_strict_schema_with_bounds(oai: OpenAI) -> None:
    r = oai.responses.create(model=DEFAULT_MODEL_ID, input="How old is the oldest tree on Earth? Answer in JSON.",
                             text={"format": {"type": "json_schema", "name": "age", "schema": AGE, "strict": True}},
                             temperature=0, max_output_tokens=60, extra_body=EXACT)
    in_range(json.loads(r.output_text))


def test_messages_forced_tool_with_bounds(ant: Anthropic) -> None:
    r = ant.messages.create(model=DEFAULT_MODEL_ID, max_tokens=60,
                            messages=[{"role": "user", "content": "The oldest tree is 4855 years old. Record it."}],
                            tools=[{"name": "record", "input_schema": AGE}], tool_choice={"type": "any"},
                            extra_body=T0)
    [use] = [b for b in r.content if b.type == "tool_use"]
    in_range(use.input)
