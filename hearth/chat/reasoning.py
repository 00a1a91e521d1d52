"""Reasoning: `<think>…</think>` in the output becomes reasoning, not content; how a
request's reasoning options reach the chat template and the engine.

Thinking is recognized only at the start of the output (after whitespace), or from the first
token when the template's generation prompt already opened it.
"""

from __future__ import annotations

from typing import Any

from hearth.chat.tool_parsers.base import split_at_marker
from hearth.chat.types import ChatRequest

START, END = "<think>", "</think>"

# Thinking markers of template families that do not use <think>; a template that spells a pair
# out (to strip old thinking, or to open it in the generation prompt) thinks in that pair.
OTHER_MARKERS = (("<|START_THINKING|>", "<|END_THINKING|>"), ("<seed:think>", "</seed:think>"),
                 ("◁think▷", "◁/think▷"))


def think_markers(template_source: str) -> tuple[str, str]:
    """The markers a model thinks in, read from its chat template; <think> by default."""
    for start, end in OTHER_MARKERS:
        if start in template_source and end in template_source:
            return start, end
    return START, END


def opens_thinking(prompt: str, start: str = START) -> bool:
    """Whether the rendered prompt ends inside an open thinking block."""
    return prompt.rstrip().endswith(start)


def template_kwargs(req: ChatRequest) -> dict[str, Any]:
    """chat_template_kwargs plus the request's reasoning options (explicit kwargs win)."""
    kw = dict(req.chat_template_kwargs)
    if req.reasoning.enable is not None:
        kw.setdefault("enable_thinking", req.reasoning.enable)
    if req.reasoning.effort is not None:
        kw.setdefault("reasoning_effort", req.reasoning.effort)
    return kw


class ReasoningParser:
    """Splits one candidate's text into (is_reasoning, text) pieces, incrementally. A prefix of
    a marker is held back until it completes or cannot."""

    def __init__(self, start: str = START, end: str = END, *, inside: bool = False) -> None:
        self.start, self.end = start, end
        self._state = "think" if inside else "start"  # start | think | answer
        self._buf = ""
        self._trim = inside  # strip whitespace at the start of the reasoning / of the answer

    def feed(self, text: str) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        self._buf += text
        while True:
            if self._state == "start":
                s = self._buf.lstrip()
                if s.startswith(self.start):
                    self._state, self._buf, self._trim = "think", s[len(self.start):], True
                    continue
                if self.start.startswith(s):
                    return out
                self._state = "answer"
            elif self._state == "think":
                safe, found, self._buf = split_at_marker(self._buf, self.end)
                self._put(out, True, safe)
                if not found:
                    return out
                self._state, self._trim = "answer", True
            else:
                self._put(out, False, self._buf)
                self._buf = ""
                return out

    def _put(self, out: list[tuple[bool, str]], reasoning: bool, text: str) -> None:
        if self._trim:
            text = text.lstrip()
            self._trim = not text
        if text:
            out.append((reasoning, text))

    def finish(self) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        self._put(out, self._state == "think", self._buf)
        self._buf = ""
        return out
