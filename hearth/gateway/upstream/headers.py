"""Which headers cross the gateway: the client's that a node may see, and the node's that come
back to the client.

The client's Authorization / x-api-key are never forwarded: each node gets its own key.
"""

from __future__ import annotations

from starlette.requests import Request

from hearth.gateway.settings import Upstream
from hearth.gateway.upstream.http import Answer
from hearth.http.cache_keys import KEY_HEADERS
from hearth.observability.logging import request_id
from hearth.protocols.ollama_wire import ANSWER_ID_HEADER
from hearth.tenants import Caller, class_header, tenant_headers

# The conversation-key headers (Claude Code's, Codex's) go on too: the node keeps the
# conversation's KV warm by them, and the gateway routes by them.
FORWARD_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "x-request-id",
                   "x-session-id", "idempotency-key", "traceparent", "tracestate", *KEY_HEADERS)
# A node's answer headers a client gets too (ANSWER_ID_HEADER: the ledger row of an Ollama answer).
_PASSED = ("x-request-id", ANSWER_ID_HEADER, "retry-after", "openai-processing-ms")


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
    kept = {k: v for k, v in resp.headers.items() if k in _PASSED}
    return {**kept, "X-Hearth-Upstream": node}


def upstream_headers(up: Upstream, who: Caller, admin: bool = False) -> dict[str, str]:
    """The node's credentials (and tenant) for a request of `who`. `admin`: an operation the
    node keeps for its admin key (a DELETE, a forced load); for a tenant it goes with the admin
    key only where the upstream has a distinct one, and only after the gateway checked that the
    tenant sees the object (the node's admin key speaks for no tenant)."""
    if who.key_name is None:  # a gateway without keys: the upstream's key, as it always was
        return up.headers(admin)
    if who.admin:
        return up.headers(admin=True)
    if admin and up.admin_key and up.admin_key != up.api_key:
        return up.headers(admin=True)
    # the client key's weight and classes go too: the node's fair share and preemption see the
    # real tenants, not the gateway's one key (capped there by the gateway key's line)
    return {**up.headers(), **tenant_headers(who.tenant, who.shared_cache), **class_header(who)}
