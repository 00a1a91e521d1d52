"""Tool-call parsers, one module per output format, and how one is chosen for a model."""

from __future__ import annotations

from hearth.chat.tool_parsers.base import BadCall, CallPart, Part, ToolParser
from hearth.chat.tool_parsers.hermes import HermesParser
from hearth.chat.tool_parsers.lenient import LenientCalls
from hearth.chat.tool_parsers.llama3 import JsonParser, Llama3Parser
from hearth.chat.tool_parsers.mistral import MistralParser
from hearth.chat.tool_parsers.pythonic import PythonicParser
from hearth.chat.types import Tool

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3Parser, MistralParser, PythonicParser, JsonParser)
}


def parser_for_template(source: str) -> str:
    """The format a chat template teaches its model. Templates that say nothing about tools
    get Hearth's generic prompt, which teaches the Hermes format."""
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or ("<|start_header_id|>" in source and "parameters" in source):
        return "llama3"
    if "tool_code" in source:
        return "pythonic"
    return "hermes"


def make_parser(name: str, tools: list[Tool], lenient: bool = False) -> ToolParser:
    """The parser `name` for one candidate; `lenient`: also calls written without its markers."""
    parser = PARSERS[name](tools)
    return LenientCalls(parser, tools) if lenient else parser


__all__ = ["PARSERS", "BadCall", "CallPart", "LenientCalls", "Part", "ToolParser", "make_parser",
           "parser_for_template"]
