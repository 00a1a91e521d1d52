"""Reasoning, tool prompts for tool-less templates, and the backend's output pipeline, with
the fake runner standing in for the model."""

from __future__ import annotations

from typing import Any

import pytest

from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.prepare import render_chat
from hearth.chat.output import OutputParser
from hearth.chat.reasoning import ReasoningParser, opens_thinking, template_kwargs
from hearth.chat.template import ChatTemplate
from hearth.chat.tool_parsers import PARSERS
from hearth.chat.tools import as_text_messages, knows_tools
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    Done,
    Finish,
    Message,
    ReasoningDelta,
    ReasoningOptions,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
)
from hearth.engine.fake_runner import EOS
from hearth.engine.thinking import ThinkBudget, ThinkTracker
from hearth.engine.types import SamplingParams
from hearth.errors import BadRequest
from tests.fakes import SMOL, scripted_backend

WEATHER = Tool("get_weather", "Weather", {"type": "object", "properties": {"location": {"type": "string"}}})
NATIVE = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}" + SMOL


# ---- reasoning -------------------------------------------------------------------------------


def split(parser: ReasoningParser, text: str, step: int) -> tuple[str, str]:
    pieces = []
    for i in range(0, len(text), step):
        pieces += parser.feed(text[i:i + step])
    pieces += parser.finish()
    return "".join(t for r, t in pieces if r), "".join(t for r, t in pieces if not r)


@pytest.mark.parametrize("step", [1, 2, 1000])
def test_think_blocks_become_reasoning(step: int) -> None:
    assert split(ReasoningParser(), "<think>\nLet me see.</think>\n\nAnswer.", step) == ("Let me see.", "Answer.")
    assert split(ReasoningParser(inside=True), "hmm</think>ok", step) == ("hmm", "ok")
    assert split(ReasoningParser(), "No thinking <think>here</think>", step) == \
        ("", "No thinking <think>here</think>")
    assert split(ReasoningParser(), "<think>cut off", step) == ("cut off", "")
    assert split(ReasoningParser(), "<thin", step) == ("", "<thin")


def test_reasoning_options_reach_the_template() -> None:
    req = ChatRequest("m", [], reasoning=ReasoningOptions(enable=False, effort="low"),
                      chat_template_kwargs={"reasoning_effort": "high"})
    assert template_kwargs(req) == {"enable_thinking": False, "reasoning_effort": "high"}
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("assistant\n")


def test_think_tracker_forces_the_end_marker_after_the_budget() -> None:
    t = ThinkTracker(ThinkBudget(2, [7, 8], b"<t>", b"</t>"))
    assert t.forced() is None
    t.observe(b"<t>")  # the start marker itself does not count
    for piece in (b"a", b"b"):
        assert t.forced() is None
        t.observe(piece)
    assert [t.forced(), t.forced(), t.forced()] == [7, 8, None]


# ---- tools as text -------------------------------------------------------------------------


def test_tool_history_and_prompt_as_text() -> None:
    msgs = [Message("system", "Be brief."), Message("user", "Weather in Rome?"),
            Message("assistant", None, tool_calls=[ToolCall("call_1", "get_weather", '{"location": "Rome"}'),
                                                   ToolCall("call_2", "get_weather", '{"location": "Oslo"}')]),
            Message("tool", "18C", tool_call_id="call_1"), Message("tool", "2C", tool_call_id="call_2")]
    out = as_text_messages(msgs, [WEATHER])
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[0].content is not None and out[0].content.startswith("Be brief.\n\n")
    assert '"name": "get_weather"' in out[0].content and "<tool_call>" in out[0].content
    assert out[2].content == ('<tool_call>{"name": "get_weather", "arguments": {"location": "Rome"}}</tool_call>\n'
                              '<tool_call>{"name": "get_weather", "arguments": {"location": "Oslo"}}</tool_call>')
    assert out[3].content is not None and out[3].content.count("<tool_response>") == 2
    assert '{"name": "get_weather", "content": "18C"}' in out[3].content
    assert as_text_messages([Message("user", "x")], [WEATHER])[0].role == "system"


def test_a_malformed_call_ends_with_a_clear_finish_and_a_message_naming_it() -> None:
    cut = OutputParser(0, None, PARSERS["hermes"]([WEATHER]))
    evs = cut.feed('Checking. <tool_call>{"name": "get_weather", "arguments": {"location": "Ro')
    evs += cut.finish("length")
    assert not any("<tool_call>" in e.text for e in evs if isinstance(e, TextDelta))
    call_id = next(e.id for e in evs if isinstance(e, ToolCallDelta) and e.id)
    last = evs[-1]
    assert isinstance(last, Finish) and last.reason == "length" and last.error is not None
    assert f"malformed tool call 0 {call_id} (get_weather)" in last.error
    assert "before the call was complete" in last.error
    junk = OutputParser(0, None, PARSERS["hermes"]([WEATHER]))
    evs = junk.feed("<tool_call>get_weather please</tool_call>") + junk.finish("stop")
    assert [type(e) for e in evs] == [Finish] and evs[0].reason == "error"
    assert evs[0].error is not None and "malformed tool call 0" in evs[0].error


