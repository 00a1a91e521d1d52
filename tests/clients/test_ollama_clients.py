"""Ollama's own clients against Hearth's native API (/api/*): the official Python client's tool
round trip, LangChain's `ChatOllama` (text, streaming, tools, structured output) and Ollama's
JavaScript client (`ollama` on npm; js/ollama.mjs).

Ollama's API has no tool_choice: the tool flows rest on the 32k coder model writing the call at
temperature 0 (greedy decoding, the same call every run on the same weights). The verdicts are
on the protocol: a call whose arguments are an object that validates, the result sent back
by tool name, parsed structured output, non-empty text, a stream that ended."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_ollama import ChatOllama

from tests.clients.shapes import (
    PERSON_PROMPT,
    TEXT_MODEL,
    TEXT_PROMPT,
    TOOL_MODEL,
    WEATHER_PROMPT,
    WEATHER_TOOL,
    City,
    Person,
    get_weather,
)
from tests.helpers import Server

pytestmark = pytest.mark.slow

JS = Path(__file__).parent / "js" / "ollama.mjs"


def test_the_python_client_completes_a_tool_round_trip(tool_server: Server) -> None:
    client = ollama.Client(host=tool_server.url, timeout=900)
    try:
        messages: list[Any] = [{"role": "user", "content": WEATHER_PROMPT}]
        r = client.chat(model=f"{TOOL_MODEL}:latest", messages=messages, tools=[WEATHER_TOOL],
                        options={"temperature": 0})
        [call] = r.message.tool_calls or []
        assert call.function.name == "get_weather"
        args = City.model_validate(call.function.arguments)  # an object, not a JSON string
        streamed = [p for p in client.chat(model=TOOL_MODEL, messages=messages, tools=[WEATHER_TOOL],
                                           options={"temperature": 0}, stream=True) if p.message.tool_calls]
        assert [[c.function.name for c in p.message.tool_calls or []] for p in streamed] == [["get_weather"]]
        messages += [r.message, {"role": "tool", "content": get_weather(args.city), "tool_name": "get_weather"}]
        second = client.chat(model=TOOL_MODEL, messages=messages, tools=[WEATHER_TOOL],
                             options={"temperature": 0, "num_predict": 48})
        assert second.done and second.eval_count
    finally:
        client._client.close()


@contextlib.contextmanager
def chat_ollama(**kw: Any) -> Iterator[ChatOllama]:
    """A ChatOllama whose HTTP client is closed after (the library leaves it open: a warning,
    an error under this suite's rules)."""
    llm = ChatOllama(**kw)
    try:
        yield llm
    finally:
        if llm._client is not None:
            llm._client._client.close()


def test_chat_ollama_text_and_stream(text_server: Server) -> None:
    with chat_ollama(model=TEXT_MODEL, base_url=text_server.url, temperature=0, num_predict=24) as llm:
        text_and_stream(llm)


def text_and_stream(llm: ChatOllama) -> None:
    whole = llm.invoke(TEXT_PROMPT)
    assert isinstance(whole, AIMessage) and isinstance(whole.content, str) and whole.content.strip()
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    streamed = "".join(str(chunk.content) for chunk in llm.stream(TEXT_PROMPT))
    assert streamed == whole.content


def test_chat_ollama_tools(tool_server: Server) -> None:
    with chat_ollama(model=TOOL_MODEL, base_url=tool_server.url, temperature=0, num_predict=64) as chat:
        tool_round_trip(chat)


def tool_round_trip(chat: ChatOllama) -> None:
    llm = chat.bind_tools([get_weather])
    first = llm.invoke(WEATHER_PROMPT)
    assert isinstance(first, AIMessage)
    [call] = first.tool_calls
    assert call["name"] == "get_weather"
    city = City.model_validate(call["args"]).city
    done = llm.invoke([("user", WEATHER_PROMPT), first, ToolMessage(get_weather(city), tool_call_id=call["id"])])
    assert isinstance(done, AIMessage)


def test_chat_ollama_structured_output(tool_server: Server) -> None:
    """`format` as a JSON schema with a nested model and numeric bounds (PERSON_PROMPT asks for a
    year out of bounds): the grammar keeps the reply valid."""
    with chat_ollama(model=TOOL_MODEL, base_url=tool_server.url, temperature=0, num_predict=256) as llm:
        person = llm.with_structured_output(Person, method="json_schema").invoke(PERSON_PROMPT)
    assert isinstance(person, Person) and 1900 <= person.born <= 2100


def run(flow: str, server: Server, model: str, sdk: Path) -> dict[str, Any]:
    env = {**os.environ, "HEARTH_URL": server.url, "HEARTH_MODEL": model, "HEARTH_OLLAMA_JS_DIR": str(sdk),
           "HEARTH_PROMPT": WEATHER_PROMPT}
    p = subprocess.run(["node", str(JS), flow], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, f"node ollama.mjs {flow} exited {p.returncode}:\n{p.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(p.stdout)
    return result


def test_ollama_js_text(text_server: Server, ollama_js_dir: Path) -> None:
    r = run("text", text_server, TEXT_MODEL, ollama_js_dir)
    assert r["text"].strip() and r["streamed"] == r["text"] and r["generated"].strip()
    assert r["streamDone"] is True and r["streamDoneReason"] == r["doneReason"] and r["evalCount"] > 0


def test_ollama_js_models(text_server: Server, ollama_js_dir: Path) -> None:
    r = run("models", text_server, TEXT_MODEL, ollama_js_dir)
    assert f"{TEXT_MODEL}:latest" in r["names"] and f"{TEXT_MODEL}:latest" in r["loaded"]
    assert r["family"] and r["capabilities"] == ["completion"] and r["version"] and r["pull"] == "success"
    assert r["missing"] == {"status": 404, "error": 'model "missing:7b" not found, try pulling it first'}
    assert r["noPull"]["status"] == 404


def test_ollama_js_tools(tool_server: Server, ollama_js_dir: Path) -> None:
    [call] = run("tools", tool_server, TOOL_MODEL, ollama_js_dir)["calls"]
    assert call["function"]["name"] == "get_weather"
    City.model_validate(call["function"]["arguments"])
