"""Tools in the conversation: checking tool_choice, teaching tools to templates that know
none, and deciding how a request's output is parsed and constrained.

A template "knows tools" when rendering it with a tool puts that tool in the prompt. For the
others (the default SmolLM2 template only reads message['content']) Hearth describes the tools
in the system prompt and asks for Hermes-style `<tool_call>` JSON, and renders past calls and
results as text, so tool use works with any model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hearth.chat.structured import forced_format, response_format_grammar, tool_call_grammar
from hearth.chat.template import ChatTemplate
from hearth.chat.tool_parsers import PARSERS, ToolParser, make_parser, parser_for_template
from hearth.chat.types import ChatRequest, Message, Tool, ToolCall
from hearth.errors import BadRequest, HearthError

TOOLS_PROMPT = """You can call functions. They are described here as JSON:
{tools}

To call a function, answer with exactly this and nothing else:
<tool_call>{{"name": "<function name>", "arguments": {{<the arguments, as JSON>}}}}</tool_call>
Function results come back in <tool_response> tags."""


def check_tool_choice(req: ChatRequest) -> None:
    choice = req.tool_choice
    if choice in (None, "auto", "none"):
        return
    if not req.tools:
        raise BadRequest(f"tool_choice {choice!r} needs tools", param="tool_choice")
    if choice != "required" and choice not in {t.name for t in req.tools}:
        raise BadRequest(f"tool_choice names the function {choice!r}, which is not in tools",
                         param="tool_choice")


def knows_tools(template: ChatTemplate) -> bool:
    probe = "hearth_probe_function"
    try:
        return probe in template.render([Message("user", "x")], tools=[Tool(probe)])
    except HearthError:
        return False


def resolve_parser(setting: str, template: ChatTemplate) -> str:
    """The tool parser for a model: the `--tool-parser` setting, or the template's format."""
    if setting and setting != "auto":
        if setting not in PARSERS:
            raise ValueError(f"unknown tool parser {setting!r}; known: auto, {', '.join(PARSERS)}")
        return setting
    return parser_for_template(template.source) if knows_tools(template) else "hermes"


def tools_prompt(tools: list[Tool]) -> str:
    described = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                                     ensure_ascii=False) for t in tools)
    return TOOLS_PROMPT.format(tools=described)


def call_text(c: ToolCall) -> str:
    try:
        args = json.loads(c.arguments) if c.arguments else {}
    except ValueError:
        args = c.arguments
    return "<tool_call>" + json.dumps({"name": c.name, "arguments": args}, ensure_ascii=False) + "</tool_call>"


def as_text_messages(messages: list[Message], tools: list[Tool]) -> list[Message]:
    """For templates that know no tools: the tool prompt in the system message, assistant
    calls as `<tool_call>` text, tool results as user turns in `<tool_response>` tags
    (consecutive results in one turn)."""
    out: list[Message] = []
    names = {}
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            names.update({c.id: c.name for c in m.tool_calls})
            body = "\n".join(call_text(c) for c in m.tool_calls)
            out.append(Message("assistant", f"{m.content}\n{body}" if m.content else body, m.name,
                               reasoning=m.reasoning))
        elif m.role == "tool":
            result = json.dumps({"name": names.get(m.tool_call_id or "", m.name or ""), "content": m.content or ""},
                                ensure_ascii=False)
            text = f"<tool_response>\n{result}\n</tool_response>"
            if out and out[-1].role == "user" and (out[-1].content or "").startswith("<tool_response>"):
                out[-1] = Message("user", f"{out[-1].content}\n{text}")
            else:
                out.append(Message("user", text))
        else:
            out.append(m)
    if tools:
        prompt = tools_prompt(tools)
        if out and out[0].role in ("system", "developer"):
            out[0] = Message(out[0].role, f"{out[0].content}\n\n{prompt}" if out[0].content else prompt)
        else:
            out.insert(0, Message("system", prompt))
    return out


@dataclass(slots=True)
class OutputPlan:
    """How a request's output is parsed and constrained."""

    parser: str | None  # tool parser name; None: no tool calls expected
    grammar: str | None  # GBNF for the sampler
    tools_in_prompt: list[Tool]
    lenient: bool = False  # also calls written without the format's markers (tool_parsers/lenient.py)

    def tool_parser(self, tools: list[Tool]) -> ToolParser | None:
        """A fresh parser for one candidate's output, or None when no calls are expected."""
        return make_parser(self.parser, tools, self.lenient) if self.parser else None


def plan_output(req: ChatRequest, parser: str) -> OutputPlan:
    """tool_choice none: no tools at all; auto: the model's own format, free; required or a
    named function: a grammar that writes exactly one call (or more, with parallel calls).
    Otherwise response_format, if any, becomes the grammar. In auto mode, unless the request
    turned it off, a call written without the format's markers is recognised too."""
    check_tool_choice(req)
    choice = req.tool_choice
    if req.tools and choice != "none":
        if choice in (None, "auto"):
            return OutputPlan(parser, response_format_grammar(req.response_format), req.tools,
                              lenient=req.lenient_tool_calls)
        forced = req.tools if choice == "required" else [t for t in req.tools if t.name == choice]
        fmt = forced_format(parser)
        return OutputPlan(fmt, tool_call_grammar(forced, fmt, req.parallel_tool_calls), req.tools)
    return OutputPlan(None, response_format_grammar(req.response_format), [])
