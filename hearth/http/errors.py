"""The one error policy: every error answer of every route, in the envelope of the protocol the
path belongs to, from one table.

    HearthError (hearth/errors.py) ┐
    starlette HTTPException        ├─► ApiError ─► OpenAI    {"error": {message, type, param, code}}
    auth refusal (401 / 403)       │             └► Anthropic {"type": "error", "error": {type, message}}
    anything unexpected (500)      ┘             └► Ollama    {"error": message}  (paths under /api/)

`param` travels as data on the error, never parsed out of its message. Each error answer is
noted for the request's log line (status, code and reason; the request id is on every line).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.errors import ContextLimit, HearthError, TooManyRequests, Unavailable
from hearth.observability.logging import note_error

log = logging.getLogger("hearth.api")

Envelope = Literal["openai", "anthropic", "ollama"]

# status → (OpenAI error type, Anthropic error type): the types each protocol's SDKs map to
# their exception classes. A HearthError's own `type` (or its code's, OPENAI_TYPE_BY_CODE) wins
# on the OpenAI side.
TABLE: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    409: ("conflict_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
    529: ("server_error", "overloaded_error"),
}


# Codes whose OpenAI type is not the error class's: OpenAI answers an unknown model with a 404 of
# type invalid_request_error (its SDKs read `code`), where Anthropic's type stays not_found_error.
OPENAI_TYPE_BY_CODE = {"model_not_found": "invalid_request_error"}


def types_for(status: int) -> tuple[str, str]:
    return TABLE.get(status, ("invalid_request_error", "invalid_request_error") if status < 500
                     else ("server_error", "api_error"))


@dataclass(frozen=True, slots=True)
class ApiError:
    status: int
    message: str
    code: str | None = None
    param: str | None = None
    openai_type: str | None = None  # None: the table's type for the status
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, e: HearthError, protocol: Envelope = "openai") -> ApiError:
        retry_after = e.retry_after if isinstance(e, TooManyRequests | Unavailable) else None
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        message = anthropic_context_message(e) if protocol == "anthropic" and isinstance(e, ContextLimit) else e.message
        return cls(e.status, message, e.code, e.param, OPENAI_TYPE_BY_CODE.get(e.code, e.type), headers)

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.openai_type or types_for(self.status)[0],
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": types_for(self.status)[1], "message": self.message}}

    def body(self, protocol: Envelope) -> dict[str, Any]:
        if protocol == "ollama":
            return {"error": self.message}
        return self.anthropic_body() if protocol == "anthropic" else self.openai_body()


def anthropic_context_message(e: ContextLimit) -> str:
    """Anthropic's own wording: Claude Code reads the numbers back and retries with a smaller
    max_tokens, or compacts the conversation when the prompt alone is too long."""
    if e.max_tokens is None:
        return f"prompt is too long: {e.n_prompt} tokens > {e.limit - 1} maximum"
    return (f"input length and `max_tokens` exceed context limit: {e.n_prompt} + {e.max_tokens} > {e.limit}, "
            "decrease input length or `max_tokens` and try again")


def protocol_of(path: str) -> Envelope:
    if path.startswith("/api/"):
        return "ollama"
    return "anthropic" if path == "/v1/messages" or path.startswith("/v1/messages/") else "openai"


def respond(path: str, err: ApiError) -> JSONResponse:
    """The error answer for a request to `path`, noted for its log line."""
    note_error(err.status, err.code, err.message)
    return JSONResponse(err.body(protocol_of(path)), status_code=err.status, headers=err.headers)


async def handle_hearth_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HearthError)
    path = request.url.path
    return respond(path, ApiError.of(exc, protocol_of(path)))


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = ApiError(404, f"Unknown endpoint {request.method} {request.url.path}")
    else:
        err = ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    return respond(request.url.path, err)


INTERNAL = ApiError(500, "internal server error", "internal_error")


class UnexpectedErrors:
    """Innermost middleware: an exception nothing else handled becomes a 500 in the path's
    envelope (before the response started), logged with its traceback and the request id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise  # mid-body: the server can only close the connection
            await respond(scope["path"], INTERNAL)(scope, receive, send)
