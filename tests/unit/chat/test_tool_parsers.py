"""Tool-call parsers: fed one character at a time and all at once, with malformed inputs."""

from __future__ import annotations

import pytest

from hearth.chat.tool_parsers import PARSERS, BadCall, CallPart, Part, parser_for_template
from hearth.chat.types import Tool

TOOLS = [Tool("get_weather", "", {"type": "object", "properties": {"location": {"type": "string"}}}),
         Tool("get_time", "", {"type": "object", "properties": {"tz": {"type": "string"}}})]


def joined(parts: list[Part]) -> list[str | list[object]]:
    """Adjacent text merged; each call as [index, name, arguments]; a malformed call as
    ("bad", index, name, text)."""
    out: list[str | list[object]] = []
    for p in parts:
        if isinstance(p, BadCall):
            out.append(["bad", p.call_index, p.name, p.text])
        elif isinstance(p, str):
            if out and isinstance(out[-1], str):
                out[-1] += p
            else:
                out.append(p)
        elif p.name is not None:
            out.append([p.call_index, p.name, p.arguments])
        else:
            call = next(c for c in reversed(out) if isinstance(c, list) and c[0] == p.call_index)
            assert isinstance(call, list)
            call[2] = str(call[2]) + p.arguments
    return out


def run(name: str, text: str, step: int) -> tuple[list[Part], list[Part]]:
    p = PARSERS[name](TOOLS)
    streamed: list[Part] = []
    for i in range(0, len(text), step):
        streamed += p.feed(text[i:i + step])
    return streamed, p.finish()


CASES = [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Pa}ris\\""}}\n</tool_call>',
     ["Sure.", [0, "get_weather", '{"location": "Pa}ris\\""}']]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>\n'
               '<tool_call>{"arguments": {"tz": "UTC"}, "name": "get_time"}</tool_call>',
     [[0, "get_weather", "{}"], [1, "get_time", '{"tz": "UTC"}']]),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', [[0, "f", '{"a": 1}']]),
    ("hermes", "plain answer, no calls", ["plain answer, no calls"]),
    # malformed calls are reported, never text (SIE's contract)
    ("hermes", "a <tool_call>oops</tool_call> b", ["a", ["bad", 0, None, "<tool_call>oops</tool_call>"], "b"]),
    ("hermes", 'x <tool_call>{"name": 1}</tool_call>', ["x", ["bad", 0, None, '<tool_call>{"name": 1}</tool_call>']]),
    ("hermes", "1 < 2 and <tool_cal is not a tag", ["1 < 2 and <tool_cal is not a tag"]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"location": "Ro',
     [[0, "get_weather", '{"location": "Ro'],  # cut off by max_tokens: what was sent stands, and is reported
      ["bad", 0, "get_weather", '<tool_call>{"name": "get_weather", "arguments": {"location": "Ro']]),
    ("hermes", '<tool_call>{"name": "get_wea', [["bad", 0, None, '<tool_call>{"name": "get_wea']]),
    ("hermes", "<tool_call>{not json", [["bad", 0, None, "<tool_call>{not json"]]),
    ("hermes", "ends with a partial marker <tool_ca", ["ends with a partial marker "]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"location": "X"}}; '
               '{"name": "get_time", "arguments": {}}',
     [[0, "get_weather", '{"location": "X"}'], [1, "get_time", "{}"]]),
    ("llama3", '{"answer": 42} is JSON but no call', ['{"answer": 42} is JSON but no call']),
    ("llama3", "Hello there", ["Hello there"]),
    ("llama3", '{"name": "get_weather", "parameters": {"location": [1, {"a": "}"}]}}',
     [[0, "get_weather", '{"location": [1, {"a": "}"}]}']]),
    ("llama3", '{"broken": ', ['{"broken": ']),
    ("json", '{"name": "get_time", "arguments": {"tz": "CET"}}', [[0, "get_time", '{"tz": "CET"}']]),
    ("mistral", 'hi [TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "X"}}, '
                '{"name": "get_time", "arguments": {"tz": "Z"}}] done',
     ["hi", [0, "get_weather", '{"location": "X"}'], [1, "get_time", '{"tz": "Z"}'], "done"]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"location": "Y"}', [[0, "get_weather", '{"location": "Y"}']]),
    ("mistral", "[TOOL_CALLS] nonsense here", ["[TOOL_CALLS]nonsense here"]),
    ("mistral", "no calls at all", ["no calls at all"]),
    ("pythonic", 'x ```tool_code\nget_weather("Rome")\n``` y', ["x", [0, "get_weather", '{"location": "Rome"}'], "y"]),
    ("pythonic", '```tool_code\n[get_weather(location="A"), get_time(tz="B")]\n```',
     [[0, "get_weather", '{"location": "A"}'], [1, "get_time", '{"tz": "B"}']]),
    ("pythonic", "```tool_code\nunknown_tool(1)\n```", ["```tool_code\nunknown_tool(1)\n```"]),
    ("pythonic", "```tool_code\nget_weather(location=open('x'))\n```",
     ["```tool_code\nget_weather(location=open('x'))\n```"]),
    ("pythonic", "```python\nprint(1)\n```", ["```python\nprint(1)\n```"]),
]


@pytest.mark.parametrize(("name", "text", "expected"), CASES)
def test_same_parts_one_char_at_a_time_and_all_at_once(name: str, text: str, expected: list[object]) -> None:
    for step in (1, 3, len(text)):
        streamed, final = run(name, text, step)
        assert joined(streamed + final) == expected, (step, streamed, final)


@pytest.mark.parametrize("name", ["hermes", "mistral", "pythonic"])
def test_markers_are_never_streamed_as_text(name: str) -> None:
    marker = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "pythonic": "```tool_code"}[name]
    body = {"hermes": '{"name": "get_time", "arguments": {}}</tool_call>',
            "mistral": '[{"name": "get_time", "arguments": {}}]',
            "pythonic": "get_time(tz='a')\n```"}[name]
    p = PARSERS[name](TOOLS)
    text = ""
    for ch in "Checking." + marker + body:
        text += "".join(x for x in p.feed(ch) if isinstance(x, str))
        assert marker[:2] not in text
    assert p.n_calls == 1


def test_arguments_stream_as_they_arrive() -> None:
    p = PARSERS["hermes"](TOOLS)
    p.feed('<tool_call>{"name": "get_weather", "arguments": {"loc')
    parts = p.feed('ation": "Par')
    assert parts == [CallPart(0, None, 'ation": "Par')]


def test_parser_from_template() -> None:
    assert parser_for_template("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert parser_for_template("[AVAILABLE_TOOLS] [TOOL_CALLS]") == "mistral"
    assert parser_for_template("<|start_header_id|>ipython {{ parameters }}<|python_tag|>") == "llama3"
    assert parser_for_template("```tool_code") == "pythonic"
    assert parser_for_template("{{ message['content'] }}") == "hermes"
