"""Sessions, snapshots, stored responses and cancel: routed to the node that holds them (forward.py),
the binding and owner recorded in the store."""

from __future__ import annotations

import asyncio
import json

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node_of
from hearth.errors import Conflict, NotFound, Unavailable
from hearth.gateway.edge.common import client_of, pool_of, require_admin, scoped, store_of
from hearth.gateway.edge.delegate import Delegate
from hearth.gateway.edge.forward import (
    aliases,
    as_response,
    call,
    first_found,
    gather_lists,
    holder,
    live,
    relay_stream,
)
from hearth.gateway.fleet.pool import Node
from hearth.gateway.routing.affinity import Affinity, key_of
from hearth.gateway.routing.policy import least_loaded
from hearth.gateway.state import gateway_of
from hearth.gateway.tenancy import caller, hidden, session_hidden
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.headers import upstream_headers
from hearth.http.parsing import read_json, read_json_or_empty
from hearth.sessions.ids import stored_session_id


async def session_route(request: Request) -> Response:
    """/v1/sessions/{id}…: to the node that holds the session."""
    pool = pool_of(request)
    who = caller(request)
    # as the node stores it: a tenant's ids are its own namespace (hearth.tenants)
    sid = stored_session_id(who, request.path_params["session_id"])
    if await session_hidden(store_of(request), who, sid):  # another tenant's: as a node answers a free id
        raise NotFound(f"session {sid} not found", param="session_id", code="session_not_found")
    name = await store_of(request).node_of(key_of("session", sid))
    node = pool.nodes.get(name) if name else None
    delete = request.method == "DELETE"
    if delete and scoped(who):  # the node's admin key sees every tenant's: the caller's sight checked first
        node = await holder(request, [node] if node is not None else live(pool), f"/v1/sessions/{sid}")
        if node is None:
            raise NotFound(f"session {sid} not found", param="session_id", code="session_not_found")
    if node is None:
        node, r = await first_found(request, live(pool), admin=delete)
        if r.status_code < 300:
            await store_of(request).assign(key_of("session", sid), node.name)
            if scoped(who) and await store_of(request).owner_of("session", sid) is None:
                await store_of(request).set_owner("session", sid, who.tenant)  # the node showed it to its owner
    else:  # the node's admin key names a tenant's session by its stored id
        r = await call(request, node, admin=delete, path=f"/v1/sessions/{sid}" if delete else None)
    if request.method == "DELETE" and r.status_code == 200:
        await store_of(request).drop_session(sid)
    elif request.method == "POST" and r.status_code == 200:  # rollback / resize changed the transcript
        saved = await store_of(request).transcript(sid)
        alias = saved[0] if saved else next(iter(node.up.models))
        gateway_of(request.app).proxy.continuity.session_done(node, sid, alias)
    return as_response(r)


async def create_session(request: Request) -> Response:
    pool = pool_of(request)
    body = await read_json_or_empty(request)
    alias = pool.resolve(body.get("model")) if body.get("model") is not None else next(iter(pool.aliases()))
    now = pool.clock()
    options = [n for n in live(pool) if alias in n.up.models and n.routable(now)]
    if not options:
        raise Unavailable(f"no healthy Hearth upstream serves {alias!r}", code="no_healthy_upstream", retry_after=2)
    node = least_loaded(options)
    who = caller(request)
    sid = body.get("session_id")
    if isinstance(sid, str):
        sid = stored_session_id(who, sid)
        if await session_hidden(store_of(request), who, sid):  # as a node answers an id another tenant holds
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        bound = await store_of(request).node_of(key_of("session", sid))
        if bound in pool.nodes and pool.nodes[bound] in options:
            node = pool.nodes[bound]  # the node that holds the id answers for it (409), never a second copy
    r = await call(request, node, body=json.dumps({**body, "model": node.up.models[alias]}).encode())
    if r.status_code == 201:
        created = stored_session_id(who, r.json()["session_id"])
        await store_of(request).assign(key_of("session", created), node.name)
        await store_of(request).set_owner("session", created, who.tenant)
    return as_response(r)


async def list_sessions(request: Request) -> Response:
    return await gather_lists(request)


async def list_snapshots(request: Request) -> Response:
    return await gather_lists(request)


async def snapshot_route(request: Request) -> Response:
    """/v1/snapshots/{id}…: to whichever node holds the snapshot."""
    pool = pool_of(request)
    who = caller(request)
    destructive = request.method == "DELETE" or await _forced_load(request)
    if destructive:
        require_admin(request)  # the node's admin key goes upstream only for the gateway's admin
    loading = request.url.path.endswith("/load")
    if loading and scoped(who):  # a session id another tenant holds: a node's own answer
        target = (await read_json_or_empty(request)).get("session_id")
        if isinstance(target, str) and await session_hidden(store_of(request), who, stored_session_id(who, target)):
            raise Conflict(f"session {target} already exists", param="session_id", code="session_exists")
    if destructive and scoped(who):  # the node's admin key sees every tenant's: the caller's sight first
        snap = request.path_params["snapshot_id"]
        found = await holder(request, live(pool), f"/v1/snapshots/{snap}")
        if found is None:
            raise NotFound(f"snapshot {snap} not found", param="snapshot_id", code="snapshot_not_found")
        node, r = found, await call(request, found, admin=True)
    else:
        node, r = await first_found(request, live(pool), admin=destructive)
    if loading and r.status_code == 201:
        named = (await read_json_or_empty(request)).get("session_id")
        # The node names it as its caller sees it. Its admin key (a forced load) sees stored ids,
        # which a gateway without tenants does not use: it keys the session as its client named it.
        answered = named if isinstance(named, str) and not pool.settings.tenants else r.json()["session_id"]
        sid = stored_session_id(who, answered)
        await store_of(request).assign(key_of("session", sid), node.name)
        if scoped(who):  # the loaded session is the snapshot's owner's: the caller's, who sees it
            await store_of(request).set_owner("session", sid, who.tenant)
    return as_response(r)


