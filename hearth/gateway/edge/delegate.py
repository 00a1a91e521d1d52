"""Handing a gateway request to another ASGI app in the same process: the node's protocol layer
that translates for models on openai-kind upstreams (`foreign/backend.py`)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.http.auth import CALLER
from hearth.observability.logging import request_id
from hearth.tenants import OPEN, Caller


class Delegate(Response):
    """Hands the request, its body replayed, to another ASGI app (the translating protocol
    layer for models on openai-kind upstreams). `who`: the caller the gateway found (tenancy.py);
    the inner app, which has no keys of its own, acts for it (its stored responses, cancels and
    prompt-cache namespaces are that tenant's, hearth/http/auth.py)."""

    def __init__(self, app: ASGIApp, body: bytes, who: Caller = OPEN) -> None:
        self.status_code = 200
        self.background = None
        self.app = app
        self.body = body
        self.who = who

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            return await receive()  # the disconnect, when it comes

        # The inner app logs the request too: under the gateway's request id, not a new one.
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"x-request-id", b"content-length")]
        headers.append((b"x-request-id", request_id.get().encode("latin-1")))

        async def send_once(message: Message) -> None:  # the outer app adds the one x-request-id
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                  if k.lower() != b"x-request-id"]}
            await send(message)

        await self.app({**scope, "headers": headers, CALLER: self.who}, replay, send_once)
