"""Ending a stream that broke mid-way, in the client's protocol, so no client waits for a
terminal event that never comes:

    chat / completions   data: {"error": {...}}  then  data: [DONE]
    Anthropic Messages   event: error
    Responses            event: response.failed (the response from response.created, status failed)
    Ollama (NDJSON)      {"error": "..."}  (the line Ollama's clients raise)

Also: what marks a stream as properly ended, per protocol (a stream that closes without it
broke, even if the connection closed cleanly). And the SSE events as the gateway reads them:
`parse` one event into (name, data), `wire` one back (the stream cuts and background runs use them)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

from hearth.http.sse import DONE, json_bytes, sse_data, sse_event
from hearth.protocols import ollama_names as names
from hearth.protocols.anthropic_events import error_event

Event = bytes  # one SSE event, without its blank line

Protocol = Literal["chat", "completions", "anthropic", "responses", "ollama_chat", "ollama_generate", "other"]
OLLAMA: tuple[Protocol, ...] = ("ollama_chat", "ollama_generate")  # NDJSON: one JSON object a line

TERMINAL_MARKERS: dict[Protocol, tuple[bytes, ...]] = {
    "chat": (b"data: [DONE]",),
    "completions": (b"data: [DONE]",),
    "anthropic": (b"event: message_stop", b"event: error"),
    "responses": (b"event: response.completed", b"event: response.incomplete", b"event: response.failed"),
    "ollama_chat": (), "ollama_generate": (),  # is_terminal: the `"done": true` line, or an error line
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
    if path == "/api/chat":
        return "ollama_chat"
    if path == "/api/generate":
        return "ollama_generate"
    return "other"


def is_ndjson(protocol: Protocol) -> bool:
    return protocol in OLLAMA


_DONE = re.compile(rb'"done": ?true')


def is_terminal(protocol: Protocol, event: bytes) -> bool:
    if protocol in OLLAMA:  # the final object, or Ollama's in-band error (a node's own line: compact JSON)
        return event.startswith(b'{"error"') or _DONE.search(event) is not None
    return event.startswith(TERMINAL_MARKERS[protocol]) if TERMINAL_MARKERS[protocol] else False


def is_stream(content_type: str, protocol: Protocol) -> bool:
    """Whether an upstream answer with this content type is the protocol's stream."""
    return content_type.startswith("application/x-ndjson" if protocol in OLLAMA else "text/event-stream")


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
    if protocol in OLLAMA:
        return json_bytes({"error": message}) + b"\n"
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


def renamer(upstream_id: str, alias: str, protocol: Protocol = "other") -> Callable[[bytes], bytes]:
    """Answers name the model as the client did (the alias), not the upstream's id. Ollama's
    answers name it tagged (`<id>:latest`), as `model` (or `name`, /api/show), in compact
    (Hearth's) or spaced JSON: back to the alias, tagged."""
    if protocol in OLLAMA:
        return ollama_renamer(upstream_id, alias)
    if upstream_id == alias:
        return lambda data: data
    old = b'"model":' + json.dumps(upstream_id).encode()
    new = b'"model":' + json.dumps(alias).encode()
    return lambda data: data.replace(old, new)


def ollama_renamer(upstream_id: str, alias: str) -> Callable[[bytes], bytes]:
    old, new = names.tagged(upstream_id), names.tagged(alias)
    if old == new:
        return lambda data: data
    pairs = [(f'"{k}":{sep}{json.dumps(old)}'.encode(), f'"{k}":{sep}{json.dumps(new)}'.encode())
             for k in ("model", "name") for sep in ("", " ")]

    def rename(data: bytes) -> bytes:
        for a, b in pairs:
            data = data.replace(a, b)
        return data

    return rename
