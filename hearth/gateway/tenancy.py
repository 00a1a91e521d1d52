"""Tenants through the gateway (docs/gateway.md, "Tenants"): who a request is for, what the
gateway sends a node for it, and whose the gateway's own records are.

The gateway checks its clients' keys as a node does (the same key file format, the same
`Caller`, hearth/http/auth.py) and never forwards them: every node gets the upstream's own key.
For a tenant's request that key goes with `X-Hearth-Tenant` (`upstream/headers.py: upstream_headers`),
which a node believes only from a key its key file marks `role=gateway`: the node then scopes
sessions, snapshots, responses, the prompt cache and usage to that tenant as if the tenant's own
key had called. The gateway's admin key acts upstream with the upstream's admin key (the node's
admin sees everything).

Tenants are carried when the gateway has a key file (`--api-key-file`, `GatewaySettings.tenants`).
A gateway without one (no keys, or only `--api-key` flags) is one tenant, as it always was: it
sends the upstream's key alone, and its keys are counted and limited, nothing more.

The gateway's own records (session bindings and transcripts, stored response chains,
background responses) are owned as on a node (`GatewayStore.set_owner` / `owner_of`): a
caller that does not see the owner gets the 404 a missing id gets. A record without an owner
predates tenants: the admin's.
"""

from __future__ import annotations

from starlette.requests import Request

from hearth.gateway.routing.affinity import key_of
from hearth.gateway.store.base import GatewayStore
from hearth.http import auth
from hearth.tenants import ADMIN, ADMIN_CALLER, OPEN, Caller


def owner_caller(owner: str | None, tenants: bool) -> Caller:
    """Who the gateway acts as for its own calls about an object of `owner` (a transcript's
    replay, a copy, a move): the owner itself, so what it creates on a node is the owner's.
    `tenants`: the gateway carries tenants (else OPEN: the upstream's key, as before)."""
    if not tenants:
        return OPEN
    if owner is None or owner == ADMIN:
        return ADMIN_CALLER
    return Caller(owner, "gateway")  # a key name: not OPEN; the tenant's cache namespace


async def hidden(store: GatewayStore, who: Caller, kind: str, object_id: str) -> bool:
    """A record of another tenant's: `who` gets the 404 a missing id gets. An id without a
    recorded owner is not hidden here (a node answers for what it holds, scoped by the tenant
    header; a new id is anyone's to create)."""
    if who.admin:
        return False
    owner = await store.owner_of(kind, object_id)
    return owner is not None and not who.sees(owner)


async def session_hidden(store: GatewayStore, who: Caller, sid: str) -> bool:
    """`hidden` for a session id, which a session deleted through the gateway frees (its owner
    stays recorded, its binding and transcript do not)."""
    if not await hidden(store, who, "session", sid):
        return False
    return await store.node_of(key_of("session", sid)) is not None or await store.transcript(sid) is not None


async def owns(store: GatewayStore, who: Caller, kind: str, object_id: str) -> bool:
    """Whether `who` may use the gateway's own copy of `object_id` (a transcript, a chain, a
    background response): one without an owner predates tenants and is the admin's."""
    if who.admin:
        return True
    owner = await store.owner_of(kind, object_id)
    return who.sees(owner if owner is not None else ADMIN)


def caller(request: Request) -> Caller:
    """Who the gateway acts for: the key check's caller on a gateway with tenants; else OPEN
    (every client one tenant, the gateway's own key upstream, as before tenants)."""
    gateway = getattr(request.app.state, "gateway", None)
    tenants = getattr(getattr(gateway, "settings", None), "tenants", False)
    return auth.caller(request) if tenants else OPEN
