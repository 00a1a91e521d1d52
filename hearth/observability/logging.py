"""Request ids on every log line, and text or JSON log output."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
# The error answer of the current request, for its log line: (status, code, reason). A mutable
# holder, so a handler running in a copied context (a task group) still reaches it.
_error: contextvars.ContextVar[list[tuple[int, str | None, str]] | None] = contextvars.ContextVar(
    "http_error", default=None)

_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "request_id": getattr(record, "request_id", "-"), "message": record.getMessage()}
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # we log requests ourselves


def note_error(status: int, code: str | None, reason: str) -> None:
    """Record why the current request gets an error answer (its log line says so)."""
    holder = _error.get()
    if holder is not None:
        holder.append((status, code, reason))


class RequestIdMiddleware:
    """Honours a well-formed `x-request-id` or makes one, echoes it on the response, binds it to
    every log line of the request, and counts requests by endpoint and status. Each request gets
    one log line; an error answer's line carries its code and reason (WARNING for a 5xx but 503)."""

    def __init__(self, app: ASGIApp, count: object | None = None, endpoints: set[str] | None = None) -> None:
        self.app = app
        self.count = count
        self.endpoints = endpoints or set()
        self.log = logging.getLogger("hearth.http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _VALID_ID.match(given) else f"req_{uuid.uuid4().hex[:24]}"
        token = request_id.set(rid)
        errors: list[tuple[int, str | None, str]] = []
        error_token = _error.set(errors)
        status = [500]
        t0 = time.monotonic()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            endpoint = path if path in self.endpoints else "other"
            if self.count is not None:
                self.count.labels(endpoint, str(status[0])).inc()  # type: ignore[attr-defined]
            ms = 1000 * (time.monotonic() - t0)
            if status[0] < 400:
                self.log.info("%s %s %d %.1fms", scope["method"], path, status[0], ms)
            else:
                _, code, reason = errors[-1] if errors else (status[0], None, "no reason recorded")
                # 503 is an expected state (loading, shutting down) that clients poll through
                level = logging.WARNING if status[0] >= 500 and status[0] != 503 else logging.INFO
                self.log.log(level, "%s %s %d %.1fms %s: %s",
                             scope["method"], path, status[0], ms, code or "error", reason)
            _error.reset(error_token)
            request_id.reset(token)
