"""Messages as JSON (OpenAI-shaped) for the transcript store, history and snapshots."""

from __future__ import annotations

from typing import Any

from hearth.chat.types import ROLES, Message, ToolCall


def message_to_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        out["name"] = m.name
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def message_from_json(d: Any) -> Message:
    """Strict: a transcript read from disk or an archive must have exactly this shape."""
    if not isinstance(d, dict) or d.get("role") not in ROLES:
        raise ValueError("a transcript message needs a role")

    def opt_str(key: str) -> str | None:
        v = d.get(key)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"message {key} must be a string")
        return v

    calls = None
    if d.get("tool_calls"):
        if not isinstance(d["tool_calls"], list):
            raise ValueError("tool_calls must be a list")
        calls = []
        for c in d["tool_calls"]:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError("a tool call needs function.name")
            calls.append(ToolCall(str(c.get("id", "")), fn["name"], str(fn.get("arguments", ""))))
    return Message(role=d["role"], content=opt_str("content"), name=opt_str("name"), tool_calls=calls,
                   tool_call_id=opt_str("tool_call_id"), reasoning=opt_str("reasoning_content"))
