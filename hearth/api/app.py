"""The ASGI application: routes, middleware, error handlers and the backend's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hearth.api import anthropic, control, openai_chat, openai_completions, openai_responses, web
from hearth.api.auth import AuthMiddleware
from hearth.api.errors import handle_hearth_error, handle_http_exception, handle_unexpected
from hearth.api.sse import ClientGone
from hearth.backends.local import LocalBackend
from hearth.chat.cancel import CancelRegistry
from hearth.config import Settings
from hearth.errors import HearthError
from hearth.observability.logging import RequestIdMiddleware
from hearth.observability.metrics import Metrics


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody is listening; nginx's "client closed request"


def create_app(backend: LocalBackend, settings: Settings | None = None) -> Starlette:
    settings = settings or Settings()
    metrics = Metrics(backend)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Load in the background: the port opens at once and /health says 503 until ready.
        loading = asyncio.create_task(backend.start())
        try:
            yield
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await backend.stop()

    routes = [
        Route("/v1/chat/completions", openai_chat.chat_completions, methods=["POST"]),
        Route("/chat/completions", openai_chat.chat_completions, methods=["POST"]),
        Route("/v1/completions", openai_completions.completions, methods=["POST"]),
        Route("/completions", openai_completions.completions, methods=["POST"]),
        Route("/v1/messages", anthropic.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
        # Anthropic's envelope for the other methods (405) and unknown /v1/messages/… paths (404).
        Route("/v1/messages", anthropic.unrouted, methods=anthropic.ALL_METHODS),
        Route("/v1/messages/{rest:path}", anthropic.unrouted, methods=anthropic.ALL_METHODS),
        Route("/v1/responses", openai_responses.create_response, methods=["POST"]),
        Route("/responses", openai_responses.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", openai_responses.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", openai_responses.delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", openai_responses.cancel_response, methods=["POST"]),
        Route("/v1/cancel", control.cancel, methods=["POST"]),
        Route("/v1/models", control.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", control.get_model, methods=["GET"]),
        Route("/health", control.health, methods=["GET"]),
        Route("/tokenize", control.tokenize, methods=["POST"]),
        Route("/detokenize", control.detokenize, methods=["POST"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/", web.index, methods=["GET"]),
        Route("/web/{name}", web.static_file, methods=["GET"]),
    ]
    endpoints = {r.path for r in routes if "{" not in r.path}
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(RequestIdMiddleware, count=metrics.requests, endpoints=endpoints),
            Middleware(AuthMiddleware, settings=settings),
        ],
        exception_handlers={
            HearthError: handle_hearth_error,
            HTTPException: handle_http_exception,
            ClientGone: _client_gone,
            Exception: handle_unexpected,
        },
    )
    app.state.backend = backend
    app.state.settings = settings
    cancels = CancelRegistry()
    metrics.runs_registered.set_function(lambda: len(cancels))
    metrics.cancels_pending.set_function(lambda: cancels.pending)
    app.state.cancels = cancels
    app.state.metrics = metrics
    return app
