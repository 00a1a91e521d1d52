"""What the client-library tests share: the tool, the structured-output models, the grammar that
writes an untagged call, and the request knobs that take chance out of a verdict.

The verdicts are on the protocol and the parsed objects (a call with the right name and
arguments that validate, a parsed pydantic object, non-empty text, a stream that ended), never
on the model's wording. Where the model's free choice would decide, it is forced: `tool_choice`
for forced calls, `CALL_GRAMMAR` for auto-mode calls (the model must write the bare JSON call
Qwen2.5-Coder writes by habit, as text, and the verdict is whether Hearth recognises it as a
call), the client's own structured output for the rest."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from hearth.models import DEFAULT_MODEL_ID

TEXT_MODEL = DEFAULT_MODEL_ID
TOOL_MODEL = "qwen2.5-coder-0.5b"
API_KEY = "unused"  # Hearth runs without a key here; the libraries insist on one

WEATHER_PROMPT = "What is the weather in Paris? Use the get_weather tool."
# The year asked for is out of Person.born's bounds: left to itself the model writes 1815 (seen:
# `"born": 1815`), so only a grammar that enforces `minimum` keeps the reply valid.
PERSON_PROMPT = "Invent a person born in 1815 who lives in Lyon: their name, age, year of birth and address."
TEXT_PROMPT = "What is the capital of France?"

# The call Qwen2.5-Coder writes in `auto` mode (issue 23: bare JSON, no <tool_call> tags), as
# the only text the grammar allows. Its arguments validate against get_weather's parameters.
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
CALL_GRAMMAR = "root ::= " + json.dumps(json.dumps(CALL))  # a GBNF string literal of the JSON text

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city's name"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {  # Chat Completions' shape
    "type": "function",
    "function": {"name": "get_weather", "description": "The current weather in a city.",
                 "parameters": WEATHER_PARAMETERS},
}


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"Sunny, 21 C in {city}."


class City(BaseModel):
    """get_weather's arguments, as a model: what a parsed call must validate against."""

    city: str = Field(min_length=1)


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)


class Person(BaseModel):
    """Structured output with a nested model (a `$defs` entry and a `$ref` in the JSON schema)
    and numeric bounds (`minimum`/`maximum`): the client validates what comes back."""

    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)
    born: int = Field(ge=1900, le=2100)
    address: Address


class Resident(BaseModel):
    """`Person` without its numeric bounds, for Anthropic's own structured output: the Anthropic
    SDK moves `minimum`/`maximum` into the field's description before it sends a schema (its API
    takes none in output schemas), so no server could enforce them there; the nested model
    (`$defs`) still reaches Hearth and is what the client validates."""

    name: str = Field(max_length=40)
    address: Address


class Forecast(BaseModel):
    """Tool arguments with a nested model: a forced call whose parameters use `$defs`."""

    place: Address
    days: int = Field(ge=1, le=7)
