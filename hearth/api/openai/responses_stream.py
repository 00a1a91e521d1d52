"""ChatEvents → a Responses API response object and its streaming events.

`ResponseAssembler` is the only place that builds output items, for streamed and
non-streamed requests alike, so both always produce the same object. Each call returns the
wire events it caused (dicts with `type`, without `sequence_number`); a non-streaming caller
drops them, `sse_events` numbers and sends them.

Invariant: after `start()`, exactly one terminal event (response.completed, .incomplete or
.failed) is produced, by `finish()` or `fail()`, whichever comes first.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from hearth.api.http.run_options import stop_fields
from hearth.chat.types import (
    ChatEvent,
    Done,
    Finish,
    ReasoningDelta,
    Started,
    TextDelta,
    Timings,
    ToolCallDelta,
    Usage,
    new_id,
)
from hearth.http.sse import sse_event

log = logging.getLogger("hearth.api")

Event = dict[str, Any]

# finish_reason → (status, incomplete_details.reason)
_OUTCOME: dict[str, tuple[str, str | None]] = {
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "cancelled": ("incomplete", "cancelled"),
    "error": ("failed", None),
}


def usage_object(u: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_write_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.total_tokens}


def output_text(output: list[dict[str, Any]]) -> str:
    return "".join(part.get("text") or "" for item in output if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")


class _OpenItem:
    """The output item being generated: its index, its dict, and the text gathered so far."""

    __slots__ = ("buf", "call_index", "index", "item")

    def __init__(self, index: int, item: dict[str, Any], call_index: int | None = None) -> None:
        self.index, self.item, self.call_index = index, item, call_index
        self.buf: list[str] = []


class ResponseAssembler:
    def __init__(self, response: dict[str, Any], namespaced: dict[str, tuple[str, str]] | None = None) -> None:
        """`response` is the skeleton: every field but output, status, usage and the outcome.
        `namespaced` maps the names of tools declared inside a namespace to (namespace, name)."""
        self.response = response
        self.namespaced = namespaced or {}
        response.update(status="in_progress", output=[], output_text="", incomplete_details=None, error=None,
                        usage=None)
        self.output: list[dict[str, Any]] = response["output"]
        self.usage = Usage()
        self.reasoning_tokens = 0
        self.finish_reason: str | None = None
        self.finish_event: Finish | None = None
        self.timings: Timings | None = None
        self.error: str | None = None
        self.finished = False
        # A background run cancelled by its client (.../cancel, /v1/cancel) ends as `cancelled`,
        # as OpenAI's; any other cancel (a disconnect, shutdown) is `incomplete`.
        self.cancelled_as = "incomplete"
        self._open: _OpenItem | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> list[Event]:
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def feed(self, ev: ChatEvent) -> list[Event]:
        if self.finished:
            return []
        if isinstance(ev, Started):
            self.usage.prompt_tokens, self.usage.cached_tokens = ev.prompt_tokens, ev.cached_tokens
        elif isinstance(ev, TextDelta):
            self.usage.completion_tokens += ev.n_tokens
            if ev.text:
                return self._text(ev.text)
        elif isinstance(ev, ReasoningDelta):
            self.reasoning_tokens += ev.n_tokens
            if ev.text:
                return self._reasoning(ev.text)
        elif isinstance(ev, ToolCallDelta):
            return self._tool_call(ev)
        elif isinstance(ev, Finish):
            self.finish_reason, self.finish_event = ev.reason, ev
        elif isinstance(ev, Done):
            self.usage, self.error, self.timings = ev.usage, ev.error or self.error, ev.timings
        return []

    def finish(self) -> list[Event]:
        """Close the open item and produce the terminal event. Without a finish reason the run
        was abandoned (client gone, stream closed): that counts as cancelled."""
        if self.finished:
            return []
        reason = "error" if self.error else (self.finish_reason or "cancelled")
        status, incomplete = _OUTCOME.get(reason, ("completed", None))
        if reason == "cancelled":
            status = self.cancelled_as
        events = self._close("completed" if status == "completed" else "incomplete")
        self.finished = True
        r = self.response
        r["status"] = status
        r["incomplete_details"] = {"reason": incomplete} if incomplete else None
        if status == "failed":
            r["error"] = {"code": "server_error", "message": self.error or "generation failed"}
        r["usage"] = usage_object(self.usage, self.reasoning_tokens)
        r["output_text"] = output_text(self.output)
        r["completed_at"] = int(time.time()) if status == "completed" else None
        extra = stop_fields(self.finish_event)
        if "stop_reason" in extra:
            r["stop_reason"] = extra["stop_reason"]
        if "error" in extra:  # a malformed tool call: Responses' own error field names it
            r["error"] = {"code": "malformed_tool_call", "message": extra["error"]["message"]}
        if self.timings is not None:  # llama-server's timings, as an extra key
            r["timings"] = self.timings.as_llama_server()
        terminal = {"completed": "response.completed", "incomplete": "response.incomplete",
                    "cancelled": "response.incomplete", "failed": "response.failed"}[status]
        events.append({"type": terminal, "response": r})
        return events

    def fail(self, message: str) -> list[Event]:
        self.error = message
        return self.finish()

    def _lifecycle(self, type_: str) -> Event:
        return {"type": type_, "response": copy.deepcopy(self.response)}

    # ---- output items -------------------------------------------------------------------

    def _add(self, item: dict[str, Any], call_index: int | None = None) -> tuple[_OpenItem, list[Event]]:
        events = self._close("completed")
        self.output.append(item)
        self._open = _OpenItem(len(self.output) - 1, item, call_index)
        events.append({"type": "response.output_item.added", "output_index": self._open.index,
                       "item": copy.deepcopy(item)})
        return self._open, events

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        it = self._open
        if it is None or it.item["type"] != "message":
            it, events = self._add({"id": new_id("msg_"), "type": "message", "status": "in_progress",
                                    "role": "assistant", "content": []})
            events.append(self._part_event("response.content_part.added", it, _text_part("")))
        it.buf.append(text)
        events.append({"type": "response.output_text.delta", "item_id": it.item["id"], "output_index": it.index,
                       "content_index": 0, "delta": text, "logprobs": []})
        return events

    def _reasoning(self, text: str) -> list[Event]:
        events: list[Event] = []
        it = self._open
        if it is None or it.item["type"] != "reasoning":
            it, events = self._add({"id": new_id("rs_"), "type": "reasoning", "summary": [], "content": []})
            events.append(self._part_event("response.content_part.added", it, _reasoning_part("")))
        it.buf.append(text)
        events.append({"type": "response.reasoning_text.delta", "item_id": it.item["id"], "output_index": it.index,
                       "content_index": 0, "delta": text})
        return events

    def _tool_call(self, ev: ToolCallDelta) -> list[Event]:
        events: list[Event] = []
        it = self._open
        announce = ev.id is not None or ev.name is not None
        if announce or it is None or it.item["type"] != "function_call" or it.call_index != ev.call_index:
            item = {"id": new_id("fc_"), "type": "function_call", "status": "in_progress",
                    "call_id": ev.id or new_id("call_"), "name": ev.name or "", "arguments": ""}
            if item["name"] in self.namespaced:
                item["namespace"], item["name"] = self.namespaced[item["name"]]
            it, events = self._add(item, ev.call_index)
        if ev.arguments:
            it.buf.append(ev.arguments)
            events.append({"type": "response.function_call_arguments.delta", "item_id": it.item["id"],
                           "output_index": it.index, "delta": ev.arguments})
        return events

    def _close(self, status: str) -> list[Event]:
        it, self._open = self._open, None
        if it is None:
            return []
        item, text = it.item, "".join(it.buf)
        base = {"item_id": item["id"], "output_index": it.index}
        events: list[Event] = []
        if item["type"] == "message":
            part = _text_part(text)
            item["content"] = [part]
            item["status"] = status
            events += [{"type": "response.output_text.done", **base, "content_index": 0, "text": text,
                        "logprobs": []},
                       self._part_event("response.content_part.done", it, part)]
        elif item["type"] == "reasoning":
            part = _reasoning_part(text)
            item["content"] = [part]
            events += [{"type": "response.reasoning_text.done", **base, "content_index": 0, "text": text},
                       self._part_event("response.content_part.done", it, part)]
        else:
            item["arguments"] = text
            item["status"] = status
            events.append({"type": "response.function_call_arguments.done", **base, "name": item["name"],
                           "arguments": text})
        events.append({"type": "response.output_item.done", "output_index": it.index, "item": copy.deepcopy(item)})
        return events

    @staticmethod
    def _part_event(type_: str, it: _OpenItem, part: dict[str, Any]) -> Event:
        return {"type": type_, "item_id": it.item["id"], "output_index": it.index, "content_index": 0,
                "part": copy.deepcopy(part)}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


async def collect(events: AsyncIterator[ChatEvent], asm: ResponseAssembler) -> dict[str, Any]:
    async for ev in events:
        asm.feed(ev)
    asm.finish()
    return asm.response


async def sse_events(events: AsyncIterator[ChatEvent], asm: ResponseAssembler,
                     on_end: Callable[[dict[str, Any]], None]) -> AsyncIterator[bytes]:
    """The SSE body: `event: <type>` + data with an increasing `sequence_number`, ending with
    exactly one terminal event (no [DONE], as OpenAI). `on_end(response)` runs once at the end,
    also when the client left mid-stream."""
    seq = itertools.count()

    def wire(batch: list[Event]) -> bytes:
        return b"".join(sse_event(e["type"], {**e, "sequence_number": next(seq)}) for e in batch)

    try:
        yield wire(asm.start())
        try:
            async for ev in events:
                batch = asm.feed(ev)
                if batch:
                    yield wire(batch)
            tail = asm.finish()
        except Exception as e:  # the stream has started: report in-band, never a broken body
            log.exception("responses stream failed")
            tail = asm.fail(f"{type(e).__name__}: {e}")
        yield wire(tail)
    finally:
        asm.finish()  # no-op unless the client left mid-stream
        on_end(asm.response)
