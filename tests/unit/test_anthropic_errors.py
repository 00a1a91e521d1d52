"""Every failure on the Anthropic routes answers in Anthropic's envelope (no model, no server)."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request
from starlette.responses import Response

from hearth.api.anthropic import anthropic_errors
from hearth.api.sse import ClientGone
from hearth.errors import BadRequest, HearthError, NotFound, TooManyRequests, Unavailable


def request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/messages", "headers": [], "query_string": b""})


def raising(exc: BaseException):  # type: ignore[no-untyped-def]
    @anthropic_errors
    async def endpoint(request: Request) -> Response:
        raise exc

    return endpoint


@pytest.mark.parametrize(("exc", "status", "kind"), [
    (BadRequest("bad"), 400, "invalid_request_error"),
    (NotFound("no model"), 404, "not_found_error"),
    (Unavailable("loading"), 503, "overloaded_error"),
    (HearthError("boom"), 500, "api_error"),
    (RuntimeError("secret detail"), 500, "api_error"),
])
async def test_errors_use_anthropics_envelope(exc: Exception, status: int, kind: str) -> None:
    r = await raising(exc)(request())
    assert r.status_code == status
    body = json.loads(bytes(r.body))
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert "secret" not in body["error"]["message"]


async def test_rate_limit_keeps_retry_after() -> None:
    r = await raising(TooManyRequests("queue full", retry_after=7))(request())
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert json.loads(bytes(r.body))["error"] == {"type": "rate_limit_error", "message": "queue full"}


async def test_a_departed_client_is_not_an_error_response() -> None:
    with pytest.raises(ClientGone):
        await raising(ClientGone())(request())
