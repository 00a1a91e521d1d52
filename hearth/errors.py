"""The error hierarchy, independent of protocol. Each API module maps it to its own envelope.

    HearthError (status, code)
    ├── BadRequest          400  invalid_request_error
    │   ├── ContextLimit    400  context_length_exceeded
    │   └── PayloadTooLarge 413  request_too_large
    ├── Unauthorized        401  invalid_api_key
    ├── Forbidden           403  insufficient_permissions
    ├── NotFound            404  not_found (model_not_found, ...)
    ├── Conflict            409  conflict
    ├── TooManyRequests     429  rate_limit_exceeded
    ├── GenerationFailed    500  generation_failed (the engine failed mid-run)
    └── Unavailable         503  unavailable (model still loading, shutting down)

Each carries `param` (the offending request field) as data. `hearth.http.errors` maps the tree
to each protocol's envelope.
"""

from __future__ import annotations


class HearthError(Exception):
    status = 500
    code = "internal_error"
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class BadRequest(HearthError):
    status = 400
    code = "invalid_request_error"
    type = "invalid_request_error"


class ContextLimit(BadRequest):
    """The prompt, or the prompt plus max_tokens, does not fit the context. The numbers let each
    protocol word it its own way (Claude Code, for one, lowers max_tokens when Anthropic's
    wording tells it by how much)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, n_prompt: int, limit: int, max_tokens: int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.n_prompt, self.limit, self.max_tokens = n_prompt, limit, max_tokens


class PayloadTooLarge(BadRequest):
    status = 413
    code = "request_too_large"


class Unauthorized(HearthError):
    status = 401
    code = "invalid_api_key"
    type = "authentication_error"


class Forbidden(HearthError):
    status = 403
    code = "insufficient_permissions"
    type = "permission_error"


class NotFound(HearthError):
    status = 404
    code = "not_found"
    type = "not_found_error"


class Conflict(HearthError):
    status = 409
    code = "conflict"
    type = "conflict_error"


class TooManyRequests(HearthError):
    status = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int = 1, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(HearthError):
    status = 503
    code = "unavailable"
    type = "server_error"

    def __init__(self, message: str, *, retry_after: int | None = None, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class GenerationFailed(HearthError):
    """The engine failed while generating (a decode or sampler failure). A response not yet
    started answers 500 with this; a started stream ends with its protocol's in-band error."""

    status = 500
    code = "generation_failed"
    type = "server_error"
