"""A generation request read into a `Turn`: its model alias, affinity key, the prompt's prefix
hashes, the session it continues (with the gateway's transcript of it) and whose it is. Another
tenant's session or response answers as a node answers an id it does not hold."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from hearth.errors import Conflict, NotFound
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.protocols import Protocol, protocol_of
from hearth.gateway.routing.affinity import Affinity, affinity_of
from hearth.gateway.routing.prefixes import conversation, prefix_hashes
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.tenancy import caller, hidden, owns, session_hidden
from hearth.gateway.turn.watch import TurnWatch
from hearth.gateway.upstream.headers import forwarded_headers
from hearth.http import auth
from hearth.sessions.ids import stored_session_id
from hearth.tenants import OPEN, Caller


@dataclass(slots=True)
class Turn:
    """A generation request as the proxy routes it."""

    path: str
    protocol: Protocol
    body: dict[str, Any]
    alias: str
    affinity: Affinity
    hashes: list[tuple[str, int]]
    prompt_tokens: int
    session_id: str | None
    history: list[Any]  # the gateway's transcript of the session before this turn ([]: none)
    stream: bool
    headers: dict[str, str]
    who: Caller = OPEN  # the client's tenant (tenancy.py): what the node is told, whose records these are
    key: Caller = OPEN  # the client's key, as the key check found it: whose usage this is
    started: float = field(default_factory=time.monotonic)
    watch: TurnWatch | None = None  # its ledger row and spans (watch.py); None: both off
    avoid: frozenset[str] = frozenset()  # nodes never chosen for it (openai-kind ones, for Ollama's API)


async def read_turn(request: Request, body: dict[str, Any], pool: Pool, store: GatewayStore) -> Turn:
    alias = pool.resolve(body.get("model"))
    headers = forwarded_headers(request)
    who = caller(request)
    # Checked here too: the id goes into upstream URLs (history, create, delete). As the node
    # stores it: a tenant's ids are its own namespace (hearth.tenants); nodes take either form.
    sid = stored_session_id(who, body["session_id"]) if body.get("session_id") is not None else None
    if sid is not None:
        body = {**body, "session_id": sid}
    affinity = affinity_of(body, headers)
    if sid is not None and await session_hidden(store, who, sid):  # a node's own answers
        if body.get("session_create") is False:
            raise NotFound(f"session {sid} not found (session_create is false)", param="session_id",
                           code="session_not_found")
        raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
    rid = body.get("previous_response_id")
    if isinstance(rid, str) and await hidden(store, who, "response", rid):
        raise NotFound(f"no stored response with id {rid!r}", param="previous_response_id")
    items = conversation(body)
    saved = await store.transcript(sid) if sid is not None and await owns(store, who, "session", sid) else None
    history = saved[1] if saved is not None else []
    hashes = prefix_hashes(alias, history + items)
    return Turn(request.url.path, protocol_of(request.url.path), body, alias, affinity, hashes,
                hashes[-1][1] if hashes else 1, sid, history, body.get("stream") is True, headers, who,
                auth.caller(request))
