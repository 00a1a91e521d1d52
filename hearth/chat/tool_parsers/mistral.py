"""Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}` objects;
also the v11+ form `[TOOL_CALLS]name[ARGS]{...}`. Free text may come before the marker."""

from __future__ import annotations

import re

from hearth.chat.tool_parsers._text import TextOut
from hearth.chat.tool_parsers.base import JsonCall, JsonCallParser, Part, split_at_marker
from hearth.chat.types import Tool

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


class MistralParser(JsonCallParser):
    name = "mistral"

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        self._state = "text"  # text | open | next | call | between | name
        self._in_array = False
        self._raw = ""  # what followed the marker, for when it turns out not to be calls
        self._out = TextOut()

    def _as_text(self, out: list[Part]) -> None:
        self._out.text(out, MARKER + self._raw + self._buf)
        self._state, self._buf, self._raw = "text", "", ""

    def _run(self, out: list[Part]) -> None:
        while True:
            st = self._state
            if st == "text":
                safe, found, self._buf = split_at_marker(self._buf, MARKER)
                self._out.text(out, safe)
                if not found:
                    return
                self._state, self._raw = "open", ""
            elif st in ("open", "next", "between"):
                s = self._buf.lstrip()
                if not s:
                    return
                if st == "open" and s[0] == "[":
                    self._in_array, self._state, self._raw, self._buf = True, "next", s[:1], s[1:]
                elif st in ("open", "next") and s[0] == "{":
                    self._in_array = self._in_array and st == "next"
                    self._state, self._call, self._buf = "call", JsonCall(self.n_calls), s
                elif st == "open" and (s[0].isalnum() or s[0] == "_"):
                    self._state, self._buf = "name", s
                elif st == "between" and s[0] == ",":
                    self._state, self._buf = "next", s[1:]
                elif st == "between" and s[0] == "]":
                    self._state, self._buf = "text", s[1:]
                elif st == "between":  # no closing bracket: what follows is text
                    self._state, self._buf = "text", s
                else:
                    self._as_text(out)
            elif st == "name":
                i = self._buf.find(ARGS)
                if i < 0:  # still possible: a name, then perhaps the start of [ARGS]
                    name, bracket, tail = self._buf.partition("[")
                    if not _NAME.fullmatch(name.strip()) or (bracket and not ARGS.startswith(bracket + tail)):
                        self._as_text(out)
                    return
                name = self._buf[:i].strip()
                if not _NAME.fullmatch(name):
                    self._as_text(out)
                    continue
                self._raw = self._buf[:i + len(ARGS)]
                self._state, self._call = "call", JsonCall(self.n_calls, name=name)
                self._buf = self._buf[i + len(ARGS):]
            else:  # call
                call = self._feed_call(out)
                if call.failed:
                    self._buf = call.text + call.rest
                    self._as_text(out)
                elif call.done:
                    self.n_calls += 1
                    self._out.call()
                    self._state, self._buf = ("between" if self._in_array else "text"), call.rest
                else:
                    return

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self._state == "call":
            call = self._end_call(out)
            if call.failed:
                self._buf = call.text
                self._as_text(out)
            elif call.announced:
                self.n_calls += 1
        elif self._state in ("open", "name") or (self._state == "next" and not self.n_calls):
            self._as_text(out)
        # In the text state the buffer holds at most an unfinished marker: dropped.
        self._buf = ""
        self._out.finish(out, self.n_calls)
        return out
