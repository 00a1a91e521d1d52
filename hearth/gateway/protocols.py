"""Ending a stream that broke mid-way, in the client's protocol, so no client waits for a
terminal event that never comes:

    chat / completions   data: {"error": {...}}  then  data: [DONE]
    Anthropic Messages   event: error
    Responses            event: response.failed (the response from response.created, status failed)

Also: what marks a stream as properly ended, per protocol (a stream that closes without it
broke, even if the connection closed cleanly)."""

from __future__ import annotations

import json
from typing import Any, Literal

from hearth.api.anthropic.stream import error_event
from hearth.api.http.sse import DONE, sse_data, sse_event

Protocol = Literal["chat", "completions", "anthropic", "responses", "other"]

TERMINAL_MARKERS: dict[Protocol, tuple[bytes, ...]] = {
    "chat": (b"data: [DONE]",),
    "completions": (b"data: [DONE]",),
    "anthropic": (b"event: message_stop", b"event: error"),
    "responses": (b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    "other": (),
}


def protocol_of(path: str) -> Protocol:
    if path in ("/v1/chat/completions", "/chat/completions"):
        return "chat"
    if path in ("/v1/completions", "/completions"):
        return "completions"
    if path == "/v1/messages":
        return "anthropic"
    if path in ("/v1/responses", "/responses"):
        return "responses"
    return "other"


def is_terminal(protocol: Protocol, event: bytes) -> bool:
    return event.startswith(TERMINAL_MARKERS[protocol]) if TERMINAL_MARKERS[protocol] else False


def first_response(event: bytes) -> dict[str, Any] | None:
    """The response object of a Responses `response.created` event, if `event` is one."""
    if not event.startswith(b"event: response.created"):
        return None
    try:
        data = json.loads(event.split(b"data: ", 1)[1])
    except (IndexError, ValueError):
        return None
    r = data.get("response") if isinstance(data, dict) else None
    return r if isinstance(r, dict) else None


def terminal_error(protocol: Protocol, message: str, *, response: dict[str, Any] | None = None,
                   sequence_number: int = 0) -> bytes:
    if protocol == "anthropic":
        return error_event(message, "api_error")
    if protocol == "responses":
        r = {**(response or {"object": "response"}), "status": "failed",
             "error": {"code": "server_error", "message": message}}
        return sse_event("response.failed", {"type": "response.failed", "response": r,
                                             "sequence_number": sequence_number})
    return sse_data({"error": {"message": message, "type": "server_error", "param": None,
                               "code": "upstream_failed"}}) + DONE
