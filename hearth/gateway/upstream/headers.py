"""Which headers cross the gateway: the client's that a node may see, and the node's that come
back to the client.

The client's Authorization / x-api-key are never forwarded: each node gets its own key.
"""

from __future__ import annotations

from starlette.requests import Request

from hearth.gateway.upstream.http import Answer
from hearth.http.cache_keys import KEY_HEADERS
from hearth.observability.logging import request_id

# The conversation-key headers (Claude Code's, Codex's) go on too: the node keeps the
# conversation's KV warm by them, and the gateway routes by them.
FORWARD_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "x-request-id",
                   "x-session-id", "idempotency-key", "traceparent", "tracestate", *KEY_HEADERS)


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers a node may see (never its credentials), and the gateway's request id,
    so one id names the request in the gateway's log and the node's."""
    out = {k: v for k, v in request.headers.items() if k in FORWARD_HEADERS}
    rid = request_id.get()
    if rid != "-":
        out["x-request-id"] = rid
    return out


def passed_headers(resp: Answer, node: str) -> dict[str, str]:
    """The upstream's answer headers worth keeping, and which node answered (X-Hearth-Upstream)."""
    kept = {k: v for k, v in resp.headers.items() if k in ("x-request-id", "retry-after", "openai-processing-ms")}
    return {**kept, "X-Hearth-Upstream": node}
