"""LiteLLM as a client of a real Hearth: `litellm.completion` with `openai/…` (Chat Completions
at `api_base`) and `anthropic/…` (Messages).

Per route: plain and streamed text (the same text at temperature 0; the stream ends with a
finish reason), a forced tool round trip; on `openai/` an `auto`-mode call written as bare
JSON (CALL_GRAMMAR through `extra_body`: Hearth must recognise it) and structured output with a
nested model and bounds (`response_format=Person`)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import
import litellm

from tests.clients.shapes import (
    API_KEY,
    CALL_GRAMMAR,
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
from tests.helpers import EXACT, Server

pytestmark = [
    pytest.mark.slow,
    # pydantic on litellm's own TypedDicts (ReadOnly items), built lazily on first use: not ours to fix
    pytest.mark.filterwarnings(
        r"ignore:Items? .* on TypedDict class '\w+' (is|are) using the `ReadOnly` qualifier:UserWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def _close_litellm() -> Iterator[None]:
    """litellm keeps its HTTP clients in a module-level cache and leaves an event loop set on the
    main thread (its socketpair leaked, and warned in whichever later test replaced the loop):
    close both once this module is done."""
    yield
    from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

    try:  # taken first: asyncio.run below unsets the thread's loop, which would drop it unclosed
        leaked: asyncio.AbstractEventLoop | None = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        leaked = None
    asyncio.run(close_litellm_async_clients())
    for handler in list(litellm.in_memory_llm_clients_cache.cache_dict.values()):
        close = getattr(handler, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            close()
    litellm.in_memory_llm_clients_cache.flush_cache()
    if leaked is not None and not leaked.is_running():
        leaked.close()


@pytest.fixture(params=["openai", "anthropic"])
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def complete(route: str, server: Server, model: str, **kw: Any) -> Any:
    base = server.base_url if route == "openai" else server.url
    return litellm.completion(model=f"{route}/{model}", api_base=base, api_key=API_KEY, temperature=0,
                              num_retries=0, timeout=600, **kw)


def test_plain_and_streamed_text_agree(route: str, text_server: Server) -> None:
    extra = {"extra_body": EXACT} if route == "openai" else {}
    messages = [{"role": "user", "content": TEXT_PROMPT}]
    reply = complete(route, text_server, TEXT_MODEL, messages=messages, max_tokens=24, **extra)
    text = reply.choices[0].message.content
    assert text and text.strip() and reply.choices[0].finish_reason in ("stop", "length")
    parts, finish = [], None
    for chunk in complete(route, text_server, TEXT_MODEL, messages=messages, max_tokens=24, stream=True, **extra):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == text
    assert finish in ("stop", "length")


def round_trip(route: str, server: Server, messages: list[dict[str, Any]], reply: Any) -> None:
    """Run the call LiteLLM parsed, send its result back (no tools on that turn: another call is
    not the model's to choose) and get a text answer."""
    message = reply.choices[0].message
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.id
    args = City.model_validate_json(call.function.arguments)
    history = [*messages, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": get_weather(args.city)}]
    answer = complete(route, server, TOOL_MODEL, messages=history, max_tokens=24, tools=[WEATHER_TOOL],
                      tool_choice="none")
    assert (answer.choices[0].message.content or "").strip()


def test_forced_tool_round_trip(route: str, tool_server: Server) -> None:
    messages = [{"role": "user", "content": WEATHER_PROMPT}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = complete(route, tool_server, TOOL_MODEL, messages=messages, max_tokens=64, tools=[WEATHER_TOOL],
                     tool_choice=choice)
    assert reply.choices[0].finish_reason == "tool_calls"
    round_trip(route, tool_server, messages, reply)


def test_auto_mode_untagged_call_round_trip(tool_server: Server) -> None:
    messages = [{"role": "user", "content": WEATHER_PROMPT}]
    reply = complete("openai", tool_server, TOOL_MODEL, messages=messages, max_tokens=64, tools=[WEATHER_TOOL],
                     tool_choice="auto", extra_body={"grammar": CALL_GRAMMAR})
    assert reply.choices[0].finish_reason == "tool_calls", reply
    round_trip("openai", tool_server, messages, reply)


def test_structured_output_nested_and_bounded(tool_server: Server) -> None:
    reply = complete("openai", tool_server, TOOL_MODEL, messages=[{"role": "user", "content": PERSON_PROMPT}],
                     max_tokens=160, response_format=Person)
    Person.model_validate(json.loads(reply.choices[0].message.content))
