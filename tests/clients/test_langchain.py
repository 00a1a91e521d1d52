"""LangChain against a real Hearth: `ChatOpenAI` on Chat Completions and on Responses
(`use_responses_api=True`), `ChatAnthropic` on Messages.

Per protocol: plain and streamed text (the same text at temperature 0, the stream ends with a
finish reason), a forced tool round trip, an `auto`-mode call (forced by CALL_GRAMMAR where the
protocol takes a grammar: Hearth must recognise the untagged JSON call), structured output with
a nested model and bounds, and on Responses a `previous_response_id` chain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.clients.shapes import (
    API_KEY,
    CALL_GRAMMAR,
    PERSON_PROMPT,
    TEXT_MODEL,
    TEXT_PROMPT,
    TOOL_MODEL,
    WEATHER_PROMPT,
    City,
    Person,
    Resident,
)
from tests.clients.shapes import get_weather as weather
from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return weather(city)


def openai_chat(server: Server, model: str, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=server.base_url, api_key=API_KEY, temperature=0, max_retries=0,
                      timeout=600, stream_usage=True, **kw)


def anthropic_chat(server: Server, model: str, **kw: Any) -> ChatAnthropic:
    return ChatAnthropic(model_name=model, base_url=server.url, api_key=API_KEY, temperature=0, max_retries=0,
                         timeout=600, stop=None, **kw)


@pytest.fixture(params=["chat", "responses", "messages"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make(protocol: str, server: Server, model: str, **kw: Any) -> ChatOpenAI | ChatAnthropic:
    if protocol == "messages":
        return anthropic_chat(server, model, **kw)
    return openai_chat(server, model, use_responses_api=protocol == "responses", **kw)


def text_of(message: BaseMessage) -> str:
    return message.text if isinstance(message.text, str) else message.text()


def test_plain_and_streamed_text_agree(protocol: str, text_server: Server) -> None:
    """Temperature 0 and the whole prompt recomputed each time (EXACT): the stream's text is the
    invoke's text, chunk by chunk, and the stream ends with the reply's stop reason."""
    extra = {} if protocol == "messages" else {"extra_body": EXACT}
    llm = make(protocol, text_server, TEXT_MODEL, max_tokens=24, **extra)
    reply = llm.invoke(TEXT_PROMPT)
    assert isinstance(reply, AIMessage) and text_of(reply).strip()
    chunks: Iterator[AIMessageChunk] = llm.stream(TEXT_PROMPT)
    merged: AIMessageChunk | None = None
    for chunk in chunks:
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and text_of(merged) == text_of(reply)
    meta = merged.response_metadata
    reason = meta.get("finish_reason") or meta.get("stop_reason") or meta.get("status")
    assert reason in ("stop", "length", "end_turn", "max_tokens", "completed", "incomplete"), meta
    assert merged.usage_metadata is not None and merged.usage_metadata["output_tokens"] > 0


def closing_turn(protocol: str, server: Server, history: list[BaseMessage]) -> None:
    """Send the tool's result back; the model answers in text (no tools offered on this turn:
    its choice of another call cannot decide the verdict)."""
    llm = make(protocol, server, TOOL_MODEL, max_tokens=24)
    answer = llm.invoke(history)
    assert isinstance(answer, AIMessage) and not answer.tool_calls and text_of(answer).strip()


def run_tool(history: list[BaseMessage], reply: AIMessage) -> list[BaseMessage]:
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    City.model_validate(call["args"])
    return [*history, reply, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]


def test_forced_tool_round_trip(protocol: str, tool_server: Server) -> None:
    llm = make(protocol, tool_server, TOOL_MODEL, max_tokens=64).bind_tools([get_weather], tool_choice="get_weather")
    history: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    reply = llm.invoke(history)
    assert isinstance(reply, AIMessage)
    closing_turn(protocol, tool_server, run_tool(history, reply))


def test_auto_mode_untagged_call_round_trip(tool_server: Server) -> None:
    """`auto` mode, the model writing the call as bare JSON text (the grammar makes it): Hearth
    must hand LangChain a structured call, not text. Chat Completions only: `grammar` is a
    Chat Completions extension."""
    llm = openai_chat(tool_server, TOOL_MODEL, max_tokens=64, extra_body={"grammar": CALL_GRAMMAR})
    history: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    reply = llm.bind_tools([get_weather], tool_choice="auto").invoke(history)
    assert isinstance(reply, AIMessage)
    assert reply.response_metadata.get("finish_reason") == "tool_calls", reply
    closing_turn("chat", tool_server, run_tool(history, reply))


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_nested_and_bounded(protocol: str, method: str, tool_server: Server) -> None:
    """A pydantic model with a nested model (`$defs`) and `le=150`, through the protocol's
    structured output (`json_schema`) and through a forced tool call (`function_calling`)."""
    llm = make(protocol, tool_server, TOOL_MODEL, max_tokens=160)
    model = Resident if (protocol, method) == ("messages", "json_schema") else Person
    person = llm.with_structured_output(model, method=method).invoke(PERSON_PROMPT)
    assert isinstance(person, model)


def test_previous_response_id_chain(tool_server: Server) -> None:
    """`use_previous_response_id`: the second turn sends only the new message and the first
    reply's id; Hearth rebuilds the conversation from its store, so the second prompt holds the
    first one, its answer and the new message."""
    llm = openai_chat(tool_server, TOOL_MODEL, max_tokens=16, use_responses_api=True, use_previous_response_id=True)
    history: list[BaseMessage] = [HumanMessage("My name is Ada. Say hello.")]
    first = llm.invoke(history)
    assert isinstance(first, AIMessage) and first.response_metadata["id"].startswith("resp_")
    second = llm.invoke([*history, first, HumanMessage("What is my name?")])
    assert isinstance(second, AIMessage) and text_of(second).strip()
    assert first.usage_metadata is not None and second.usage_metadata is not None
    assert second.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"] + \
        first.usage_metadata["output_tokens"]
