"""Pythonic calls in a fenced block, the fallback for models that write code:

    ```tool_code
    get_weather(location="Paris", unit="c")
    ```

Arguments must be Python literals. A single positional argument maps to the tool's only
parameter. Calls to unknown tools, or code that is not just calls, stay text. Arguments arrive
whole, when the block closes (they cannot be checked before)."""

from __future__ import annotations

import ast
import json
from typing import Any

from hearth.chat.tool_parsers._text import TextOut
from hearth.chat.tool_parsers.base import CallPart, Part, ToolParser, split_at_marker
from hearth.chat.types import Tool

OPEN, CLOSE = "```tool_code", "```"


class PythonicParser(ToolParser):
    name = "pythonic"

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        self._in_block = False
        self._out = TextOut()

    def _run(self, out: list[Part]) -> None:
        while True:
            if not self._in_block:
                safe, found, self._buf = split_at_marker(self._buf, OPEN)
                self._out.text(out, safe)
                if not found:
                    return
                self._in_block = True
            i = self._buf.find(CLOSE)
            if i < 0:
                return
            self._block(out, self._buf[:i])
            self._in_block, self._buf = False, self._buf[i + len(CLOSE):]

    def _block(self, out: list[Part], code: str) -> None:
        calls = parse_calls(code, self.tools)
        if calls is None:
            self._out.text(out, OPEN + code + CLOSE)
            return
        for name, args in calls:
            out.append(CallPart(self.n_calls, name))
            out.append(CallPart(self.n_calls, None, json.dumps(args, ensure_ascii=False)))
            self.n_calls += 1
        self._out.call()

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self._in_block:  # unclosed block: calls if it parses, text otherwise
            calls = parse_calls(self._buf, self.tools)
            if calls is None:
                self._out.text(out, OPEN + self._buf)
            else:
                self._block(out, self._buf)
        else:  # a held-back "```" is far more often a closing fence than a cut-off tool_code
            self._out.text(out, self._buf)
        self._buf = ""
        self._out.finish(out, self.n_calls)
        return out


def parse_calls(code: str, tools: dict[str, Tool]) -> list[tuple[str, dict[str, Any]]] | None:
    """`name(arg=literal, ...)` statements (or one list of them) → [(name, arguments)]."""
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError):
        return None
    nodes: list[ast.expr] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        nodes.extend(stmt.value.elts if isinstance(stmt.value, ast.List) else [stmt.value])
    calls = []
    for node in nodes:
        call = _call(node, tools)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _call(node: ast.expr, tools: dict[str, Tool]) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    tool = tools.get(node.func.id)
    if tool is None:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        if len(args) != len(node.keywords):
            return None  # **kwargs
        if node.args:
            params = list((tool.parameters.get("properties") or {}).keys())
            if len(node.args) != 1 or len(params) != 1 or params[0] in args:
                return None
            args[params[0]] = ast.literal_eval(node.args[0])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return tool.name, args
