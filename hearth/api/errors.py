"""Errors in OpenAI's envelope, and the handlers that guarantee no request ends in a bare 500."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from hearth.errors import HearthError, TooManyRequests

log = logging.getLogger("hearth.api")


def openai_error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def openai_error(e: HearthError) -> JSONResponse:
    headers = {}
    if isinstance(e, TooManyRequests):
        headers["Retry-After"] = str(e.retry_after)
    return JSONResponse(openai_error_body(e.message, e.type, e.code, e.param), status_code=e.status,
                        headers=headers)


async def handle_hearth_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HearthError)
    return openai_error(exc)


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = exc.detail if exc.status_code != 404 else f"Unknown endpoint {request.method} {request.url.path}"
    return JSONResponse(openai_error_body(str(message), type_, None), status_code=exc.status_code,
                        headers=exc.headers)


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(openai_error_body("internal server error", "server_error", "internal_error"),
                        status_code=500)
