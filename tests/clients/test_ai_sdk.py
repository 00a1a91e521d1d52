"""The Vercel AI SDK (JavaScript) against a real Hearth: `@ai-sdk/openai-compatible` on Chat
Completions and `@ai-sdk/openai`'s default provider on Responses.

Each flow is a small Node script (js/flows.mjs) run with `node`; it prints one JSON object and
the test asserts on it. Per provider: plain and streamed text (the same text at temperature 0),
a forced tool round trip and structured output with a nested object and bounds; on Chat
Completions an `auto`-mode call written as bare JSON (CALL_GRAMMAR through `providerOptions`:
Hearth must recognise it); on Responses a two-turn chat whose second turn refers to the first
answer by `item_reference` (the provider's default), compared with the same chat sent inline."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.clients.shapes import CALL_GRAMMAR, PERSON_PROMPT, TEXT_MODEL, TOOL_MODEL, City, Person, get_weather
from tests.helpers import Server

pytestmark = pytest.mark.slow

FLOWS = Path(__file__).parent / "js" / "flows.mjs"


@pytest.fixture(params=["chat", "responses"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(flow: str, provider: str, server: Server, model: str, sdk: Path) -> dict[str, Any]:
    env = {**os.environ, "HEARTH_URL": server.url, "HEARTH_MODEL": model, "HEARTH_AI_SDK_DIR": str(sdk),
           "HEARTH_GRAMMAR": CALL_GRAMMAR, "HEARTH_PERSON_PROMPT": PERSON_PROMPT}
    p = subprocess.run(["node", str(FLOWS), flow, provider], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, f"node {flow} {provider} exited {p.returncode}:\n{p.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(p.stdout)
    return result


def test_plain_and_streamed_text_agree(provider: str, text_server: Server, ai_sdk_dir: Path) -> None:
    r = run("text", provider, text_server, TEXT_MODEL, ai_sdk_dir)
    assert r["text"].strip() and r["streamed"] == r["text"]
    assert r["finishReason"] in ("stop", "length") and r["streamFinishReason"] == r["finishReason"]
    assert r["outputTokens"] > 0


def assert_round_trip(r: dict[str, Any]) -> None:
    first = r["steps"][0]
    assert first["finishReason"] == "tool-calls", first
    assert len(r["steps"]) == 2, r["steps"]
    second = r["steps"][1]
    (call,) = first["toolCalls"]
    assert call["toolName"] == "get_weather"
    assert first["toolResults"] == [get_weather(City.model_validate(call["input"]).city)]
    assert second["finishReason"] in ("stop", "length") and not second["toolCalls"] and second["text"].strip()


def test_forced_tool_round_trip(provider: str, tool_server: Server, ai_sdk_dir: Path) -> None:
    assert_round_trip(run("forced", provider, tool_server, TOOL_MODEL, ai_sdk_dir))


def test_auto_mode_untagged_call_round_trip(tool_server: Server, ai_sdk_dir: Path) -> None:
    assert_round_trip(run("auto", "chat", tool_server, TOOL_MODEL, ai_sdk_dir))


def test_structured_output_nested_and_bounded(provider: str, tool_server: Server, ai_sdk_dir: Path) -> None:
    r = run("structured", provider, tool_server, TOOL_MODEL, ai_sdk_dir)
    Person.model_validate(r["output"])  # the SDK validated it with zod too, or the script failed


def test_multi_turn_responses_with_item_references(text_server: Server, ai_sdk_dir: Path) -> None:
    """The second turn's input holds an `item_reference` to the first answer (by default); Hearth
    resolves it from its store, so the prompt is the one the same chat sent inline makes."""
    r = run("multiturn", "responses", text_server, TEXT_MODEL, ai_sdk_dir)
    ref, inline = r["referenced"], r["inline"]
    assert any(item.get("type") == "item_reference" for item in ref["sent"]["input"]), ref["sent"]
    assert not any(item.get("type") == "item_reference" for item in inline["sent"]["input"])
    assert ref["text"].strip() and inline["text"].strip()
    assert ref["first"] == inline["first"]
    assert ref["second"] == inline["second"]
