"""The Starlette app a node and the gateway both serve: their routes behind one middleware stack
(CORS, request ids, API keys, key limits, the error policy) and one set of error handlers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hearth.errors import HearthError
from hearth.http.access import AccessSettings
from hearth.http.auth import AuthMiddleware
from hearth.http.cors import CorsMiddleware
from hearth.http.errors import UnexpectedErrors, handle_hearth_error, handle_http_exception
from hearth.http.key_usage import KeyAccounts, KeyLimitMiddleware
from hearth.http.sse import ClientGone
from hearth.observability.logging import RequestIdMiddleware, note_error


async def _client_gone(request: Request, exc: Exception) -> Response:
    note_error(499, "client_gone", "the client disconnected before the response was ready")
    return Response(status_code=499)  # nobody is listening; nginx's "client closed request"


def assemble(routes: list[Route], lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
             requests: object, access: AccessSettings, accounts: KeyAccounts | None = None) -> Starlette:
    """The Starlette app a node and the gateway share: CORS as `access.cors_origins` says (outside
    the key check, so a preflight needs no key), request ids (counted in `requests`), API keys as
    `access` says (with a gateway's join key for its fleet), each key's limits (`accounts`;
    None: none), and the one error policy of `hearth.http.errors`."""
    endpoints = {r.path for r in routes if "{" not in r.path}
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(CorsMiddleware, origins=access.cors_origins),
            Middleware(RequestIdMiddleware, count=requests, endpoints=endpoints),
            Middleware(AuthMiddleware, access=access),
            Middleware(KeyLimitMiddleware, accounts=accounts),
            Middleware(UnexpectedErrors),
        ],
        exception_handlers={
            HearthError: handle_hearth_error,
            HTTPException: handle_http_exception,
            ClientGone: _client_gone,
        },
    )
