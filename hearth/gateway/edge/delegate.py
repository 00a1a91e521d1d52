"""Handing a gateway request to another ASGI app in the same process: the node's protocol layer
that translates for models on openai-kind upstreams (`foreign/backend.py`). A generation turn
handed so is watched as the gateway's own turns are (`foreign/turn.py`: its ledger row and
spans): the turn is `CURRENT` for the inner app's call, and is told what the client got."""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.gateway.foreign.turn import CURRENT, ForeignTurn
from hearth.http.auth import CALLER
from hearth.observability.logging import request_id
from hearth.tenants import OPEN, Caller


class Delegate(Response):
    """Hands the request, its body replayed, to another ASGI app (the translating protocol
    layer for models on openai-kind upstreams). `who`: the caller the gateway found (tenancy.py);
    the inner app, which has no keys of its own, acts for it (its stored responses, cancels and
    prompt-cache namespaces are that tenant's, hearth/http/auth.py)."""

    def __init__(self, app: ASGIApp, body: bytes, who: Caller = OPEN, turn: ForeignTurn | None = None) -> None:
        self.status_code = 200
        self.background = None
        self.app = app
        self.body = body
        self.who = who
        self.turn = turn

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

        turn = self.turn
        status: int | None = None

        async def send_once(message: Message) -> None:  # the outer app adds the one x-request-id
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", [])
                                                  if k.lower() != b"x-request-id"]}
            elif turn is not None and message["type"] == "http.response.body":
                turn.sent(message.get("body", b""))
            await send(message)

        if turn is None:
            await self.app({**scope, "headers": headers, CALLER: self.who}, replay, send_once)
            return
        token = CURRENT.set(turn)
        try:
            await self.app({**scope, "headers": headers, CALLER: self.who}, replay, send_once)
        except asyncio.CancelledError:
            turn.returned_with(status, gone=True)
            raise
        except BaseException as e:
            turn.returned_with(status or 500, error=type(e).__name__)
            raise
        else:
            turn.returned_with(status)
        finally:
            CURRENT.reset(token)
