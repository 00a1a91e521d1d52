"""Tool calls written without the template's markers (tool_parsers/lenient.py): 50 calls in the
shapes models write, recognised; 50 answers that are JSON but not calls, left byte for byte as
the family parser alone leaves them. Every case is fed all at once and one character at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearth.chat.output import OutputParser
from hearth.chat.tool_parsers import PARSERS, CallPart, Part, make_parser
from hearth.chat.tools import plan_output
from hearth.chat.types import ChatRequest, Finish, Message, Tool, ToolCallDelta
from tests.unit.chat.test_tool_parsers import joined

OBJ = "object"
TOOLS = [
    Tool("get_weather", "", {"type": OBJ, "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                             "required": ["city"], "additionalProperties": False}),
    Tool("calculator", "", {"type": OBJ, "properties": {"expression": {"type": "string"}},
                            "required": ["expression"]}),
    Tool("search", "", {"type": OBJ, "properties": {"query": {"type": "string"},
                                                   "max_results": {"type": "integer"}}, "required": ["query"]}),
    Tool("read_file", "", {"type": OBJ, "properties": {"path": {"type": "string"}}, "required": ["path"],
                           "additionalProperties": False}),
    Tool("create_event", "", {"type": OBJ, "required": ["title", "when"], "properties": {
        "title": {"type": "string"},
        "when": {"type": OBJ, "required": ["date"], "properties": {"date": {"type": "string"},
                                                                    "time": {"type": "string"}}},
        "guests": {"type": "array", "items": {"type": "string"}}}}),
    Tool("get_time", "", {"type": OBJ, "properties": {}, "additionalProperties": False}),
]

# ---- recognised ------------------------------------------------------------------------------

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"city": "São Paulo", "unit": "c"}),
    ("calculator", {"expression": "(2 + 3) * 7 / {x}"}),
    ("search", {"query": "llama.cpp \"grammar\" [docs]", "max_results": 5}),
    ("read_file", {"path": "C:\\Users\\me\\notes.txt"}),
    ("create_event", {"title": "Lunch 🍜", "when": {"date": "2026-01-02", "time": "12:30"}, "guests": ["Ann", "Bo"]}),
    ("get_time", {}),
    ("search", {"query": "東京の天気"}),
    ("create_event", {"title": "x", "when": {"date": "tomorrow"}}),
    ("get_weather", {"city": "Reykjavík", "unit": "f"}),
]


def _obj(name: str, args: dict[str, Any], key: str = "arguments", indent: int | None = None) -> str:
    return json.dumps({"name": name, key: args}, ensure_ascii=False, indent=indent)


def _shape(k: int, i: int) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """The k-th shape of call i: (text, [(name, arguments)])."""
    name, args = CALLS[i]
    nxt, third = CALLS[(i + 1) % len(CALLS)], CALLS[(i + 2) % len(CALLS)]
    if k == 0:  # bare
        return _obj(name, args), [(name, args)]
    if k == 1:  # fenced ```json, whitespace around, `parameters`
        return f"\n```json\n{_obj(name, args, 'parameters')}\n```\n", [(name, args)]
    if k == 2:  # plain fence, pretty-printed, arguments first
        body = json.dumps({"arguments": args, "name": name}, ensure_ascii=False, indent=2)
        return f"```\n{body}\n```", [(name, args)]
    if k == 3:  # parallel calls: a list of two, bare, with newlines
        return f"  [\n  {_obj(name, args)},\n  {_obj(*nxt, 'parameters')}\n]\n\n", [(name, args), nxt]
    # a fenced list of three, ensure_ascii escapes
    body = json.dumps([{"name": n, "arguments": a} for n, a in ((name, args), nxt, third)])
    return f"```json\n{body}\n```", [(name, args), nxt, third]


POSITIVES = [_shape(k, i) for k in range(5) for i in range(len(CALLS))]


def feed(parser: str, text: str, step: int, lenient: bool = True, tools: list[Tool] = TOOLS) -> list[Part]:
    p = make_parser(parser, tools, lenient)
    parts: list[Part] = []
    for i in range(0, len(text), step):
        parts += p.feed(text[i:i + step])
    return parts + p.finish()


def calls_of(parts: list[Part]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for c in joined(parts):
        assert isinstance(c, list), f"text among the calls: {c!r}"
        out.append((str(c[1]), json.loads(str(c[2]))))
    return out


def test_there_are_fifty_of_each() -> None:
    assert len(POSITIVES) == 50 and len(NEGATIVES) >= 50


@pytest.mark.parametrize(("text", "expected"), POSITIVES)
@pytest.mark.parametrize("step", [1, 10**6], ids=["by-char", "whole"])
def test_calls_as_models_write_them_are_calls(text: str, expected: list[tuple[str, dict[str, Any]]],
                                              step: int) -> None:
    assert calls_of(feed("hermes", text, step)) == expected


# ---- left as text ----------------------------------------------------------------------------

W = _obj("get_weather", {"city": "Paris"})
NEGATIVES = [
    '{"city": "Paris", "temperature": 21}',  # a JSON answer the user asked for
    '{"name": "Alice", "age": 30}',
    '{"name": "Alice", "arguments": ["she", "said"]}',
    '[{"name": "Alice"}, {"name": "Bob"}]',
    '{"type": "object", "properties": {"city": {"type": "string"}}}',
    '{\n  "answer": 42\n}',
    '"get_weather"', "42", "null", "[]", "[1, 2, 3]", "{}",
    '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}',  # extra key
    '{"name": "calculator", "parameters": {"expression": "1"}, "arguments": {"expression": "1"}}',
    '{"name": "get_weather"}',  # no arguments
    '{"arguments": {"city": "Paris"}}',  # no name
    '{"function": "get_weather", "arguments": {"city": "Paris"}}',
    '{"tool": "calculator", "args": {"expression": "1+1"}}',
    '{"name": "get_wether", "arguments": {"city": "Paris"}}',  # unknown tool
    '{"name": "GET_WEATHER", "arguments": {"city": "Paris"}}',
    '{"name": "get_weather ", "arguments": {"city": "Paris"}}',
    '{"name": 5, "arguments": {}}',
    '{"name": "get_weather", "arguments": {}}',  # schema: missing required
    '{"name": "get_weather", "arguments": {"city": 42}}',  # wrong type
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}',  # enum miss
    '{"name": "get_weather", "arguments": {"city": "Paris", "country": "FR"}}',  # additionalProperties false
    '{"name": "search", "arguments": {"query": "x", "max_results": "five"}}',
    '{"name": "search", "arguments": {"query": "x", "max_results": 2.5}}',
    '{"name": "create_event", "arguments": {"title": "x", "when": {"time": "12:00"}}}',  # nested required
    '{"name": "create_event", "arguments": {"title": "x", "when": {"date": "d"}, "guests": [1]}}',  # items
    '{"name": "get_time", "arguments": {"tz": "UTC"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',  # arguments as a string
    '{"name": "get_weather", "arguments": null}',
    '{"name": "get_weather", "name": "get_weather", "arguments": {"city": "Paris"}}',  # a key twice
    f"Here is the call: {W}",  # text before
    f"{W}\nThis gets the weather in Paris.",  # text after
    f"{W}{W}", f"{W} {W}",  # two objects, not a list and not one per line
    f'{W}\n{{"name": "nope", "arguments": {{}}}}',  # one per line, but one is not a call
    f'{W}\n{{"city": "Paris"}}', f"{W}\n[{W}]", f"[{W}]\n{W}", f"{W}\n{W[:-1]}", f"{W}\nDone.",
    f'{W}\n{{"name": "get_weather", "arguments": {{"city": 42}}}}',  # a line that breaks its schema
    f"```json\n{W}\n```\n```json\n{W}\n```",  # two fences
    f"```json\n{W}\n```\nDone.", f"Sure:\n```json\n{W}\n```",
    f"```json\n{W}",  # a fence never closed (cut off)
    f"```python\n{W}\n```", f"```json5\n{W}\n```", f"```json\n// the call\n{W}\n```", "```\n```",
    f'[{W}, {{"name": "nope", "arguments": {{}}}}]',  # a list mixing a call and a non-call
    f'[{W}, {{"city": "Paris"}}]', f"[{W}, 1]", f"[[{W}]]",
    f'{{"results": [{W}]}}',
    W[:-1],  # cut off before the end
    W[:-1] + ",}",  # not JSON
    W.replace('"', "'"),  # a Python dict, not JSON
    "{ this is not json at all",
    "[link](https://example.com) and `code`",
    "```python\nprint({'name': 'get_weather'})\n```",
]


@pytest.mark.parametrize("text", NEGATIVES)
@pytest.mark.parametrize("step", [1, 10**6], ids=["by-char", "whole"])
def test_json_that_is_not_a_call_stays_text_byte_for_byte(text: str, step: int) -> None:
    parts = feed("hermes", text, step)
    assert not any(isinstance(p, CallPart) for p in parts)
    assert "".join(p for p in parts if isinstance(p, str)) == text
    assert joined(parts) == joined(feed("hermes", text, step, lenient=False))


@pytest.mark.parametrize(("text", "expected"), POSITIVES[::7])
def test_calls_stay_text_without_tools_with_tool_choice_none_or_the_switch_off(
        text: str, expected: list[tuple[str, dict[str, Any]]]) -> None:
    msgs = [Message("user", "hi")]
    reqs = [ChatRequest("m", msgs), ChatRequest("m", msgs, tools=TOOLS, tool_choice="none"),
            ChatRequest("m", msgs, tools=TOOLS, lenient_tool_calls=False)]
    for req in reqs:
        p = plan_output(req, "hermes").tool_parser(req.tools)
        if p is not None:
            parts = p.feed(text) + p.finish()
            assert not any(isinstance(x, CallPart) for x in parts)
    on = plan_output(ChatRequest("m", msgs, tools=TOOLS), "hermes").tool_parser(TOOLS)
    assert on is not None
    assert calls_of(on.feed(text) + on.finish()) == expected


def test_forced_calls_are_not_lenient() -> None:
    req = ChatRequest("m", [Message("user", "hi")], tools=TOOLS, tool_choice="required")
    assert not plan_output(req, "hermes").lenient


# ---- holding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "released_by"), [
    ('{"city": "Paris"}', '{"c'),  # the first key that is not a call's, at its first character
    ('{"names": "x"}', '{"names'),  # a key that outgrows every call key
    ("[1, 2]", "[1"),  # a list element that is not an object
    ('{"name": "README.md", "arguments": {}}', '{"name": "R'),  # a name no tool's starts with
    ('```json\n{\n  "name": "get_weathers"', '```json\n{\n  "name": "get_weathers'),  # one it outgrows
    (f"{W}\nThe weather", f"{W}\nT"),  # a line after a call that is not another call
    ('[{"name": "get_weather", "arguments": {}}, {"name": 7}]',
     '[{"name": "get_weather", "arguments": {}}, {"name": 7'),  # a name that is not a string
    ("```python\nx = 1\n```", "```p"),  # a fence that is not ```json
    ("Hello", "H"),
    (f"{W} and more", f"{W} a"),  # a character after the JSON
])
def test_a_held_answer_is_released_as_soon_as_it_cannot_be_a_call(text: str, released_by: str) -> None:
    p = make_parser("hermes", TOOLS, True)
    out = ""
    for i, ch in enumerate(text):
        out += "".join(x for x in p.feed(ch) if isinstance(x, str))
        if i + 1 < len(released_by):
            assert out == "", (i, out)
    assert out and text.startswith(out) and len(out) >= len(released_by) - 1
    assert out + "".join(x for x in p.finish() if isinstance(x, str)) == text


def test_an_escaped_name_is_held_until_its_string_closes() -> None:
    # "\u0067et_weather" is get_weather: an escape cannot be judged by its prefix
    text = '{"name": "\\u0067et_weather", "arguments": {"city": "Paris"}}'
    assert calls_of(feed("hermes", text, 1)) == [("get_weather", {"city": "Paris"})]
    text = '{"name": "\\u0067ET", "arguments": {}}'
    p = make_parser("hermes", TOOLS, True)
    assert p.feed(text[:text.index("ET")]) == []
    assert "".join(x for x in p.feed(text[text.index("ET"):]) + p.finish() if isinstance(x, str)) == text


# ---- parallel calls one per line (the 0.5B coder model writes them so) -------------------------

LINES = [
    (f"{_obj(*CALLS[0])}\n{_obj(*CALLS[1])}", [CALLS[0], CALLS[1]]),
    (f"\n{_obj(*CALLS[2])}\n\n{_obj(*CALLS[3], 'parameters')}\n{_obj(*CALLS[6])}\n", [CALLS[2], CALLS[3], CALLS[6]]),
    (f"```json\n{_obj(*CALLS[4])}\n{_obj(*CALLS[5])}\n```", [CALLS[4], CALLS[5]]),
    (f"{_obj(*CALLS[7], indent=2)}\n{_obj(*CALLS[8], indent=2)}", [CALLS[7], CALLS[8]]),
    (f"{_obj(*CALLS[9])} \r\n  {_obj(*CALLS[9])}", [CALLS[9], CALLS[9]]),
]


@pytest.mark.parametrize(("text", "expected"), LINES)
@pytest.mark.parametrize("step", [1, 10**6], ids=["by-char", "whole"])
def test_calls_one_per_line_are_parallel_calls(text: str, expected: list[tuple[str, dict[str, Any]]],
                                               step: int) -> None:
    parts = feed("hermes", text, step)
    assert calls_of(parts) == expected
    assert [p.call_index for p in parts if isinstance(p, CallPart) and p.name] == list(range(len(expected)))


def test_a_call_ends_the_run_with_finish_reason_tool_calls() -> None:
    out = OutputParser(0, None, make_parser("hermes", TOOLS, True))
    events = [e for ch in W for e in out.feed(ch)] + out.finish("stop")
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", ""), (None, '{"city": "Paris"}')]
    assert calls[0].id and isinstance(events[-1], Finish) and events[-1].reason == "tool_calls"


# ---- other families ------------------------------------------------------------------------


@pytest.mark.parametrize(("parser", "text", "expected"), [
    # Mistral models often drop [TOOL_CALLS] before their list
    ("mistral", f"[{W}]", [[0, "get_weather", '{"city": "Paris"}']]),
    ("mistral", f'[TOOL_CALLS][{W}]', [[0, "get_weather", '{"city": "Paris"}']]),
    ("mistral", "[TOOL_CALLS] nonsense", ["[TOOL_CALLS]nonsense"]),
    # llama3's own format is the bare object (read by its parser, streaming, as before); fences are new
    ("llama3", f"```json\n{W}\n```", [[0, "get_weather", '{"city": "Paris"}']]),
    ("llama3", W, [[0, "get_weather", '{"city": "Paris"}']]),
    ("llama3", '{"name": "unknown", "parameters": {}}', [[0, "unknown", "{}"]]),
    ("pythonic", f"```json\n{W}\n```", [[0, "get_weather", '{"city": "Paris"}']]),
    ("pythonic", '```tool_code\nget_weather(city="Rome")\n```', [[0, "get_weather", '{"city": "Rome"}']]),
    ("pythonic", "```python\nprint(1)\n```", ["```python\nprint(1)\n```"]),
    ("hermes", f"<tool_call>{W}</tool_call>", [[0, "get_weather", '{"city": "Paris"}']]),
])
@pytest.mark.parametrize("step", [1, 10**6], ids=["by-char", "whole"])
def test_every_family(parser: str, text: str, expected: list[object], step: int) -> None:
    assert joined(feed(parser, text, step)) == expected


def test_llama3_bare_calls_still_stream() -> None:
    p = make_parser("llama3", TOOLS, True)
    assert p.feed('{"name": "get_weather", "parameters": {"ci') == [CallPart(0, "get_weather"),
                                                                    CallPart(0, None, '{"ci')]


def test_every_parser_can_be_wrapped() -> None:
    for name in PARSERS:
        assert make_parser(name, TOOLS, True).name == name
