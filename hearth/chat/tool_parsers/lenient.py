"""Tool calls as models write them: a call without its template's markers, taken when it is
unambiguous, around any family's parser.

Models trained on one format often answer with the call alone, as JSON, and no markers:
Qwen2.5(-Coder) writes `{"name": "get_weather", "arguments": {"city": "Paris"}}` bare or in a
```json fence instead of inside `<tool_call>` tags; Mistral models drop `[TOOL_CALLS]` before
their list; llama.cpp's parsers for these families accept the same. `LenientCalls` wraps the
family's parser and takes such an answer as calls when, and only when:

- the whole answer (whitespace aside, optionally inside one ``` or ```json fence) is one JSON
  object, a JSON list of them for parallel calls, or several objects one per line (each after a
  newline: small models write parallel calls so);
- each object has exactly two keys, `name` (a declared tool) and `arguments` or `parameters`,
  an object that validates against that tool's JSON schema (`jsonschema`; a schema it cannot
  use rules the call out). A key written twice rules it out too.

Anything else is the family parser's to read, fed exactly the text it would have been fed: an
answer is held only while it may still be such a call (it opens with `{`, `[` or a fence) and is
released to the inner parser, unchanged, the moment it cannot be: a call key or a `name` that
can no longer become one of the three keys or a declared tool's name (checked character by
character as it arrives, not when its string closes: `{"name": "R` is text at the `R` when no
tool's name starts so), a list element that is not an object, a fence that is not ```/```json,
a character after the JSON or its closing fence other than a newline and the next object. So
streamed and non-streamed output stay equal, and a JSON answer the user asked for comes out
byte for byte. A call is decided only when the output ends (text could still follow the JSON),
so recognised calls arrive whole, at the end.

For parsers whose own format is a bare object (llama3, json), an answer opening with `{` is
theirs at once, as before; only lists and fences are held.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema.validators import validator_for

from hearth.chat.tool_parsers.base import CallPart, Part, ToolParser
from hearth.chat.types import Tool

FENCE = "```"
FENCE_INFO = ("", "json")  # the info strings a fence around a call may carry (any case)
CALL_KEYS = ("name", "arguments", "parameters")
WS = " \t\r\n"


class LenientCalls(ToolParser):
    """`inner`, but an answer that is nothing but a call (or a list of calls) in JSON is calls."""

    def __init__(self, inner: ToolParser, tools: list[Tool]) -> None:
        super().__init__(tools)
        self.name = inner.name
        self.inner = inner
        self._state = "start"  # start | fence | held | tail | through
        self._held = ""  # everything received while undecided, verbatim
        self._fenced = False
        self._body = 0  # where the JSON value being read starts in _held
        self._pos = 0  # how far into _held the value's scanner (or the tail after it) has read
        self._values: list[tuple[int, int]] = []  # the JSON values read whole: [start, end) in _held
        self._names = frozenset(self.tools)
        self._scan = _Scanner(self._names)

    def _run(self, out: list[Part]) -> None:
        text, self._buf = self._buf, ""
        if self._state == "through":
            out.extend(self.inner.feed(text))
            return
        self._held += text
        if not self._advance():
            self._state = "through"
            out.extend(self.inner.feed(self._held))
            self._held = ""

    def _advance(self) -> bool:
        """Read what was just appended to `_held`; False once the answer cannot be calls."""
        if self._state == "start":
            s = self._held.lstrip(WS)
            if not s:
                return True
            if (s[0] == "{" and not self.inner.bare_json_native) or s[0] == "[":
                self._state, self._body = "held", len(self._held) - len(s)
                self._pos = self._body
            elif s[0] == "`":
                self._state, self._fenced = "fence", True
            else:
                return False
        if self._state == "fence":
            s = self._held.lstrip(WS)
            head, newline, rest = s.partition("\n")
            if not FENCE.startswith(head[:3]) or (len(head) > 3 and not _info_prefix(head[3:])):
                return False
            if not newline:
                return True
            if head[:3] != FENCE or head[3:].strip().lower() not in FENCE_INFO:
                return False
            body = rest.lstrip(WS)
            if not body:
                return True
            if body[0] not in "{[":
                return False
            self._state, self._body = "held", len(self._held) - len(body)
            self._pos = self._body
        while True:
            if self._state == "held":
                end = self._scan.feed(self._held[self._pos:])
                if self._scan.failed:
                    return False
                if end is None:
                    self._pos = len(self._held)
                    return True
                self._pos += end
                self._values.append((self._body, self._pos))
                self._state = "tail"
            rest = self._held[self._pos:]
            s = rest.lstrip(WS)
            if not (s[:1] == "{" and "\n" in rest[:len(rest) - len(s)] and self._held[self._values[0][0]] == "{"):
                return self._tail_ok(s)
            # Another object on a line of its own: parallel calls one per line (never after a list).
            self._state, self._body = "held", len(self._held) - len(s)
            self._pos = self._body
            self._scan = _Scanner(self._names)

    def _tail_ok(self, tail: str) -> bool:
        """What follows the JSON (whitespace stripped): nothing, or the closing fence when there
        is an opening one."""
        if not self._fenced:
            return not tail
        return FENCE.startswith(tail) or (tail.startswith(FENCE) and not tail[3:].strip(WS))

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self._state in ("tail", "held"):
            calls = self._calls()
            if calls is not None:
                for i, (name, args) in enumerate(calls):
                    out.append(CallPart(i, name))
                    out.append(CallPart(i, None, json.dumps(args, ensure_ascii=False)))
                self.n_calls = len(calls)
                return out
        if self._held:
            out.extend(self.inner.feed(self._held))
            self._held = ""
        out.extend(self.inner.finish())
        self.n_calls = self.inner.n_calls
        return out

    def _calls(self) -> list[tuple[str, dict[str, Any]]] | None:
        """The held answer as [(name, arguments)], or None when it is not calls."""
        if self._state != "tail" or (self._fenced and FENCE not in self._held[self._pos:]):
            return None
        try:
            values = [json.loads(self._held[a:b], object_pairs_hook=_no_repeats) for a, b in self._values]
        except ValueError:
            return None
        # One value: a call or a list of calls. Several (one per line): each a call.
        items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls = [self._call(x) for x in items]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]

    def _call(self, obj: Any) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(obj, dict) or len(obj) != 2 or "name" not in obj:
            return None
        args = obj.get("arguments", obj.get("parameters"))
        tool = self.tools.get(obj["name"]) if isinstance(obj["name"], str) else None
        if tool is None or not isinstance(args, dict) or not conforms(args, tool.parameters):
            return None
        return tool.name, args


def conforms(args: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether `args` validate against a tool's parameters schema; a schema that cannot be used
    (invalid, an unresolvable $ref) says no."""
    if not schema:
        return True
    try:
        cls = validator_for(schema)
        cls.check_schema(schema)
        return bool(cls(schema).is_valid(args))
    except Exception:  # whatever a schema makes the validator raise (invalid, a $ref it cannot
        return False  # resolve, a bad pattern): the call cannot be checked, so it is not one


