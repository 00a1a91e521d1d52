"""The one error policy: each error, in the envelope of the protocol its path belongs to."""

from __future__ import annotations

import pytest

from hearth.errors import BadRequest, Conflict, GenerationFailed, HearthError, NotFound, TooManyRequests, Unavailable
from hearth.http.errors import ApiError, protocol_of, types_for


@pytest.mark.parametrize(("exc", "status", "openai_type", "anthropic_type"), [
    (BadRequest("bad", param="messages"), 400, "invalid_request_error", "invalid_request_error"),
    (NotFound("no model"), 404, "not_found_error", "not_found_error"),
    (Conflict("busy"), 409, "conflict_error", "invalid_request_error"),
    (TooManyRequests("full"), 429, "rate_limit_error", "rate_limit_error"),
    (GenerationFailed("decode failed"), 500, "server_error", "api_error"),
    (HearthError("boom"), 500, "server_error", "api_error"),
    (Unavailable("loading"), 503, "server_error", "overloaded_error"),
])
def test_every_error_has_both_envelopes(exc: HearthError, status: int, openai_type: str,
                                        anthropic_type: str) -> None:
    err = ApiError.of(exc)
    assert err.status == status
    assert err.openai_body() == {"error": {"message": exc.message, "type": openai_type, "param": exc.param,
                                           "code": exc.code}}
    assert err.anthropic_body() == {"type": "error", "error": {"type": anthropic_type, "message": exc.message}}


def test_param_is_data_not_message_text() -> None:
    err = ApiError.of(BadRequest("temperature must be between 0 and 100", param="temperature"))
    assert err.openai_body()["error"]["param"] == "temperature"
    assert ApiError.of(BadRequest("temperature is bad")).openai_body()["error"]["param"] is None


def test_rate_limit_keeps_retry_after() -> None:
    assert ApiError.of(TooManyRequests("queue full", retry_after=7)).headers == {"Retry-After": "7"}


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (403, "permission_error"), (404, "not_found_error"),
                                              (413, "request_too_large"), (429, "rate_limit_error"),
                                              (500, "api_error"), (503, "overloaded_error"),
                                              (418, "invalid_request_error"), (502, "api_error")])
def test_anthropic_types_by_status(status: int, kind: str) -> None:
    assert types_for(status)[1] == kind


def test_the_path_picks_the_protocol() -> None:
    assert protocol_of("/v1/messages") == protocol_of("/v1/messages/count_tokens") == "anthropic"
    assert protocol_of("/v1/messagesx") == protocol_of("/v1/chat/completions") == protocol_of("/v1/responses") \
        == "openai"
