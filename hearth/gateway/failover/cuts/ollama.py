"""The Ollama stream cut, for /api/chat and /api/generate (cuts/base.py says what a cut is).

Ollama streams NDJSON: each line a whole object with the answer's next text (`message.content`
on chat, `response` on generate) or thinking, tool calls whole in one line (never cut in two),
and a final `"done": true` object with the counts and durations. The continuation request is
the same request with the partial answer:
- /api/chat: as the conversation's last assistant message (its `content`, `thinking` and
  `tool_calls`), with Hearth's `continue_final_message: true` (as on /v1/chat/completions);
- /api/generate: in Hearth's `partial_response` / `partial_thinking` fields (docs/api.md); a
  `raw` prompt is not continued (nothing to put a partial answer in but the prompt itself).
Its lines go to the client as they come (no ids, no indexes to keep), except the final object:
its counts are the whole answer's already (the continuation is sent with `partial_is_output`:
`eval_count` counts both parts, `prompt_eval_count` the prompt only), and its durations are
made the whole answer's as the gateway saw it: `total_duration` from the turn's arrival,
`prompt_eval_duration` up to the first line the client got (the first node's load and prompt),
`eval_duration` the rest (the failover included), `load_duration` 0.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.protocols import Event

Kind = Literal["chat", "generate"]


class OllamaCut(Cut):
    def __init__(self, kind: Kind, started: float | None = None) -> None:
        self.kind = kind
        self.started = time.monotonic() if started is None else started  # the turn's arrival
        self.first: float | None = None  # the first line the client got
        self.text = ""
        self.thinking = ""
        self.calls: list[Any] = []
        self.finished = False  # the final object went out

    def feed(self, event: Event) -> None:
        if self.first is None:
            self.first = time.monotonic()
        d = _parse(event)
        if d is None:
            return
        if self.kind == "chat":
            m = d.get("message")
            if isinstance(m, dict):
                self.text += m.get("content") or ""
                self.thinking += m.get("thinking") or ""
                if isinstance(m.get("tool_calls"), list):
                    self.calls += m["tool_calls"]
        else:
            self.text += d.get("response") or ""
            self.thinking += d.get("thinking") or ""
        if d.get("done") is True:
            self.finished = True

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        if self.finished and not whole:
            return None
        if self.kind == "generate":
            if request.get("raw") is True:
                return None
            mine_text, mine_thinking = request.get("partial_response"), request.get("partial_thinking")
            return {**request, "partial_response": (mine_text if isinstance(mine_text, str) else "") + self.text,
                    "partial_thinking": (mine_thinking if isinstance(mine_thinking, str) else "") + self.thinking}
        messages = list(request.get("messages") or [])
        partial: dict[str, Any] = {"role": "assistant", "content": self.text}
        last = messages[-1] if messages else None
        if request.get("continue_final_message") is True and isinstance(last, dict) \
                and last.get("role") == "assistant":  # the client's own partial answer, then ours
            messages.pop()
            partial = {**last, "content": (last.get("content") or "") + self.text}
        if self.thinking:
            partial["thinking"] = (partial.get("thinking") or "") + self.thinking
        if self.calls:
            partial["tool_calls"] = [*(partial.get("tool_calls") or []), *self.calls]
        return {**request, "messages": [*messages, partial], "continue_final_message": True}

    def begin(self) -> None:
        pass

    def rewrite(self, event: Event) -> list[Event]:
        d = _parse(event)
        if d is None or d.get("done") is not True:
            return [event]
        now = time.monotonic()
        total = int((now - self.started) * 1e9)
        before = int(((self.first or now) - self.started) * 1e9)
        d.update(total_duration=total, load_duration=0, prompt_eval_duration=before,
                 eval_duration=max(0, total - before))
        return [json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode()]


def _parse(event: Event) -> dict[str, Any] | None:
    try:
        d = json.loads(event)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None