def _info_prefix(info: str) -> bool:
    """Whether a fence's info string, still being written, may yet be one a call may carry."""
    s = info.lower().rstrip(" \t\r")
    return any(i.startswith(s) for i in FENCE_INFO)


def _may_become(chars: list[str], options: frozenset[str] | tuple[str, ...]) -> bool:
    """Whether a JSON string still being read (`chars`: its opening quote and what followed)
    may yet be one of `options`. An escape makes it undecidable until it closes: yes."""
    raw = "".join(chars[1:])
    return "\\" in raw or any(o.startswith(raw) for o in options)


class _Repeated(ValueError):
    pass


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Repeated("a key written twice")
    return dict(pairs)


class _Scanner:
    """Follows the JSON of a would-be call as it arrives, only as far as needed to rule it out
    early or see where it ends: nesting and strings, the keys of the call objects (depth 1 for
    one call, 2 inside a list) and the list's elements. Whether it parses is json.loads's to say
    at the end."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names  # the declared tools: a call's `name` must be one of them
        self.length = 0  # characters of the JSON read so far (all of it, once it ended)
        self.failed = False
        self._stack: list[str] = []
        self._in_str = False
        self._esc = False
        self._key: list[str] | None = None  # the call key being read
        self._expect = ""  # "key" or "element" when that is what must come next
        self._key_pos = False  # the next string at call depth is a key
        self._after_name = False  # the call key just read is "name": its value comes next
        self._name: list[str] | None = None  # the value of a call's "name" being read
        self._name_next = False  # the next token is the value of a call's "name"

    def _call_depth(self) -> int:
        return 2 if self._stack and self._stack[0] == "[" else 1

    def feed(self, text: str) -> int | None:
        """Read `text`; the index in it just past the JSON's end, or None while it goes on."""
        for i, c in enumerate(text):
            self.length += 1
            if self._in_str:
                if self._key is not None:
                    self._key.append(c)
                if self._name is not None:
                    self._name.append(c)
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
                    if self._key is not None and not self._key_ok():
                        return self._fail()
                    if self._name is not None and not self._name_ok():
                        return self._fail()
                elif ((self._key is not None and not _may_become(self._key, CALL_KEYS))
                      or (self._name is not None and not _may_become(self._name, self.names))):
                    # A key or name that can no longer become a call's rules the call out at
                    # this character, not when its string closes (the held time of text answers).
                    return self._fail()
                continue
            if c in WS:
                continue
            if self._name_next:
                # A call's name is a declared tool's, as a string: anything else rules it out
                # now, not when the whole object has arrived.
                self._name_next = False
                if c != '"':
                    return self._fail()
                self._name = ['"']
            if self._expect == "element" and c != "{":
                return self._fail()
            if self._expect == "key" and c not in '"}':
                return self._fail()
            depth = len(self._stack)
            self._expect = ""
            if c == '"':
                self._in_str = True
                self._key = ['"'] if self._at_key(depth) else None
            elif c in "{[":
                if depth == 0 and c == "[":
                    self._expect = "element"
                elif c == "{" and depth + 1 == self._call_depth():
                    self._expect = "key"
                    self._key_pos = True
                self._stack.append(c)
            elif c in "}]":
                if not self._stack or self._stack.pop() != {"}": "{", "]": "["}[c]:
                    return self._fail()
                if not self._stack:
                    return i + 1
            elif c == ",":
                if depth == 1 and self._stack[0] == "[":
                    self._expect = "element"
                elif depth == self._call_depth() and self._stack[-1] == "{":
                    self._expect = "key"
                    self._key_pos = True
            elif c == ":":
                self._key_pos = False
                self._name_next, self._after_name = self._after_name, False
            if c != ":":
                self._after_name = False
        return None

    def _at_key(self, depth: int) -> bool:
        return self._key_pos and depth == self._call_depth() and self._stack[-1] == "{"

    def _key_ok(self) -> bool:
        assert self._key is not None
        raw, self._key = "".join(self._key), None
        self._key_pos = False
        try:
            key = json.loads(raw)
        except ValueError:
            return False
        self._after_name = key == "name"
        return key in CALL_KEYS

    def _name_ok(self) -> bool:
        assert self._name is not None
        raw, self._name = "".join(self._name), None
        try:
            return json.loads(raw) in self.names
        except ValueError:
            return False

    def _fail(self) -> int | None:
        self.failed = True
        return None
