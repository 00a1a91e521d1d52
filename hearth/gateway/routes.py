"""The gateway's endpoints: generation (to the proxy, or delegated to the translating layer for
openai-kind upstreams), models, health, sessions and snapshots (routed to the node that holds
them, `forward.py`), cancel, tokens, admin (status, drain, move)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node_of
from hearth.api.http.auth import matches, presented_key
from hearth.api.http.parsing import read_json, read_json_or_empty
from hearth.errors import BadRequest, Forbidden, NotFound, Unavailable
from hearth.gateway.background import is_background
from hearth.gateway.cache_state import Digest
from hearth.gateway.context import gateway_of
from hearth.gateway.delegate import Delegate
from hearth.gateway.forward import aliases, as_response, call, first_found, gather_lists, live, relay_stream, send
from hearth.gateway.headers import forwarded_headers
from hearth.gateway.model_list import model_cards
from hearth.gateway.pool import Node, Pool
from hearth.gateway.routing import Affinity
from hearth.sessions.ids import check_session_id


def _pool(request: Request) -> Pool:
    return gateway_of(request.app).pool


def _client(request: Request) -> httpx.AsyncClient:
    return gateway_of(request.app).client


# ---- generation -----------------------------------------------------------------------------


async def generate(request: Request) -> Response:
    body = await read_json(request)
    gw = gateway_of(request.app)
    alias = gw.pool.resolve(body.get("model"))
    if gw.translator is not None and alias in gw.translated:
        return Delegate(gw.translator, json.dumps({**body, "model": alias}).encode())
    if is_background(request.url.path, body):  # run by the gateway, to survive its node (background.py)
        return await gw.background.create(request, body)
    return await gw.proxy.generate(request, body)


# ---- models and health ----------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": await model_cards(gateway_of(request.app))})


async def get_model(request: Request) -> Response:
    alias = request.path_params["model"]
    card = next((c for c in await model_cards(gateway_of(request.app)) if c["id"] == alias), None)
    if card is None:
        raise NotFound(f"The model {alias!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(card)


async def health(request: Request) -> Response:
    up = [n.name for n in _pool(request).nodes.values() if n.live.up]
    if up:
        return JSONResponse({"status": "ok", "nodes_up": up})
    return JSONResponse({"status": "error", "error": "no upstream is up"}, status_code=503)


# ---- sessions and snapshots -----------------------------------------------------------------


async def session_route(request: Request) -> Response:
    """/v1/sessions/{id}…: to the node that holds the session."""
    sid = check_session_id(request.path_params["session_id"])
    pool = _pool(request)
    name = pool.store.node_of(f"session:{sid}")
    node = pool.nodes.get(name) if name else None
    if node is None:
        node, r = await first_found(request, live(pool), admin=request.method == "DELETE")
        if r.status_code < 300:
            pool.store.assign(f"session:{sid}", node.name)
    else:
        r = await call(request, node, admin=request.method == "DELETE")
    if request.method == "DELETE" and r.status_code == 200:
        pool.store.forget(f"session:{sid}")
        pool.store.drop_transcript(sid)
    elif request.method == "POST" and r.status_code == 200:  # rollback / resize changed the transcript
        saved = pool.store.transcript(sid)
        alias = saved[0] if saved else next(iter(node.up.models))
        gateway_of(request.app).proxy.continuity.session_done(node, sid, alias)
    return as_response(r)


async def create_session(request: Request) -> Response:
    pool = _pool(request)
    body = await read_json_or_empty(request)
    alias = pool.resolve(body.get("model")) if body.get("model") is not None else next(iter(pool.settings.aliases()))
    now = pool.clock()
    options = [n for n in live(pool) if alias in n.up.models and n.routable(now)]
    if not options:
        raise Unavailable(f"no healthy Hearth upstream serves {alias!r}", code="no_healthy_upstream", retry_after=2)
    node = min(options, key=lambda n: n.in_flight)
    r = await call(request, node, body=json.dumps({**body, "model": node.up.models[alias]}).encode())
    if r.status_code == 201:
        pool.store.assign(f"session:{r.json()['session_id']}", node.name)
    return as_response(r)


async def list_sessions(request: Request) -> Response:
    return await gather_lists(request)


async def list_snapshots(request: Request) -> Response:
    return await gather_lists(request)


async def snapshot_route(request: Request) -> Response:
    """/v1/snapshots/{id}…: to whichever node holds the snapshot."""
    pool = _pool(request)
    destructive = request.method == "DELETE" or await _forced_load(request)
    if destructive:
        _require_admin(request)  # the node's admin key goes upstream only for the gateway's admin
    node, r = await first_found(request, live(pool), admin=destructive)
    if request.url.path.endswith("/load") and r.status_code == 201:
        pool.store.assign(f"session:{r.json()['session_id']}", node.name)
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
    pool = _pool(request)
    now = pool.clock()
    options = [n for n in live(pool) if n.routable(now)]
    if not options:
        raise Unavailable("no healthy Hearth upstream to import into", code="no_healthy_upstream", retry_after=2)
    node = min(options, key=lambda n: n.in_flight)
    headers = {"content-type": request.headers.get("content-type", "application/x-tar"), **node.up.headers()}
    try:
        r = await _client(request).post(node.up.url + "/v1/snapshots/import", content=request.stream(),
                                        headers=headers, timeout=httpx.Timeout(600, connect=5))
    except httpx.HTTPError as e:
        raise Unavailable(f"upstream {node.name} could not be reached: {type(e).__name__}", code="upstream_failed",
                          retry_after=2) from e
    answer = as_response(r)
    answer.headers["X-Hearth-Upstream"] = node.name
    return answer


# ---- cancel and tokens ----------------------------------------------------------------------


async def cancel(request: Request) -> Response:
    """To the session's node when a session is named, else to every live Hearth node. A
    background response the gateway runs is cancelled here (background.py), not by a node."""
    body = await read_json(request)
    pool = _pool(request)
    sid = body.get("session_id")
    raw = await request.body()
    runs, ours = gateway_of(request.app).background, 0
    if isinstance(rid := body.get("response_id"), str) and runs.running(rid):
        await runs.cancel(rid)
        ours = 1
        body = {k: v for k, v in body.items() if k != "response_id"}
        if not any(isinstance(body.get(k), str) for k in ("cancel_id", "session_id", "completion_id", "message_id")):
            return JSONResponse({"cancelled": ours})
        raw = json.dumps(body).encode()
    name = pool.store.node_of(f"session:{sid}") if isinstance(sid, str) else None
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
                                                     session_id=sid if isinstance(sid, str) else None, ids=ids)
    return JSONResponse({"cancelled": total})


def _renamed(node: Node, r: httpx.Response) -> Response:
    """A node's answer about a response, naming the model by its alias as relayed answers do."""
    return Response(aliases(node)(r.content), status_code=r.status_code, media_type=r.headers.get("content-type"))


