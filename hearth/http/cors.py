"""CORS, for web apps on another origin (a local UI, a browser extension): the same policy on a
node and on the gateway, set by `--cors-origins` / `HEARTH_CORS_ORIGINS` (docs/api.md#cors).

- The origins: a comma-separated list of entries, each `*` (any origin), `loopback` (http and
  https on localhost, 127.0.0.1 and [::1], any port: the default, as Ollama allows local origins),
  an origin (`https://app.example.com`, `http://localhost:5173`) or one with `*` in its host
  (`https://*.example.com`); checked by `hearth.config.check_origins`. `""` turns CORS off: no
  preflight is answered, no header is added.
- A preflight (OPTIONS with `Access-Control-Request-Method`) from an allowed origin is answered
  here with 204 and never reaches the API-key check: browsers send no credentials on a
  preflight. The real request still needs its key; its answer, a 401 included, carries the CORS
  headers so that the page can read the error.
- Allowed origins are echoed (never `*`), with `Vary: Origin`. A disallowed origin gets no CORS
  header at all; its preflight falls through to the API (405), as it would without CORS.
- Allowed request headers: the ones the SDKs send (`ALLOW_HEADERS`) and whatever the preflight
  asks for. Exposed response headers: the ones clients read (`EXPOSE_HEADERS`).

The middleware sits outside every other (api/app.py `assemble`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.config import LOOPBACK

_LOOPBACK_RE = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?"
ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = ("authorization", "x-api-key", "content-type", "accept", "anthropic-version", "anthropic-beta",
                 "anthropic-dangerous-direct-browser-access", "openai-beta", "openai-organization",
                 "openai-project", "x-request-id", "x-session-id", "idempotency-key")  # and those asked for
EXPOSE_HEADERS = "x-request-id, x-hearth-upstream, x-hearth-answer-id, retry-after, openai-processing-ms"
MAX_AGE = "600"  # seconds a browser may cache a preflight's answer


def origin_pattern(origins: Sequence[str]) -> re.Pattern[str] | None:
    """One regex for the allowed origins; None when CORS is off."""
    if not origins:
        return None
    if "*" in origins:
        return re.compile(r".+")
    parts = [_LOOPBACK_RE if o == LOOPBACK else ".*".join(re.escape(p) for p in o.lower().split("*"))
             for o in origins]
    return re.compile("|".join(f"(?:{p})" for p in parts))


def _allowed_headers(requested: str) -> str:
    asked = [h.strip().lower() for h in requested.split(",") if h.strip()]
    return ", ".join(dict.fromkeys([*ALLOW_HEADERS, *asked]))


class CorsMiddleware:
    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        self.app = app
        self.pattern = origin_pattern(origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = None
        if scope["type"] == "http" and self.pattern is not None:
            headers = dict(scope["headers"])
            raw = headers.get(b"origin")
            if raw is not None and self.pattern.fullmatch(raw.decode("latin-1").lower()):
                origin = raw.decode("latin-1")
                if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                    await self._preflight(origin, headers, send)
                    return
        if origin is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                h = MutableHeaders(scope=message)
                h["Access-Control-Allow-Origin"] = origin
                h["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
                h.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, origin: str, headers: dict[bytes, bytes], send: Send) -> None:
        requested = headers.get(b"access-control-request-headers", b"").decode("latin-1")
        out = [("access-control-allow-origin", origin), ("access-control-allow-methods", ALLOW_METHODS),
               ("access-control-allow-headers", _allowed_headers(requested)),
               ("access-control-max-age", MAX_AGE), ("vary", "Origin")]
        if headers.get(b"access-control-request-private-network") == b"true":  # a public page calling a local one
            out.append(("access-control-allow-private-network", "true"))
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(k.encode(), v.encode("latin-1")) for k, v in out]})
        await send({"type": "http.response.body", "body": b""})