def test_template_tool_support_is_probed() -> None:
    assert not knows_tools(ChatTemplate(SMOL)) and knows_tools(ChatTemplate(NATIVE))


def test_output_parser_ids_finish_reason_and_parallel_flag() -> None:
    p = OutputParser(0, ReasoningParser(), PARSERS["hermes"]([WEATHER]), parallel_tool_calls=False)
    evs = p.feed('<think>x</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
                 '<tool_call>{"name": "get_weather", "arguments": {"a": 1}}</tool_call>', n_tokens=3)
    evs += p.finish("stop")
    calls = [e for e in evs if isinstance(e, ToolCallDelta)]
    assert isinstance(evs[0], ReasoningDelta) and evs[0].n_tokens == 3
    assert calls[0].id is not None and calls[0].id.startswith("call_") and len(calls[0].id) == 37
    assert {c.call_index for c in calls} == {0}
    assert evs[-1] == Finish(0, "tool_calls")
    plain = OutputParser(0, None, PARSERS["hermes"]([WEATHER]))
    assert plain.feed("hi")[0] == TextDelta(0, "hi") and plain.finish("length")[-1].reason == "length"


# ---- the backend with a scripted model -----------------------------------------------------


async def backend_for(answer: str, template: str = SMOL) -> LocalBackend:
    b, _ = scripted_backend(answer, template)
    await b.start()
    return b


async def events_of(b: LocalBackend, **kw: Any) -> list[ChatEvent]:
    kw.setdefault("sampling", SamplingParams(temperature=0, max_tokens=120))
    stream = await b.chat(ChatRequest("fake", [Message("user", "Weather in Paris?")], **kw))
    return [ev async for ev in stream]


async def test_backend_turns_tool_call_text_into_events() -> None:
    b = await backend_for('Let me check.<tool_call>{"name": "get_weather", "arguments": {"location": "Paris"}}'
                          "</tool_call>")
    try:
        evs = await events_of(b, tools=[WEATHER])
        text = "".join(e.text for e in evs if isinstance(e, TextDelta))
        calls = [e for e in evs if isinstance(e, ToolCallDelta)]
        assert text == "Let me check."
        assert calls[0].name == "get_weather" and "".join(c.arguments for c in calls) == '{"location": "Paris"}'
        assert [e for e in evs if isinstance(e, Finish)] == [Finish(0, "tool_calls", EOS)]
        assert isinstance(evs[-1], Done) and evs[-1].usage.completion_tokens > 10
        # without tools (or with tool_choice none) the same text stays text
        evs = await events_of(b, tools=[WEATHER], tool_choice="none")
        assert "<tool_call>" in "".join(e.text for e in evs if isinstance(e, TextDelta))
        with pytest.raises(BadRequest):
            await events_of(b, tools=[WEATHER], tool_choice="get_time")
    finally:
        await b.stop()


async def test_backend_prompt_teaches_tools_to_tool_less_templates() -> None:
    b = await backend_for("ok")
    try:
        m = b.model("fake")
        req = ChatRequest("fake", [Message("user", "hi")], tools=[WEATHER])
        assert "<tool_call>" in render_chat(m, req) and not m.native_tools
        req.tool_choice = "none"
        assert "get_weather" not in render_chat(m, req)
    finally:
        await b.stop()


async def test_reasoning_budget_forces_the_end_of_thinking() -> None:
    b = await backend_for("<think>" + "h" * 50 + "</think>The answer.")
    try:
        evs = await events_of(b, reasoning=ReasoningOptions(budget=5))
        reasoning = "".join(e.text for e in evs if isinstance(e, ReasoningDelta))
        text = "".join(e.text for e in evs if isinstance(e, TextDelta))
        # five tokens of thinking, then the forced </think>; the scripted model then goes on by
        # position, so the answer is the rest of its script
        assert reasoning == "hhhhh"
        assert text.endswith("The answer.") and not text.startswith("<")
        evs = await events_of(b)
        assert "".join(e.text for e in evs if isinstance(e, ReasoningDelta)) == "h" * 50
        assert "".join(e.text for e in evs if isinstance(e, TextDelta)) == "The answer."
    finally:
        await b.stop()


def test_think_markers_come_from_the_template() -> None:
    from hearth.chat.reasoning import think_markers

    assert think_markers(SMOL) == ("<think>", "</think>")
    command_r = "{{ '<|START_THINKING|>' }}{{ m.reasoning }}{{ '<|END_THINKING|>' }}" + SMOL
    assert think_markers(command_r) == ("<|START_THINKING|>", "<|END_THINKING|>")
    seed = "{% if t %}<seed:think>{{ t }}</seed:think>{% endif %}"
    assert think_markers(seed) == ("<seed:think>", "</seed:think>")
