"""ChatEvents serialised as Ollama's answers: NDJSON lines while streaming, one object when not.

Invariants:
- Streamed text and thinking are the whole answer's, piece by piece: joined, the lines' `content`
  (chat) or `response` (generate) equal the unstreamed answer's.
- A tool call goes out whole, in one line, its `function.arguments` an object (Ollama streams no
  partial calls); the calls come in the line before the final one.
- The final line (or the whole answer) carries `done: true`, `done_reason` and the durations in
  nanoseconds; an error ends the stream with one `{"error": ...}` line instead (Ollama's
  in-band error, which its clients raise).
- Test gate (hearth/test_gate.py): before line `i` (0-based) of a stream goes out,
  `ollama-line-<i>` (an e2e test holds a node there and kills it mid-stream: the gateway's
  failover, tests/e2e/gateway/test_ollama_failover.py).
- `load_duration` is the time before the prompt began when this request found its model
  unloaded (the load, and any wait for a slot), else 0; `prompt_eval_count` counts the whole
  prompt, cached tokens included (what a client needs to track its window).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from hearth import test_gate
from hearth.api.http.run_options import stop_fields
from hearth.chat.types import ChatEvent, Done, Finish, ReasoningDelta, TextDelta, Timings, ToolCallDelta, Usage
from hearth.http.sse import json_bytes
from hearth.protocols.ollama_names import timestamp

Kind = Literal["chat", "generate"]

# Hearth's finish reasons as Ollama's done_reason: a turn that ends in tool calls is "stop" there.
DONE_REASONS = {"tool_calls": "stop"}


def arguments_object(text: str) -> dict[str, Any]:
    """A call's arguments as Ollama sends them: an object ({} for text that is not one; the
    final object's `error` then says the call was malformed)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class Calls:
    """Tool calls gathered from their deltas, in order."""

    calls: dict[int, list[str]] = field(default_factory=dict)  # call index -> [id, name, arguments]

    def add(self, ev: ToolCallDelta) -> None:
        call = self.calls.setdefault(ev.call_index, [ev.id or f"call_{ev.call_index}", ev.name or "", ""])
        call[2] += ev.arguments

    def wire(self) -> list[dict[str, Any]]:
        return [{"id": cid, "function": {"index": i, "name": name, "arguments": arguments_object(args)}}
                for i, (cid, name, args) in sorted(self.calls.items())]


@dataclass(slots=True)
class Clock:
    """What the durations are measured from: the request's arrival, and whether its model was
    loaded then."""

    arrived: float = field(default_factory=time.monotonic)
    was_loaded: bool = True


def _ns(ms: float) -> int:
    return int(ms * 1_000_000)


def final_fields(finish: Finish | None, usage: Usage, timings: Timings | None, clock: Clock) -> dict[str, Any]:
    total = int((time.monotonic() - clock.arrived) * 1e9)
    prompt_ns = _ns(timings.prompt_ms) if timings else 0
    eval_ns = _ns(timings.predicted_ms) if timings else 0
    reason = finish.reason if finish is not None else "stop"
    return {"done": True, "done_reason": DONE_REASONS.get(reason, reason), "total_duration": total,
            "load_duration": 0 if clock.was_loaded else max(0, total - prompt_ns - eval_ns),
            "prompt_eval_count": usage.prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": usage.completion_tokens, "eval_duration": eval_ns, **stop_fields(finish)}


def _piece(kind: Kind, model: str, text: str = "", thinking: str | None = None,
           tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if kind == "generate":
        out: dict[str, Any] = {"model": model, "created_at": timestamp(), "response": text}
        if thinking:
            out["thinking"] = thinking
        return out
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"model": model, "created_at": timestamp(), "message": message}


@dataclass(slots=True)
class Whole:
    """An answer gathered whole (`stream: false`)."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: Calls = field(default_factory=Calls)
    finish: Finish | None = None
    done: Done | None = None

    def add(self, ev: ChatEvent) -> None:
        if isinstance(ev, TextDelta):
            self.text.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            self.thinking.append(ev.text)
        elif isinstance(ev, ToolCallDelta):
            self.calls.add(ev)
        elif isinstance(ev, Finish):
            self.finish = ev
        elif isinstance(ev, Done):
            self.done = ev

    def body(self, kind: Kind, model: str, clock: Clock) -> dict[str, Any]:
        done = self.done or Done(Usage())
        piece = _piece(kind, model, "".join(self.text), "".join(self.thinking) or None, self.calls.wire() or None)
        return piece | final_fields(self.finish, done.usage, done.timings, clock)


async def gather(events: AsyncIterator[ChatEvent]) -> Whole:
    whole = Whole()
    try:
        async for ev in events:
            whole.add(ev)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return whole


def line(obj: dict[str, Any]) -> bytes:
    return json_bytes(obj) + b"\n"


async def stream_lines(events: AsyncIterator[ChatEvent], kind: Kind, model: str, clock: Clock
                       ) -> AsyncIterator[bytes]:
    """The NDJSON lines of a streamed answer (the module's invariants)."""
    calls = Calls()
    finish: Finish | None = None
    gated = bool(os.environ.get(test_gate.ENV))  # tests only: the module's docstring
    sent = 0
    try:
        async for ev in events:
            if gated:
                await asyncio.to_thread(test_gate.wait_at_gate, f"ollama-line-{sent}")
            if isinstance(ev, TextDelta):
                if ev.text:
                    sent += 1
                    yield line(_piece(kind, model, ev.text) | {"done": False})
            elif isinstance(ev, ReasoningDelta):
                if ev.text:
                    sent += 1
                    yield line(_piece(kind, model, thinking=ev.text) | {"done": False})
            elif isinstance(ev, ToolCallDelta):
                calls.add(ev)
            elif isinstance(ev, Finish):
                finish = ev
            elif isinstance(ev, Done):
                if ev.error:
                    yield line({"error": ev.error})
                    return
                if calls.calls:
                    yield line(_piece(kind, model, tool_calls=calls.wire()) | {"done": False})
                yield line(_piece(kind, model) | final_fields(finish, ev.usage, ev.timings, clock))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
