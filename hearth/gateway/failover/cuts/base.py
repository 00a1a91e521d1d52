"""Stream migration: an answer whose Hearth node broke after the client's first byte goes on
on another node, and the client sees one uninterrupted stream.

A `Cut` follows a stream as it is relayed (`feed`: every event the client gets) and knows
the answer so far in its protocol's terms: text, reasoning, tool calls with their ids, names
and (partial) arguments; content block indexes on Messages; items, output indexes and
sequence numbers on Responses. When the node breaks, `body` is the request to send to another
node: the same request plus that partial answer as the final assistant message, with
`continue_final_message: true` (docs/api.md, "Continuing a partial answer"). The other node
sends only what is new; `rewrite` turns each of its events into what the client gets:
the first answer's ids, its opening events dropped (role chunk / message_start /
response.created, and the block or item that goes on), indexes and sequence numbers
continuous, one finish. Usage needs nothing: the continuation is sent with `partial_is_output`,
so it counts the partial answer in its completion tokens, leaves it out of its prompt tokens
and takes it off max_tokens.

`begin()` is called before each continuation (a stream may move more than once).
"""

from __future__ import annotations

import json
from typing import Any

from hearth.api.http.sse import json_bytes
from hearth.gateway.protocols import Protocol

Event = bytes  # one SSE event, without its blank line

# The node's field that counts the continued message as this answer's output (docs/api.md,
# "Continuing a partial answer"): a client's own prefill counts as input, but the part this
# answer already produced keeps its place in max_tokens and in the completion tokens.
PARTIAL_IS_OUTPUT = "partial_is_output"


def parse(event: Event) -> tuple[str | None, Any]:
    """(event name, parsed data) of one SSE event; data None for a comment or unreadable data."""
    name, data = None, []
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    if not data:
        return name, None
    raw = b"\n".join(data)
    if raw == b"[DONE]":
        return name, "[DONE]"
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, None


def wire(name: str | None, data: Any) -> Event:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json_bytes(data)


class Cut:
    """What the client has been sent of one streamed answer; see the module docstring."""

    def feed(self, event: Event) -> None:
        raise NotImplementedError

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        """The continuation request, or None when this answer cannot be continued. `whole`: also
        when it ended (the request that holds the whole answer, for turn_record.py)."""
        raise NotImplementedError

    def begin(self) -> None:
        raise NotImplementedError

    def rewrite(self, event: Event) -> list[Event]:
        raise NotImplementedError


def cut_for(protocol: Protocol, request: dict[str, Any]) -> Cut | None:
    """The Cut for a streamed request, or None where the stream cannot move (one answer only:
    `n` above 1 is not continued; legacy completions are not chat)."""
    from hearth.gateway.failover.cuts.responses import ResponsesCut

    if protocol == "chat" and request.get("n", 1) in (1, None):
        return ChatCut()
    if protocol == "anthropic":
        return MessagesCut()
    if protocol == "responses":
        return ResponsesCut()
    return None


# ---- Chat Completions ---------------------------------------------------------------------


class ChatCut(Cut):
    def __init__(self) -> None:
        self.id: str | None = None
        self.created: int | None = None
        self.text = ""
        self.reasoning = ""
        self.calls: dict[int, dict[str, str]] = {}  # index -> id, name, arguments
        self.finished = False  # a finish_reason went out

    def feed(self, event: Event) -> None:
        _, d = parse(event)
        if not isinstance(d, dict):
            return
        if self.id is None and isinstance(d.get("id"), str):
            self.id, self.created = d["id"], d.get("created")
        for choice in d.get("choices") or []:
            delta = choice.get("delta") or {}
            self.text += delta.get("content") or ""
            self.reasoning += delta.get("reasoning_content") or ""
            for c in delta.get("tool_calls") or []:
                call = self.calls.setdefault(int(c.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                fn = c.get("function") or {}
                call["id"] = c.get("id") or call["id"]
                call["name"] = fn.get("name") or call["name"]
                call["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finished = True

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        if self.finished and not whole:
            return None  # the answer ended: only its totals were missing
        messages = list(request.get("messages") or [])
        partial: dict[str, Any] = {"role": "assistant", "content": self.text}
        if request.get("continue_final_message") is True and messages and messages[-1].get("role") == "assistant":
            partial = _joined_chat(messages.pop(), partial)  # the client's own partial answer, then ours
        if self.reasoning:
            partial["reasoning_content"] = (partial.get("reasoning_content") or "") + self.reasoning
        if self.calls:
            partial["tool_calls"] = [*(partial.get("tool_calls") or []), *(
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.calls.items()))]
        return {**request, "messages": [*messages, partial], "continue_final_message": True}

    def begin(self) -> None:
        pass

    def rewrite(self, event: Event) -> list[Event]:
        name, d = parse(event)
        if not isinstance(d, dict) or "choices" not in d:
            return [event]  # [DONE], an in-band error
        d["id"] = self.id or d.get("id")
        if self.created is not None:
            d["created"] = self.created
        choices = []
        for choice in d["choices"]:
            delta = choice.get("delta") or {}
            if delta.get("role") and not delta.get("content") and choice.get("finish_reason") is None:
                continue  # the continuation's opening role chunk
            for c in delta.get("tool_calls") or []:
                if int(c.get("index", 0)) in self.calls:  # the cut call goes on: announced once, already
                    for k in ("id", "type"):
                        c.pop(k, None)
                    (c.get("function") or {}).pop("name", None)
            choices.append(choice)
        if not choices and d["choices"]:
            return []
        d["choices"] = choices
        return [wire(name, d)]


def _joined_chat(mine: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    content = mine.get("content")
    text = content if isinstance(content, str) else "".join(
        p.get("text") or "" for p in content or [] if isinstance(p, dict))
    return {**mine, "content": text + ours["content"]}


# ---- Anthropic Messages -------------------------------------------------------------------


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
