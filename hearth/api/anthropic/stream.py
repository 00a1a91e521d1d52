"""ChatEvents → Anthropic Messages output: content blocks, stop reasons, usage, and the SSE stream.

Streaming and non-streaming share one state machine (`BlockWriter`): the non-streaming
response is the streamed block events applied in order, so both carry the same content.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from hearth.chat.types import (
    ChatEvent,
    Done,
    Finish,
    ReasoningDelta,
    Started,
    StopKind,
    TextDelta,
    Timings,
    ToolCallDelta,
    Usage,
    new_id,
)
from hearth.http.sse import sse_event
from hearth.protocols.anthropic_events import error_event

log = logging.getLogger("hearth.api")

# Hearth's own stop reason for a run stopped by a disconnect or POST /v1/cancel
# before the model finished. Anthropic's SDKs do not validate the enum, so it passes through
# `messages.create` and `messages.stream(...).get_final_message()` unchanged.
CANCELLED = "cancelled"

# The heartbeat while a stream is silent (Anthropic's own keep-alive event).
PING = sse_event("ping", {"type": "ping"})

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "cancelled": CANCELLED}


def stop_reason(finish: Finish | None, stop_sequences: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for how candidate 0 finished."""
    if finish is None:
        return "end_turn", None
    if finish.reason == "stop":
        if (isinstance(finish.stop_reason, str) and not isinstance(finish.stop_reason, StopKind)
                and finish.stop_reason in stop_sequences):
            return "stop_sequence", finish.stop_reason
        return "end_turn", None
    return _STOP_REASONS.get(finish.reason, "end_turn"), None


def usage_dict(u: Usage) -> dict[str, int]:
    """Anthropic's split of the prompt: read from the cache (any tier), written to it at the
    client's breakpoints, and the rest; the three sum to the prompt. A token both served from
    a slot and written to the durable cache (a slot's KV not yet in it) counts once, as read."""
    written = max(0, min(u.cache_write_tokens, u.prompt_tokens - u.cached_tokens))
    return {"input_tokens": u.prompt_tokens - u.cached_tokens - written, "output_tokens": u.completion_tokens,
            "cache_creation_input_tokens": written, "cache_read_input_tokens": u.cached_tokens}


def tool_use_id(call_id: str | None) -> str:
    if call_id is None:
        return new_id("toolu_")
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_")  # keeps the id recognisable in the logs


