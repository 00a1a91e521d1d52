"""One candidate's generated text → ChatEvents: reasoning first, then tool calls, then text.

Runs in the backend after the engine, so streamed and non-streamed responses carry the same
events, and every protocol serializes the same calls.
"""

from __future__ import annotations

from hearth.chat.reasoning import ReasoningParser
from hearth.chat.tool_parsers import BadCall, Part, ToolParser
from hearth.chat.types import ChatEvent, Finish, ReasoningDelta, TextDelta, ToolCallDelta, new_id
from hearth.engine.types import TokenLogprob


class OutputParser:
    def __init__(self, index: int, reasoning: ReasoningParser | None, tools: ToolParser | None,
                 parallel_tool_calls: bool = True) -> None:
        self.index = index
        self._reasoning = reasoning
        self._tools = tools
        self._parallel = parallel_tool_calls
        self._ids: dict[int, str] = {}
        self._bad: list[str] = []  # malformed calls, described

    def feed(self, text: str, logprobs: list[TokenLogprob] | None = None, n_tokens: int = 0) -> list[ChatEvent]:
        events = self._route(self._reasoning.feed(text) if self._reasoning else [(False, text)])
        return self._attach(events, logprobs, n_tokens)

    def finish(self, reason: str, stop_reason: str | int | None = None) -> list[ChatEvent]:
        events = self._route(self._reasoning.finish()) if self._reasoning else []
        if self._tools is not None:
            events += self._calls(self._tools.finish())
            if self._bad:  # SIE's contract: a clear finish, and a message naming the call
                reason = "length" if reason == "length" else "error"
            elif self._ids and reason == "stop":
                reason = "tool_calls"
        events.append(Finish(self.index, reason, stop_reason, "; ".join(self._bad) or None))
        return events

    def _route(self, pieces: list[tuple[bool, str]]) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for reasoning, text in pieces:
            if reasoning:
                events.append(ReasoningDelta(self.index, text))
            elif self._tools is not None:
                events += self._calls(self._tools.feed(text))
            else:
                events.append(TextDelta(self.index, text))
        return events

    def _calls(self, parts: list[Part]) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for p in parts:
            if isinstance(p, str):
                events.append(TextDelta(self.index, p))
            elif isinstance(p, BadCall):
                who = " ".join(x for x in (self._ids.get(p.call_index), p.name and f"({p.name})") if x)
                snippet = p.text if len(p.text) <= 200 else p.text[:200] + "…"
                self._bad.append(f"malformed tool call {p.call_index}{' ' + who if who else ''}: "
                                 f"{p.problem}: {snippet!r}")
            elif p.call_index > 0 and not self._parallel:
                continue  # parallel_tool_calls false: the first call only
            elif p.name is not None:
                self._ids[p.call_index] = new_id("call_")
                events.append(ToolCallDelta(self.index, p.call_index, self._ids[p.call_index], p.name, p.arguments))
            elif p.arguments:
                events.append(ToolCallDelta(self.index, p.call_index, arguments=p.arguments))
        return events

    def _attach(self, events: list[ChatEvent], logprobs: list[TokenLogprob] | None, n_tokens: int) -> list[ChatEvent]:
        """The token count rides on the first text or reasoning event; logprobs on a text event
        (an empty one when the tokens made no text)."""
        if not (logprobs or n_tokens):
            return events
        for ev in events:
            if isinstance(ev, TextDelta) or (isinstance(ev, ReasoningDelta) and not logprobs):
                ev.n_tokens = n_tokens
                if isinstance(ev, TextDelta):
                    ev.logprobs = logprobs
                return events
        return [TextDelta(self.index, "", logprobs, n_tokens), *events] if logprobs else events
