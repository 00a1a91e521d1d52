"""Ending a stream that broke mid-way, in the client's protocol, so no client waits for a
terminal event that never comes:

    chat / completions   data: {"error": {...}}  then  data: [DONE]
    Anthropic Messages   event: error
    Responses            event: response.failed (the response from response.created, status failed)

Also: what marks a stream as properly ended, per protocol (a stream that closes without it
broke, even if the connection closed cleanly). And the SSE events as the gateway reads them:
`parse` one event into (name, data), `wire` one back (the stream cuts and background runs use them)."""

from __future__ import annotations

import json
from typing import Any, Literal

from hearth.http.sse import DONE, json_bytes, sse_data, sse_event
from hearth.protocols.anthropic_events import error_event

Event = bytes  # one SSE event, without its blank line

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
