"""Admin: status, a session's status, drain and undrain, a session move, nodes joining and leaving
the fleet and the fleet file reloaded (fleet/membership.py, fleet/moves.py)."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import BadRequest, Forbidden, NotFound
from hearth.gateway.edge.common import pool_of, require_admin, store_of
from hearth.gateway.fleet.cache_state import Digest
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.routing.affinity import key_of
from hearth.gateway.state import gateway_of
from hearth.gateway.store.base import GatewayStore
from hearth.http.auth import matches, presented_key
from hearth.http.parsing import read_json, read_json_or_empty
from hearth.sessions.ids import check_session_id


def _digest_json(pool: Pool, d: Digest | None) -> dict[str, Any] | None:
    """What the gateway knows of a node's cache: the digest's age, whether its reads fail, and
    per model its root and blocks per tier (None: it publishes nothing, or it was dropped)."""
    if d is None:
        return None
    return {"age": round(pool.clock() - d.fetched, 3), "stale": d.stale,
            "models": {mid: {"root": m.root, "blocks": m.counts(), "keys": len(m.keys)} for mid, m in d.models.items()}}


async def status_json(pool: Pool, store: GatewayStore) -> dict[str, Any]:
    sessions = await store.counts()
    return {"object": "gateway.status", "waiting": pool.waiting, "time": int(time.time()),
            "nodes": [{"name": n.name, "url": n.up.url, "kind": n.up.kind, "source": n.source, "lapsed": n.lapsed,
                       "up": n.live.up,
                       "last_error": n.live.last_error, "breaker": n.breaker.state, "draining": n.draining,
                       "in_flight": n.in_flight, "max_in_flight": n.up.max_in_flight,
                       "sessions": sessions.get(n.name, 0), "transitions": n.live.transitions,
                       "models": n.up.models, "digest": _digest_json(pool, n.digest)} for n in pool.nodes.values()]}


async def status(request: Request) -> Response:
    require_admin(request)  # it names the upstreams' addresses: not for every client
    return JSONResponse(await status_json(pool_of(request), store_of(request)))


async def session_status(request: Request) -> Response:
    """Where the gateway routes a session, and how much of its transcript it holds."""
    require_admin(request)
    sid = check_session_id(request.path_params["session_id"])
    store = store_of(request)
    node = await store.node_of(key_of("session", sid))
    saved = await store.transcript(sid)
    if node is None and saved is None:
        raise NotFound(f"the gateway knows no session {sid!r}", param="session_id", code="session_not_found")
    return JSONResponse({"object": "gateway.session", "session_id": sid, "node": node,
                         "model": saved[0] if saved else None, "transcript_messages": len(saved[1]) if saved else 0})


async def drain(request: Request) -> Response:
    gw = gateway_of(request.app)
    name = request.path_params["node"]
    node = gw.pool.nodes.get(name)
    if not (node is not None and node.source == "joined" and _is_join_key(request)):  # a node drains itself
        require_admin(request)
    return JSONResponse(await gw.mover.drain(name))


async def undrain(request: Request) -> Response:
    require_admin(request)
    mover = gateway_of(request.app).mover
    return JSONResponse(await mover.undrain(request.path_params["node"]))


def _is_join_key(request: Request) -> bool:
    join = pool_of(request).settings.join_key
    return bool(join) and matches(presented_key(dict(request.scope["headers"])), [join] if join else [])


def _require_fleet_key(request: Request) -> None:
    """Joining and leaving: the gateway's join key or its admin key (open only on a gateway
    with neither, as its other admin endpoints are)."""
    settings = pool_of(request).settings
    allowed = [k for k in (settings.join_key, settings.admin_key) if k]
    if allowed and not matches(presented_key(dict(request.scope["headers"])), allowed):
        raise Forbidden("joining or leaving the fleet needs the gateway's join key or admin key")


async def fleet_join(request: Request) -> Response:
    _require_fleet_key(request)
    body = await read_json(request)
    return JSONResponse(await gateway_of(request.app).membership.join(body))


async def fleet_leave(request: Request) -> Response:
    _require_fleet_key(request)
    return JSONResponse(await gateway_of(request.app).membership.leave(request.path_params["node"]))


async def fleet_reload(request: Request) -> Response:
    require_admin(request)
    gw = gateway_of(request.app)
    return JSONResponse(await gw.membership.reload(gw.translated))


async def move_session(request: Request) -> Response:
    require_admin(request)
    body = await read_json_or_empty(request)
    to = body.get("to")
    if to is not None and not isinstance(to, str):
        raise BadRequest("to must be a node name", param="to")
    mover = gateway_of(request.app).mover
    return JSONResponse(await mover.move(check_session_id(request.path_params["session_id"]), to))
