"""`GET /admin/keys/usage`: each API key's usage and limits (docs/api.md, "Usage and limits per
key"), by name and tenant, never the key itself. `POST /admin/keys/reload`: the key file read
again and put in force (hearth/http/keyring.py), answering what changed in counts. Under /admin:
the admin key's when one is set."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.http.key_usage import KeyAccounts
from hearth.http.keyring import LiveKeys


async def usage(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": node(request).keys.usage()})


def usage_of(accounts: KeyAccounts) -> Callable[[Request], Awaitable[Response]]:
    """The same endpoint over other accounts (the gateway's)."""

    async def endpoint(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": accounts.usage()})

    return endpoint


def reload_of(live: LiveKeys) -> Callable[[Request], Awaitable[Response]]:
    """`POST /admin/keys/reload` over `live` (a node's keys or the gateway's): no body is read.
    Synchronous on the event loop from the read to the swap, so two reloads never interleave."""

    async def endpoint(request: Request) -> Response:
        return JSONResponse(live.reload())

    return endpoint