class BlockWriter:
    """Turns candidate 0's deltas into content_block_start / _delta / _stop payloads.

    Invariant: at most one block is open, and it is closed before the next one opens, so block
    indices only grow. Tool calls are expected one after another; arguments for a call whose
    block is already closed cannot be sent any more and are dropped (logged)."""

    def __init__(self) -> None:
        self.index = -1
        self._open: str | None = None  # "text" | "thinking" | "tool_use"
        self._call: int | None = None  # call_index of the open tool_use block
        self._done_calls: set[int] = set()

    def text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = self._switch("text", {"type": "text", "text": ""})
        return [*out, self._delta({"type": "text_delta", "text": text})]

    def thinking(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return [*out, self._delta({"type": "thinking_delta", "thinking": text})]

    def tool_call(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open != "tool_use" or self._call != d.call_index:
            if d.call_index in self._done_calls:
                log.warning("dropped arguments for tool call %d: its block is closed", d.call_index)
                return []
            out = self._switch("tool_use", {"type": "tool_use", "id": tool_use_id(d.id), "name": d.name or "",
                                            "input": {}}, force=True)
            self._call = d.call_index
        if d.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": d.arguments}))
        return out

    def close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        if self._call is not None:
            self._done_calls.add(self._call)
        self._open, self._call = None, None
        return [{"type": "content_block_stop", "index": self.index}]

    def _switch(self, kind: str, block: dict[str, Any], force: bool = False) -> list[dict[str, Any]]:
        if self._open == kind and not force:
            return []
        out = self.close()
        self.index += 1
        self._open = kind
        return [*out, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


def block_events(writer: BlockWriter, ev: ChatEvent) -> list[dict[str, Any]]:
    if isinstance(ev, TextDelta) and ev.index == 0:
        return writer.text(ev.text)
    if isinstance(ev, ReasoningDelta) and ev.index == 0:
        return writer.thinking(ev.text)
    if isinstance(ev, ToolCallDelta) and ev.index == 0:
        return writer.tool_call(ev)
    return []


@dataclass(slots=True)
class Content:
    """The content blocks, built by applying the block events in order."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    _json: dict[int, list[str]] = field(default_factory=dict)

    def apply(self, payload: dict[str, Any]) -> None:
        kind = payload["type"]
        if kind == "content_block_start":
            self.blocks.append(dict(payload["content_block"]))
        elif kind == "content_block_delta":
            block, delta = self.blocks[payload["index"]], payload["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                self._json.setdefault(payload["index"], []).append(delta["partial_json"])

    def final(self) -> list[dict[str, Any]]:
        for i, parts in self._json.items():
            self.blocks[i]["input"] = tool_input("".join(parts))
        return self.blocks


def tool_input(arguments: str) -> dict[str, Any]:
    """The parsed tool input. Arguments that are not a JSON object (a model that went off the
    rails) are kept, not lost, under "arguments"."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


@dataclass(slots=True)
class Outcome:
    content: list[dict[str, Any]]
    finish: Finish | None
    usage: Usage
    error: str | None
    timings: Timings | None = None


async def collect(events: AsyncIterator[ChatEvent]) -> Outcome:
    writer, content = BlockWriter(), Content()
    finish, usage, error, timings = None, Usage(), None, None
    try:
        async for ev in events:
            for payload in block_events(writer, ev):
                content.apply(payload)
            if isinstance(ev, Finish) and ev.index == 0:
                finish = ev
            elif isinstance(ev, Done):
                usage, error, timings = ev.usage, ev.error, ev.timings
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    for payload in writer.close():
        content.apply(payload)
    return Outcome(content.final(), finish, usage, error, timings)


def hearth_fields(finish: Finish | None, timings: Timings | None) -> dict[str, Any]:
    """Hearth's extra keys on a message (and a stream's message_delta): why Hearth itself
    stopped it, and llama-server's timings."""
    out: dict[str, Any] = {}
    if finish is not None and finish.error:  # a malformed tool call, named
        out["stop_details"] = {"type": "malformed_tool_call", "message": finish.error}
    elif finish is not None and isinstance(finish.stop_reason, StopKind):
        out["stop_details"] = {"type": finish.stop_reason.value}
    if timings is not None:
        out["timings"] = timings.as_llama_server()
    return out


def message_body(msg_id: str, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                 usage: Usage) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage_dict(usage)}


async def stream_events(events: AsyncIterator[ChatEvent], msg_id: str, model: str,
                        stop_sequences: list[str]) -> AsyncIterator[bytes]:
    """The SSE body: message_start, ping, content blocks, message_delta, message_stop; or an
    `error` event (and nothing after it) if generation fails."""

    def send(payload: dict[str, Any]) -> bytes:
        return sse_event(payload["type"], payload)

    writer = BlockWriter()
    started, finish = False, None
    try:
        async for ev in events:
            if not started:
                started = True
                first = ev if isinstance(ev, Started) else Started(0)
                usage = Usage(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens)
                yield send({"type": "message_start",
                            "message": message_body(msg_id, model, [], (None, None), usage)})
                yield PING
            for payload in block_events(writer, ev):
                yield send(payload)
            if isinstance(ev, Finish) and ev.index == 0:
                finish = ev
                for payload in writer.close():
                    yield send(payload)
            elif isinstance(ev, Done):
                for payload in writer.close():
                    yield send(payload)
                if ev.error:
                    yield error_event(ev.error)
                    return
                reason, sequence = stop_reason(finish, stop_sequences)
                yield send({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                            "usage": usage_dict(ev.usage), **hearth_fields(finish, ev.timings)})
                yield send({"type": "message_stop"})
                return
        yield error_event("the generation ended without a result")
    except Exception:
        log.exception("streaming message %s failed", msg_id)
        yield error_event("internal server error")
    finally:
        await events.aclose()  # type: ignore[attr-defined]