async def _forced_load(request: Request) -> bool:
    """A snapshot load with `force: true` replaces a session: destructive, as on a node."""
    if request.method != "POST" or not request.url.path.endswith("/load"):
        return False
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return False  # the node answers the malformed body with its 400
    return isinstance(body, dict) and body.get("force") is True


async def import_snapshot(request: Request) -> Response:
    """The archive goes, streamed (never held whole here), to the least loaded live Hearth node."""
    pool = pool_of(request)
    now = pool.clock()
    options = [n for n in live(pool) if n.routable(now)]
    if not options:
        raise Unavailable("no healthy Hearth upstream to import into", code="no_healthy_upstream", retry_after=2)
    node = least_loaded(options)
    headers = {"content-type": request.headers.get("content-type", "application/x-tar"),
               **upstream_headers(node.up, caller(request))}
    try:
        r = await client_of(request).post(node_url(node.up, "/v1/snapshots/import"), content=request.stream(),
                                        headers=headers, timeout=httpx.Timeout(600, connect=5))
    except httpx.HTTPError as e:
        raise Unavailable(f"upstream {node.name} could not be reached: {type(e).__name__}", code="upstream_failed",
                          retry_after=2) from e
    answer = as_response(r)
    answer.headers["X-Hearth-Upstream"] = node.name
    return answer


async def cancel(request: Request) -> Response:
    """To the session's node when a session is named, else to every live Hearth node. A
    background response the gateway runs is cancelled here (background.py), not by a node."""
    body = await read_json(request)
    pool = pool_of(request)
    sid = body.get("session_id")
    raw = await request.body()
    runs, ours = gateway_of(request.app).background, 0
    if isinstance(rid := body.get("response_id"), str) and await runs.running(rid, caller(request)):
        await runs.cancel(rid)
        ours = 1
        body = {k: v for k, v in body.items() if k != "response_id"}
        if not any(isinstance(body.get(k), str) for k in ("cancel_id", "session_id", "completion_id", "message_id")):
            return JSONResponse({"cancelled": ours})
        raw = json.dumps(body).encode()
    key = key_of("session", caller(request).session_key(sid)) if isinstance(sid, str) else None
    name = await store_of(request).node_of(key) if key is not None else None
    nodes = [pool.nodes[name]] if name in pool.nodes else live(pool)
    answers = await asyncio.gather(*(call(request, n, body=raw) for n in nodes))
    total = ours
    for r in answers:
        if r.status_code >= 400:
            return as_response(r)  # the same validation everywhere: the first refusal speaks for all
        total += int(r.json().get("cancelled", 0))
    translator = gateway_of(request.app).translator
    if translator is not None:  # runs on openai-kind upstreams are registered here, in the gateway
        ids = [v for k in ("completion_id", "response_id", "message_id") if isinstance(v := body.get(k), str)]
        cancel_id = body.get("cancel_id") if isinstance(body.get("cancel_id"), str) else None
        if cancel_id or isinstance(sid, str) or ids:
            total += node_of(translator).cancels.cancel(cancel_id=cancel_id,
                                                     session_id=sid if isinstance(sid, str) else None, ids=ids,
                                                     scope=caller(request).scope)
    return JSONResponse({"cancelled": total})


def _renamed(node: Node, r: httpx.Response) -> Response:
    """A node's answer about a response, naming the model by its alias as relayed answers do."""
    return Response(aliases(node)(r.content), status_code=r.status_code, media_type=r.headers.get("content-type"))


async def response_route(request: Request) -> Response:
    """/v1/responses/{id}…: to the node that produced the response; a background response's
    event stream (`?stream=true`) relayed as it comes. A background response the gateway runs
    is answered here (background.py)."""
    pool = pool_of(request)
    rid = request.path_params["response_id"]
    who = caller(request)
    if await hidden(store_of(request), who, "response", rid) or await hidden(store_of(request), who, "background", rid):
        raise NotFound(f"no stored response with id {rid!r}", param="response_id")
    if (ours := await gateway_of(request.app).background.answer(request)) is not None:
        return ours
    name = await store_of(request).node_of(key_of("response", rid))
    if request.method == "DELETE" and scoped(who):  # with the node's admin key, once the caller is seen to own it
        keeper = await holder(request, [pool.nodes[name]] if name in pool.nodes else live(pool),
                              f"/v1/responses/{rid}")
        if keeper is not None:
            return _renamed(keeper, await call(request, keeper, admin=True))
        if (translator := gateway_of(request.app).translator) is not None:  # a translated model's, perhaps
            return Delegate(translator, b"", who)  # the translating layer acts for the caller: its own only
        raise NotFound(f"no stored response with id {rid!r}", param="response_id")
    streamed = request.method == "GET" and request.query_params.get("stream", "").lower() in ("true", "1")
    if name in pool.nodes:
        if streamed:
            return await relay_stream(request, pool.nodes[name])
        return _renamed(pool.nodes[name], await call(request, pool.nodes[name]))
    if streamed and (owner := await holder(request, live(pool))) is not None:  # asked whole, a stream never ends
        await pool.remember(Affinity("response", request.path_params["response_id"]), owner.name)
        return await relay_stream(request, owner)
    answerer, found = await first_found(request, live(pool)) if live(pool) else (None, None)
    if (found is None or found.status_code == 404) and (translator := gateway_of(request.app).translator) is not None:
        return Delegate(translator, await request.body(), who)  # a translated model's response
    if found is None or answerer is None:
        raise NotFound("no such response", code="response_not_found")
    return _renamed(answerer, found)
