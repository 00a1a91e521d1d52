"""pydantic-ai against a real Hearth: `OpenAIChatModel` (Chat Completions), `OpenAIResponsesModel`
(Responses) and `AnthropicModel` (Messages).

Per model: a plain and a streamed run; structured output with a nested model and bounds, both
pydantic-ai's default (a forced call of its output tool, whose parameters carry `$defs`) and
`NativeOutput` (the protocol's JSON-schema output) on the OpenAI protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.clients.shapes import API_KEY, PERSON_PROMPT, TEXT_MODEL, TEXT_PROMPT, TOOL_MODEL, Person
from tests.helpers import Server

pytestmark = pytest.mark.slow


@pytest.fixture(params=["chat", "responses", "messages"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def clients() -> AsyncIterator[tuple[AsyncOpenAI, AsyncAnthropic]]:
    async with AsyncOpenAI(base_url="http://unset", api_key=API_KEY, max_retries=0, timeout=600) as o, \
            AsyncAnthropic(base_url="http://unset", api_key=API_KEY, max_retries=0, timeout=600) as a:
        yield o, a


def model(protocol: str, clients: tuple[AsyncOpenAI, AsyncAnthropic], server: Server, name: str) -> Model:
    o, a = clients
    if protocol == "messages":
        return AnthropicModel(name, provider=AnthropicProvider(anthropic_client=a.with_options(base_url=server.url)))
    provider = OpenAIProvider(openai_client=o.with_options(base_url=server.base_url))
    if protocol == "chat":
        return OpenAIChatModel(name, provider=provider)
    return OpenAIResponsesModel(name, provider=provider)


async def test_plain_and_streamed_runs(protocol: str, clients: tuple[AsyncOpenAI, AsyncAnthropic],
                                       text_server: Server) -> None:
    agent = Agent(model(protocol, clients, text_server, TEXT_MODEL),
                  model_settings=ModelSettings(temperature=0, max_tokens=24))
    result = await agent.run(TEXT_PROMPT)
    assert isinstance(result.output, str) and result.output.strip()
    async with agent.run_stream(TEXT_PROMPT) as stream:
        parts = [delta async for delta in stream.stream_text(delta=True)]
    assert "".join(parts).strip()
    assert stream.usage.output_tokens > 0


# pydantic-ai's AnthropicModel offers NativeOutput only for the Claude models it knows.
@pytest.mark.parametrize(("protocol", "mode"), [("chat", "tool"), ("chat", "native"), ("responses", "tool"),
                                                ("responses", "native"), ("messages", "tool")])
async def test_structured_output_nested_and_bounded(protocol: str, mode: str,
                                                    clients: tuple[AsyncOpenAI, AsyncAnthropic],
                                                    tool_server: Server) -> None:
    """`tool`: pydantic-ai's default, a forced call of its output tool (tool_choice required /
    any), whose parameters hold `$defs`. `native`: the protocol's JSON-schema output."""
    output = Person if mode == "tool" else NativeOutput(Person)
    agent = Agent(model(protocol, clients, tool_server, TOOL_MODEL), output_type=output,  # type: ignore[arg-type]
                  model_settings=ModelSettings(temperature=0, max_tokens=160), retries=0)
    result = await agent.run(PERSON_PROMPT)
    assert isinstance(result.output, Person)
