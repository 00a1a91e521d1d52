"""Anthropic Messages stream events both products write themselves (the node's serializer and the
gateway's terminal error when a relayed stream cannot go on)."""

from __future__ import annotations

from hearth.http.sse import sse_event


def error_event(message: str, type_: str = "api_error") -> bytes:
    return sse_event("error", {"type": "error", "error": {"type": type_, "message": message}})
