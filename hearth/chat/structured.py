"""Constrained output as GBNF grammars: JSON schemas (response_format) and forced tool calls.

Schemas go through llama.cpp's own converter (vendored in llama-cpp-python, extended in
schema_converter.py with numeric bounds and one rule per ref), one converter per grammar so rule
names never collide. A forced call's grammar writes exactly the wrapper its tool parser reads,
with the tool name fixed and the arguments following the tool's schema; parameters that use
`$ref` are filed under the wrapper's `$defs` with their refs rewritten to match (schema_refs.py),
so nested and recursive pydantic models work as they do in response_format.

Converting a schema costs milliseconds of Python (~5 ms for a small one), and agents send the
same tools and response_format every turn, so the converted text is cached by the schema's JSON
text (property order included: it decides the grammar's). The text does not depend on the model;
the runner then caches the grammar compiled against its own vocabulary (engine/grammar_cache.py).
Refusals (a 400) are not cached: they are raised again each time.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from hearth.chat.numeric_bounds import check_numbers
from hearth.chat.schema_bounds import check_grammar, check_schema
from hearth.chat.schema_converter import converter_class
from hearth.chat.schema_refs import has_refs, reroot
from hearth.chat.types import ResponseFormat, Tool
from hearth.errors import BadRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}

# The formats a grammar can write, by parser: (wrapper rule, arguments key). Other parsers' calls
# are forced in the plain JSON format ("json").
_WRAPPERS: dict[str, tuple[str, str]] = {
    "hermes": ('"<tool_call>\\n" call "\\n</tool_call>"', "arguments"),
    "llama3": ("call", "parameters"),
    "json": ("call", "arguments"),
}
_SEPARATORS = {"hermes": '"\\n"', "llama3": '";" " "?', "json": '"\\n"'}


class _ConvertedCache:
    """Grammar texts by the JSON text of what they were converted from: least recently used
    dropped first past `capacity` entries or `max_bytes` of text."""

    def __init__(self, capacity: int = 128, max_bytes: int = 16 << 20) -> None:
        self.capacity, self.max_bytes = capacity, max_bytes
        self._items: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            text = self._items.get(key)
            if text is not None:
                self._items.move_to_end(key)
            return text

    def put(self, key: str, text: str) -> None:
        with self._lock:
            if key in self._items:
                return
            self._items[key] = text
            self._bytes += len(key) + len(text)
            while len(self._items) > 1 and (len(self._items) > self.capacity or self._bytes > self.max_bytes):
                k, v = self._items.popitem(last=False)
                self._bytes -= len(k) + len(v)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


converted = _ConvertedCache()


def _key(*parts: Any) -> str | None:
    try:
        return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON (a caller's own object): convert it every time
        return None


def forced_format(parser: str) -> str:
    """The parser that reads calls forced by a grammar, for a model whose format is `parser`."""
    return parser if parser in _WRAPPERS else "json"


def _convert(schema: dict[str, Any], root: str, prop_order: list[str] | None = None,
             param: str = "response_format") -> str:
    check_schema(schema, param)  # before the converter, whose cost the schema's counts decide
    try:
        converter = converter_class()
    except ImportError as e:  # pragma: no cover - llama-cpp-python is always installed with Hearth
        raise BadRequest("structured output needs llama-cpp-python's grammar converter") from e
    conv = converter(prop_order={k: i for i, k in enumerate(prop_order or [])}, allow_fetch=False,
                     dotall=False, raw_pattern=False)
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "input")
        conv.visit(resolved, root)
        grammar = str(conv.format_grammar())
    except BadRequest:
        raise
    except Exception as e:  # the converter raises bare exceptions on schemas it cannot handle
        raise BadRequest(f"this JSON schema cannot be turned into a grammar: {e}", param=param) from e
    check_grammar(grammar, param)
    return grammar


def schema_grammar(schema: dict[str, Any]) -> str:
    """GBNF whose `root` is JSON that validates against `schema`."""
    if not isinstance(schema, dict):
        raise BadRequest("a JSON schema must be an object", param="response_format")
    key = _key("schema", schema)
    text = converted.get(key) if key is not None else None
    if text is None:
        check_numbers(schema, "response_format")
        text = _convert(schema, "")  # the converter names the top rule "root" when given ""
        if key is not None:
            converted.put(key, text)
    return text


def response_format_grammar(rf: ResponseFormat | None) -> str | None:
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return schema_grammar(rf.schema or ANY_OBJECT)
    if rf.type == "json_schema":
        if rf.schema is None:
            raise BadRequest("response_format json_schema needs a schema", param="response_format")
        return schema_grammar(rf.schema)
    raise BadRequest(f"unknown response_format type {rf.type!r}", param="response_format")


def _parameters(tool: Tool) -> dict[str, Any]:
    p = tool.parameters or ANY_OBJECT
    return p if "type" in p or "properties" not in p else {**p, "type": "object"}


def tool_call_grammar(tools: list[Tool], parser: str, parallel: bool) -> str:
    """GBNF for one call to any of `tools` (with `parallel`, up to one per tool), written in
    the format `parser` reads (see `forced_format`). The bound matters: a small model under a
    grammar that allows endless calls keeps writing them until max_tokens."""
    key = _key("tools", parser, parallel, [[t.name, t.parameters] for t in tools])
    text = converted.get(key) if key is not None else None
    if text is None:
        text = _tool_call_grammar(tools, parser, parallel)
        if key is not None:
            converted.put(key, text)
    return text


def _tool_call_grammar(tools: list[Tool], parser: str, parallel: bool) -> str:
    wrapper, args_key = _WRAPPERS[parser]
    defs: dict[str, Any] = {}
    calls = []
    for i, t in enumerate(tools):
        params = _parameters(t)
        check_numbers(params, "tools", f"the parameters of {t.name!r} at ")
        if has_refs(params):  # file them at the wrapper's root, where their refs now point
            key = re.sub(r"[^A-Za-z0-9_-]", "-", t.name) + "-arguments"  # a JSON pointer segment
            key = key if key not in defs else f"{key}-{i}"
            defs[key] = reroot(params, key)
            params = {"$ref": f"#/$defs/{key}"}
        calls.append({"type": "object", "properties": {"name": {"const": t.name}, args_key: params},
                      "required": ["name", args_key]})
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if defs:
        schema = {**schema, "$defs": defs}
    rules = _convert(schema, "call", prop_order=["name", args_key], param="tools")
    if parallel and len(tools) > 1:
        root = f"root ::= block ({_SEPARATORS[parser]} block){{0,{len(tools) - 1}}}\nblock ::= {wrapper}"
    else:
        root = f"root ::= {wrapper}"
    return f"{rules}\n{root}\n"