async def _holder(request: Request, nodes: list[Node]) -> Node | None:
    """The first of `nodes` that holds the response (a plain GET of it answers 200)."""
    gw = gateway_of(request.app)
    for node in nodes:
        with contextlib.suppress(httpx.HTTPError):
            r = await gw.client.get(node.up.url + request.url.path, headers={**forwarded_headers(request),
                                                                              **node.up.headers()}, timeout=30)
            if r.status_code == 200:
                return node
    return None


async def response_route(request: Request) -> Response:
    """/v1/responses/{id}…: to the node that produced the response; a background response's
    event stream (`?stream=true`) relayed as it comes. A background response the gateway runs
    is answered here (background.py)."""
    if (ours := await gateway_of(request.app).background.answer(request)) is not None:
        return ours
    pool = _pool(request)
    name = pool.store.node_of(f"response:{request.path_params['response_id']}")
    streamed = request.method == "GET" and request.query_params.get("stream", "").lower() in ("true", "1")
    if name in pool.nodes:
        if streamed:
            return await relay_stream(request, pool.nodes[name])
        return _renamed(pool.nodes[name], await call(request, pool.nodes[name]))
    if streamed and (owner := await _holder(request, live(pool))) is not None:  # asked whole, a stream never ends
        pool.remember(Affinity("response", request.path_params["response_id"]), owner.name)
        return await relay_stream(request, owner)
    holder, found = await first_found(request, live(pool)) if live(pool) else (None, None)
    translator = gateway_of(request.app).translator
    if (found is None or found.status_code == 404) and translator is not None:
        return Delegate(translator, await request.body())  # a translated model's response
    if found is None or holder is None:
        raise NotFound("no such response", code="response_not_found")
    return _renamed(holder, found)


