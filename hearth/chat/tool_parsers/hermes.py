"""Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of
times, with free text around. Also the generic format Hearth teaches tool-less templates."""

from __future__ import annotations

from hearth.chat.tool_parsers._text import TextOut
from hearth.chat.tool_parsers.base import BadCall, JsonCall, JsonCallParser, Part, split_at_marker
from hearth.chat.types import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CUT_OFF = "the output ended before the call was complete"
NOT_A_CALL = 'it is not a JSON object with "name" and "arguments"'


class HermesParser(JsonCallParser):
    name = "hermes"

    def __init__(self, tools: list[Tool]) -> None:
        super().__init__(tools)
        self._state = "text"  # text | call | raw | closing
        self._out = TextOut()

    def _run(self, out: list[Part]) -> None:
        while True:
            if self._state == "text":
                safe, found, self._buf = split_at_marker(self._buf, OPEN)
                self._out.text(out, safe)
                if not found:
                    return
                self._state, self._call = "call", JsonCall(self.n_calls)
            elif self._state == "call":
                call = self._feed_call(out)
                if call.failed:
                    self._state, self._buf = "raw", call.text + call.rest
                elif call.done:
                    self._called()
                    self._state, self._buf = "closing", call.rest
                else:
                    return
            elif self._state == "raw":  # <tool_call> that holds no call: a malformed call, not text
                i = self._buf.find(CLOSE)
                if i < 0:
                    return
                self._bad(out, None, OPEN + self._buf[:i + len(CLOSE)], NOT_A_CALL)
                self._state, self._buf = "text", self._buf[i + len(CLOSE):]
            else:  # closing
                s = self._buf.lstrip()
                if s.startswith(CLOSE):
                    self._state, self._buf = "text", s[len(CLOSE):]
                elif CLOSE.startswith(s):
                    return
                else:  # no closing tag: what follows is text
                    self._state = "text"

    def _called(self) -> None:
        self.n_calls += 1
        self._out.call()

    def _bad(self, out: list[Part], name: str | None, text: str, problem: str) -> None:
        out.append(BadCall(self.n_calls, name, text, problem))
        self._called()

    def finish(self) -> list[Part]:
        out: list[Part] = []
        if self._state == "call":
            call = self._end_call(out)
            # Cut off inside the call (max_tokens, a stop string): an announced call keeps the
            # parts already sent (they cannot be taken back) and is reported all the same.
            self._bad(out, call.name if call.announced else None, OPEN + call.text, CUT_OFF)
        elif self._state == "raw":
            self._bad(out, None, OPEN + self._buf, NOT_A_CALL)
        # In the text state the buffer holds at most an unfinished <tool_call>: dropped.
        self._buf = ""
        self._out.finish(out, self.n_calls)
        return out
