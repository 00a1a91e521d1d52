"""The Anthropic Messages stream cut (cuts/base.py says what a cut is)."""

from __future__ import annotations

import json
from typing import Any

from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.protocols import Event, parse, wire


class MessagesCut(Cut):
    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []  # as the client has them: type, text / thinking / partial_json
        self.open: int | None = None  # the block the client has open
        self.message_id: str | None = None
        self.stopped = False  # message_delta went out
        self._map: dict[int, int] = {}  # continuation block index -> the client's

    def feed(self, event: Event) -> None:
        _, d = parse(event)
        if not isinstance(d, dict):
            return
        kind = d.get("type")
        if kind == "message_start":
            self.message_id = (d.get("message") or {}).get("id")
        elif kind == "content_block_start":
            block = dict(d.get("content_block") or {})
            block.setdefault("partial_json", "")
            self.blocks.append(block)
            self.open = len(self.blocks) - 1
        elif kind == "content_block_delta":
            block, delta = self.blocks[d["index"]], d.get("delta") or {}
            for key, field in (("text_delta", "text"), ("thinking_delta", "thinking"),
                               ("input_json_delta", "partial_json")):
                if delta.get("type") == key:
                    block[field] = (block.get(field) or "") + (delta.get(field) or "")
        elif kind == "content_block_stop":
            self.open = None
        elif kind == "message_delta":
            self.stopped = True

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        if self.stopped and not whole:
            return None
        content = [self._block(i, b) for i, b in enumerate(self.blocks)]
        messages = list(request.get("messages") or [])
        last = messages[-1] if messages else None
        if isinstance(last, dict) and last.get("role") == "assistant" and request.get("continue_final_message") \
                is not False:  # the client's own prefill, then what it was sent
            mine = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
            if mine and content and mine[-1].get("type") == "text" and content[0]["type"] == "text":
                content[0] = {"type": "text", "text": (mine[-1].get("text") or "") + content[0]["text"]}
                mine = mine[:-1]
            content = [*mine, *content]
            messages.pop()
        if not content:
            content = [{"type": "text", "text": ""}]
        return {**request, "messages": [*messages, {"role": "assistant", "content": content}],
                "continue_final_message": True}

    def _block(self, i: int, b: dict[str, Any]) -> dict[str, Any]:
        if b.get("type") == "thinking":
            return {"type": "thinking", "thinking": b.get("thinking") or "", "signature": ""}
        if b.get("type") == "tool_use":
            if i == self.open:  # cut inside its input: the rest is the continuation's
                return {"type": "tool_use", "id": b["id"], "name": b["name"], "partial_json": b["partial_json"]}
            try:
                value = json.loads(b["partial_json"] or "{}")
            except ValueError:
                value = {}
            return {"type": "tool_use", "id": b["id"], "name": b["name"],
                    "input": value if isinstance(value, dict) else {}}
        return {"type": "text", "text": b.get("text") or ""}

    def begin(self) -> None:
        self._map = {}

    def rewrite(self, event: Event) -> list[Event]:
        name, d = parse(event)
        if not isinstance(d, dict):
            return [event]
        kind = d.get("type")
        if kind in ("message_start", "ping"):
            return []
        out: list[Event] = []
        if kind == "content_block_start":
            j, block = d["index"], d.get("content_block") or {}
            if not self._map and self._goes_on(block):
                self._map[j] = self.open  # type: ignore[assignment]
                return []
            out += self._close()
            self._map[j] = len(self.blocks)  # the next index the client gets
        elif kind in ("content_block_delta", "content_block_stop"):
            if d.get("index") not in self._map:
                return []
        elif kind == "message_delta":
            out += self._close()
        if "index" in d:
            d["index"] = self._map[d["index"]]
        return [*out, wire(name, d)]

    def _goes_on(self, block: dict[str, Any]) -> bool:
        """Whether the continuation's first block is the block the client has open: the same
        kind (a tool_use block without a name: the cut call's rest)."""
        if self.open is None:
            return False
        mine = self.blocks[self.open]
        return block.get("type") == mine.get("type") and (block.get("type") != "tool_use" or not block.get("name"))

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        return [wire("content_block_stop", {"type": "content_block_stop", "index": self.open})]
