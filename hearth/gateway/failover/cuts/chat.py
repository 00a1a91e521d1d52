"""The Chat Completions stream cut (cuts/base.py says what a cut is)."""

from __future__ import annotations

from typing import Any

from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.protocols import Event, parse, wire


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