async def by_model(request: Request) -> Response:
    """count_tokens, tokenize, detokenize: any live node that serves the model."""
    gw = gateway_of(request.app)
    pool = gw.pool
    body = await read_json(request)
    alias = pool.resolve(body.get("model")) if body.get("model") is not None else next(iter(pool.settings.aliases()))
    if gw.translator is not None and alias in gw.translated:  # its backend says what it can and cannot count
        return Delegate(gw.translator, json.dumps({**body, "model": alias}).encode())
    now = pool.clock()
    options = [n for n in pool.nodes.values() if alias in n.up.models and n.routable(now) and n.up.kind == "hearth"]
    if not options:
        raise Unavailable(f"no healthy Hearth upstream serves {alias!r}", code="no_healthy_upstream", retry_after=2)
    node = min(options, key=lambda n: n.in_flight)
    return await send(request, node, body=json.dumps({**body, "model": node.up.models[alias]}).encode())


# ---- admin ----------------------------------------------------------------------------------


def _require_admin(request: Request) -> None:
    admin = _pool(request).settings.admin_key
    if admin and not matches(presented_key(dict(request.scope["headers"])), [admin]):
        raise Forbidden("this operation needs the gateway's admin key")


def _digest_json(pool: Pool, d: Digest | None) -> dict[str, Any] | None:
    """What the gateway knows of a node's cache: the digest's age, whether its reads fail, and
    per model its root and blocks per tier (None: it publishes nothing, or it was dropped)."""
    if d is None:
        return None
    return {"age": round(pool.clock() - d.fetched, 3), "stale": d.stale,
            "models": {mid: {"root": m.root, "blocks": m.counts(), "keys": len(m.keys)} for mid, m in d.models.items()}}


def status_json(pool: Pool) -> dict[str, Any]:
    sessions = pool.store.counts()
    return {"object": "gateway.status", "waiting": pool.waiting, "time": int(time.time()),
            "nodes": [{"name": n.name, "url": n.up.url, "kind": n.up.kind, "up": n.live.up,
                       "last_error": n.live.last_error, "breaker": n.breaker.state, "draining": n.draining,
                       "in_flight": n.in_flight, "max_in_flight": n.up.max_in_flight,
                       "sessions": sessions.get(n.name, 0), "transitions": n.live.transitions,
                       "models": n.up.models, "digest": _digest_json(pool, n.digest)} for n in pool.nodes.values()]}


async def status(request: Request) -> Response:
    _require_admin(request)  # it names the upstreams' addresses: not for every client
    return JSONResponse(status_json(_pool(request)))


async def session_status(request: Request) -> Response:
    """Where the gateway routes a session, and how much of its transcript it holds."""
    _require_admin(request)
    sid = check_session_id(request.path_params["session_id"])
    store = _pool(request).store
    node = store.node_of(f"session:{sid}")
    saved = store.transcript(sid)
    if node is None and saved is None:
        raise NotFound(f"the gateway knows no session {sid!r}", param="session_id", code="session_not_found")
    return JSONResponse({"object": "gateway.session", "session_id": sid, "node": node,
                         "model": saved[0] if saved else None, "transcript_messages": len(saved[1]) if saved else 0})


async def drain(request: Request) -> Response:
    _require_admin(request)
    mover = gateway_of(request.app).mover
    return JSONResponse(await mover.drain(request.path_params["node"]))


async def undrain(request: Request) -> Response:
    _require_admin(request)
    mover = gateway_of(request.app).mover
    return JSONResponse(mover.undrain(request.path_params["node"]))


async def move_session(request: Request) -> Response:
    _require_admin(request)
    body = await read_json_or_empty(request)
    to = body.get("to")
    if to is not None and not isinstance(to, str):
        raise BadRequest("to must be a node name", param="to")
    mover = gateway_of(request.app).mover
    return JSONResponse(await mover.move(check_session_id(request.path_params["session_id"]), to))
