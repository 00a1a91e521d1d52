"""The OpenAI Agents SDK against a real Hearth, on both of its models: `OpenAIChatCompletionsModel`
(Chat Completions) and `OpenAIResponsesModel` (Responses).

Per model: a plain and a streamed run, a forced tool round trip (`tool_choice="required"`) whose
tool takes a pydantic model (nested: `$defs` in its parameters), structured output
(`output_type`, strict JSON schema with a nested model and bounds); on Chat Completions an
`auto`-mode call the model writes as bare JSON (CALL_GRAMMAR; Hearth must recognise it); on
Responses a `previous_response_id` chain. Tool runs stop on the first tool's result
(`stop_on_first_tool`): what the model would say after it is its free choice, not under test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem
from agents.models.interface import Model
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent

from tests.clients.shapes import (
    API_KEY,
    CALL_GRAMMAR,
    PERSON_PROMPT,
    TEXT_MODEL,
    TEXT_PROMPT,
    TOOL_MODEL,
    WEATHER_PROMPT,
    Address,
    City,
    Forecast,
    Person,
    get_weather,
)
from tests.helpers import Server

pytestmark = pytest.mark.slow

set_tracing_disabled(True)  # the SDK would post traces to OpenAI


@function_tool
def weather(city: str) -> str:
    """The current weather in a city."""
    return get_weather(city)


@function_tool
def forecast(place: Address, days: int) -> str:
    """The forecast for a place, for 1 to 7 days."""
    return f"Sunny for {days} days in {place.city}."


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url="http://unset", api_key=API_KEY, max_retries=0, timeout=600) as c:
        yield c


def model(api: str, client: AsyncOpenAI, server: Server, name: str) -> Model:
    c = client.with_options(base_url=server.base_url)
    if api == "chat":
        return OpenAIChatCompletionsModel(model=name, openai_client=c)
    return OpenAIResponsesModel(model=name, openai_client=c)


async def test_plain_and_streamed_runs(api: str, client: AsyncOpenAI, text_server: Server) -> None:
    agent = Agent(name="plain", instructions="Answer briefly.", model=model(api, client, text_server, TEXT_MODEL),
                  model_settings=ModelSettings(temperature=0, max_tokens=24))
    result = await Runner.run(agent, TEXT_PROMPT)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    streamed = Runner.run_streamed(agent, TEXT_PROMPT)
    deltas = [e.data.delta async for e in streamed.stream_events()
              if e.type == "raw_response_event" and isinstance(e.data, ResponseTextDeltaEvent)]
    assert streamed.is_complete and "".join(deltas).strip()
    assert isinstance(streamed.final_output, str) and streamed.final_output == "".join(deltas)


async def test_forced_tool_with_pydantic_arguments(api: str, client: AsyncOpenAI, tool_server: Server) -> None:
    """tool_choice required, a tool whose parameters hold a nested model (`$defs`/`$ref`)."""
    agent = Agent(name="tools", instructions="Use the tools.", model=model(api, client, tool_server, TOOL_MODEL),
                  tools=[forecast], tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(temperature=0, max_tokens=96, tool_choice="required"))
    result = await Runner.run(agent, "The forecast for 3 days at 1 Rue de la Paix, Paris?", max_turns=2)
    (call,) = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    Forecast.model_validate_json(call.raw_item.arguments)  # type: ignore[union-attr]
    assert isinstance(result.final_output, str) and result.final_output.startswith("Sunny for ")


async def test_forced_tool_round_trip(api: str, client: AsyncOpenAI, tool_server: Server) -> None:
    agent = Agent(name="tools", instructions="Use the tools.", model=model(api, client, tool_server, TOOL_MODEL),
                  tools=[weather], tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="weather"))
    result = await Runner.run(agent, WEATHER_PROMPT.replace("get_weather", "weather"), max_turns=2)
    (call,) = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    City.model_validate_json(call.raw_item.arguments)  # type: ignore[union-attr]
    assert result.final_output == get_weather(City.model_validate_json(call.raw_item.arguments).city)  # type: ignore[union-attr]


async def test_auto_mode_untagged_call(client: AsyncOpenAI, tool_server: Server) -> None:
    """`auto` mode; the grammar makes the model write `{"name": "get_weather", "arguments": ...}`
    as text. Hearth must turn it into a call the SDK runs."""
    @function_tool(name_override="get_weather")
    def get_weather_tool(city: str) -> str:
        """The current weather in a city."""
        return get_weather(city)

    agent = Agent(name="auto", instructions="Use the tools.", model=model("chat", client, tool_server, TOOL_MODEL),
                  tools=[get_weather_tool], tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(temperature=0, max_tokens=64, extra_body={"grammar": CALL_GRAMMAR}))
    result = await Runner.run(agent, WEATHER_PROMPT, max_turns=2)
    assert [i for i in result.new_items if isinstance(i, ToolCallItem)], result.new_items
    assert result.final_output == get_weather("Paris")


async def test_structured_output(api: str, client: AsyncOpenAI, tool_server: Server) -> None:
    agent = Agent(name="structured", instructions="Reply in JSON.", output_type=Person,
                  model=model(api, client, tool_server, TOOL_MODEL),
                  model_settings=ModelSettings(temperature=0, max_tokens=160))
    result = await Runner.run(agent, PERSON_PROMPT, max_turns=1)
    assert isinstance(result.final_output, Person)


async def test_previous_response_id(client: AsyncOpenAI, tool_server: Server) -> None:
    """The second run sends only its new input and the first run's response id; the prompt Hearth
    rebuilds from its store holds the first exchange too."""
    agent = Agent(name="chain", instructions="Answer briefly.",
                  model=model("responses", client, tool_server, TOOL_MODEL),
                  model_settings=ModelSettings(temperature=0, max_tokens=16))
    first = await Runner.run(agent, "My name is Ada. Say hello.")
    assert first.last_response_id and first.last_response_id.startswith("resp_")
    second = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert isinstance(second.final_output, str) and second.final_output.strip()
    u1, u2 = first.context_wrapper.usage, second.context_wrapper.usage
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
