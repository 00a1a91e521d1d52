"""One batch line as a request the node makes to itself: an ASGI call of the node's own app,
middleware included, so it takes exactly the path an HTTP request takes (body checks, tools,
the caller's tenant and its key's limits, usage accounting, request ids and logs). Only the
key check is different: the caller is the one recorded when the batch was created
(`INPROCESS_CALLER`, hearth/http/auth.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from hearth.http.auth import INPROCESS_CALLER
from hearth.tenants import Caller


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    request_id: str | None
    body: Any  # the parsed JSON body, or the text when it is not JSON
    retry_after: str | None = None


async def call(app: ASGIApp, who: Caller, url: str, body: dict[str, Any]) -> Answer:
    """POST `body` to `url` on `app` as `who`; the whole answer."""
    payload = json.dumps(body).encode()
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": url, "raw_path": url.encode(), "root_path": "",
        "query_string": b"", "client": ("127.0.0.1", 0), "server": ("hearth-batch", 0),
        "headers": [(b"host", b"hearth-batch"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode())],
        "state": {}, INPROCESS_CALLER: who,
    }
    sent = False
    finished = asyncio.Event()
    status, headers, chunks = 500, {}, []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await finished.wait()  # nobody disconnects: the request's client waits to the end
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    raw = b"".join(chunks)
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return Answer(status, headers.get("x-request-id"), parsed, headers.get("retry-after"))
