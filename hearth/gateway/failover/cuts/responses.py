"""Stream migration for the Responses API (see failover/cuts/): the client keeps its response
id, item ids, output indexes and an unbroken run of sequence numbers; the item the cut left
open goes on (its added / content_part.added events dropped, its done events carry the whole
text), and the terminal event's response is the first one's with the whole output."""

from __future__ import annotations

import copy
from typing import Any

from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.protocols import Event, parse, wire

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
DONE_TEXT = {"response.output_text.done": "text", "response.reasoning_text.done": "text",
             "response.function_call_arguments.done": "arguments"}
# The outcome of the continuation, carried onto the first response on the terminal event.
OUTCOME = ("status", "usage", "incomplete_details", "error", "completed_at", "stop_reason", "timings")


class ResponsesCut(Cut):
    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None  # from response.created
        self.items: list[dict[str, Any]] = []  # output items as the client has them
        self.texts: list[str] = []  # per item: its text, reasoning or arguments so far
        self.open: int | None = None
        self.seq = 0  # the next sequence_number
        self.done = False
        self._map: dict[int, int] = {}  # continuation output_index -> the client's
        self._ids: dict[str, str] = {}  # continuation item id -> the client's
        self._continued: int | None = None  # the client's item this continuation goes on with

    def feed(self, event: Event) -> None:
        self.take(*parse(event))

    def take(self, name: str | None, d: Any) -> None:
        """`feed` of an event already parsed."""
        if not isinstance(d, dict):
            return
        if isinstance(d.get("sequence_number"), int):
            self.seq = max(self.seq, d["sequence_number"] + 1)
        if name == "response.created" and isinstance(d.get("response"), dict):
            self.response = copy.deepcopy(d["response"])
        elif name == "response.output_item.added":
            self.items.append(copy.deepcopy(d.get("item") or {}))
            self.texts.append("")
            self.open = len(self.items) - 1
        elif name in ("response.output_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta"):
            self.texts[d["output_index"]] += d.get("delta") or ""
        elif name == "response.output_item.done":
            self.items[d["output_index"]] = copy.deepcopy(d.get("item") or {})
            self.open = None
        elif name in TERMINAL:
            self.done = True

    def body(self, request: dict[str, Any], whole: bool = False) -> dict[str, Any] | None:
        if (self.done and not whole) or self.response is None:
            return None
        given = request.get("input")
        items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        for item, text in zip(self.items, self.texts, strict=True):
            kind = item.get("type")
            if kind == "message":
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            elif kind == "reasoning":
                items.append({"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": text}]})
            elif kind == "function_call":
                call = {"type": "function_call", "call_id": item.get("call_id"), "name": item.get("name"),
                        "arguments": text}
                if item.get("namespace"):
                    call["namespace"] = item["namespace"]
                items.append(call)
        # The continuation is not kept on the node that writes it: the response the client
        # knows is the first node's id, kept whole in the gateway's chain copy.
        return {**request, "input": items, "continue_final_message": True, "store": False}

    def begin(self) -> None:
        self._map, self._ids, self._continued = {}, {}, None

    def rewrite(self, event: Event) -> list[Event]:
        name, d = parse(event)
        if not isinstance(d, dict) or name in ("response.created", "response.in_progress"):
            return [] if isinstance(d, dict) else [event]
        out: list[tuple[str, dict[str, Any]]] = []
        if name == "response.output_item.added":
            item = d.get("item") or {}
            j = d["output_index"]
            if not self._map and self.open is not None and self._goes_on(item):
                self._map[j], self._continued = self.open, self.open
                self._ids[item.get("id", "")] = self.items[self.open].get("id", "")
                return []
            out += self._close()
            self._map[j] = len(self.items)
        elif (name == "response.content_part.added" and self._continued is not None
              and self._map.get(d.get("output_index", -1)) == self._continued):
            return []
        elif name in TERMINAL:
            out += self._close()
            d["response"] = self._final(d.get("response") or {}, closing=self.open)
        if "output_index" in d:
            if d["output_index"] not in self._map:
                return []
            d["output_index"] = self._map[d["output_index"]]
        if isinstance(d.get("item_id"), str):
            d["item_id"] = self._ids.get(d["item_id"], d["item_id"])
        k = d.get("output_index")
        if k is not None and k == self._continued:
            self._whole(name or "", d, k)
        out.append((name or "", d))
        first = self.seq
        return [wire(n, {**e, "sequence_number": first + i}) for i, (n, e) in enumerate(out)]

    def _goes_on(self, item: dict[str, Any]) -> bool:
        assert self.open is not None
        mine = self.items[self.open]
        return item.get("type") == mine.get("type") and (item.get("type") != "function_call" or not item.get("name"))

    def _whole(self, name: str, d: dict[str, Any], k: int) -> None:
        """A done event of the item that went on: the whole of it, not the continuation's part."""
        text = self.texts[k]
        if name in DONE_TEXT:
            d[DONE_TEXT[name]] = text
            if name == "response.function_call_arguments.done":
                d["name"] = self.items[k].get("name")
        elif name == "response.content_part.done" and isinstance(d.get("part"), dict):
            d["part"]["text"] = text
        elif name == "response.output_item.done":
            d["item"] = self._item(k, (d.get("item") or {}).get("status"))

    def _item(self, k: int, status: str | None = None) -> dict[str, Any]:
        item, text = copy.deepcopy(self.items[k]), self.texts[k]
        kind = item.get("type")
        if kind == "message":
            item["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        elif kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif kind == "function_call":
            item["arguments"] = text
        if status is not None and kind != "reasoning":
            item["status"] = status
        return item

    def output(self) -> list[dict[str, Any]]:
        """The output items as the client has them so far (an open one with its text so far)."""
        return [self._item(k) for k in range(len(self.items))]

    def closing(self, status: str) -> list[dict[str, Any]]:
        """The done events of the open item, ended with `status` (a run cut short: "incomplete")."""
        return [e for _, e in self._close(status)]

    def _close(self, status: str = "completed") -> list[tuple[str, dict[str, Any]]]:
        """The done events of the item the client has open, which the continuation moved past."""
        k = self.open
        if k is None:
            return []
        item = self._item(k, status)
        base = {"item_id": item.get("id"), "output_index": k}
        text = self.texts[k]
        events: list[tuple[str, dict[str, Any]]] = []
        if item.get("type") in ("message", "reasoning"):
            done = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            events += [(done, {"type": done, **base, "content_index": 0, "text": text}),
                       ("response.content_part.done", {"type": "response.content_part.done", **base,
                                                       "content_index": 0, "part": item["content"][0]})]
        elif item.get("type") == "function_call":
            events.append(("response.function_call_arguments.done", {
                "type": "response.function_call_arguments.done", **base, "name": item.get("name"),
                "arguments": text}))
        events.append(("response.output_item.done", {"type": "response.output_item.done", "output_index": k,
                                                     "item": item}))
        return events

    def _final(self, theirs: dict[str, Any], closing: int | None) -> dict[str, Any]:
        """The first response, with the continuation's outcome and the whole output."""
        r = copy.deepcopy(self.response or {})
        r.update({k: theirs[k] for k in OUTCOME if k in theirs})
        output = [self._item(k, "completed" if k == closing else None) for k in range(len(self.items))]
        r["output"] = output
        r["output_text"] = "".join(part.get("text") or "" for item in output if item.get("type") == "message"
                                   for part in item.get("content") or [] if part.get("type") == "output_text")
        return r
