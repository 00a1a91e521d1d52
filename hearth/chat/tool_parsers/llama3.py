"""Llama 3 JSON calls: the whole answer is `{"name": ..., "parameters": {...}}` (or
"arguments"), optionally after `<|python_tag|>`, several separated by `;` or newlines.
An answer that does not start with `{` is plain text. Also the plain-JSON format that forced
calls use for parsers whose own markers a grammar cannot write ("json")."""

from __future__ import annotations

from hearth.chat.tool_parsers.base import JsonCall, JsonCallParser, Part
from hearth.chat.types import Tool

PYTHON_TAG = "<|python_tag|>"


class Llama3Parser(JsonCallParser):
    name = "llama3"
    bare_json_native = True

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        self._state = "start"  # start | call | between | text

    def _run(self, out: list[Part]) -> None:
        while True:
            if self._state in ("start", "between"):
                s = self._buf.lstrip(" \t\r\n;" if self._state == "between" else " \t\r\n")
                if s.startswith(PYTHON_TAG):
                    self._buf = s = s[len(PYTHON_TAG):]
                    continue
                if not s or (PYTHON_TAG.startswith(s)):
                    return
                if s[0] == "{":
                    self._state, self._call, self._buf = "call", JsonCall(self.n_calls), s
                else:
                    self._state = "text"
                    if self.n_calls:
                        self._buf = s
            elif self._state == "call":
                call = self._feed_call(out)
                if call.failed:  # JSON that is not a call: an ordinary answer
                    self._state, self._buf = "text", call.text + call.rest
                elif call.done:
                    self.n_calls += 1
                    self._state, self._buf = "between", call.rest
                else:
                    return
            else:
                if self._buf:
                    out.append(self._buf)
                self._buf = ""
                return

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self._state == "call":
            call = self._end_call(out)
            if call.failed:
                out.append(call.text)
            elif call.announced:
                self.n_calls += 1
        elif self._state == "start" and self._buf:
            out.append(self._buf)
        self._buf = ""
        return out


class JsonParser(Llama3Parser):
    name = "json"
