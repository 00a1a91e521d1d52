"""Ollama's native API (`/api/*`) and embeddings (`/v1/embeddings`) through the gateway.

- Generation and embeddings (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`,
  `/v1/embeddings`) are turns (turn/proxy.py), as the OpenAI and Anthropic endpoints are: routed
  to a Hearth node that serves the model (prefix and conversation-key affinity, in-flight caps,
  breakers), the model renamed to the node's id on the way in and back to the client's name on
  the way out, retried on another node when one fails before the first byte, and counted: one
  row each in the gateway's usage ledger and, with tracing on, the gateway's spans with the
  trace carried to the node (turn/watch.py). NDJSON is relayed whole lines at a time; a stream
  whose node fails after the first line goes on on another node (failover/cuts/ollama.py: the
  client's stream continues where it was cut, its final object counting the whole answer).
  Ollama's tags are accepted: `name:latest` is the alias `name`, `name:tag` also `name-tag`.
- `/api/show` goes to a node that serves the model, as it comes.
- `/api/tags` and `/api/ps`: the union of the live Hearth nodes' answers, each model under
  the gateway's alias; `/api/ps` says which node holds each loaded copy (`node`).
- `/api/version` answers here. `/api/pull` and `/api/delete` are refused with a 400: a
  gateway routes the models its fleet configuration names, and installs none.
- openai-kind upstreams do not speak this API: they are never chosen for it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hearth.errors import BadRequest, NotFound
from hearth.gateway.edge.forward import live
from hearth.gateway.fleet.pool import Node, Pool
from hearth.gateway.protocols import ollama_renamer
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.state import gateway_of
from hearth.gateway.tenancy import caller
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.headers import forwarded_headers, upstream_headers
from hearth.http.parsing import read_json
from hearth.protocols import ollama_names as names
from hearth.protocols.ollama_wire import OLLAMA_API_VERSION, hearth_version

# The paths served as turns (turn/proxy.py: failover, ledger, traces).
TURNS = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/v1/embeddings")


def resolve(pool: Pool, name: object) -> str:
    """The alias an Ollama name stands for (names.candidates), else the pool's own answer (the
    default model, or its 404)."""
    aliases = pool.aliases()
    if isinstance(name, str):
        for candidate in names.candidates(name):
            if candidate in aliases:
                return candidate
        if name and pool.settings.default_model is None:
            raise NotFound(f'model "{name}" not found, try pulling it first', param="model", code="model_not_found")
    return pool.resolve(name)


def _not_hearth(pool: Pool) -> set[str]:
    return {n.name for n in pool.nodes.values() if n.up.kind != "hearth"}


async def turn(request: Request) -> Response:
    gw = gateway_of(request.app)
    body = await read_json(request)
    alias = resolve(gw.pool, body.get("model"))
    one = await gw.proxy.turn(request, {**body, "model": alias})
    one.avoid = frozenset(_not_hearth(gw.pool))
    return await gw.proxy.serve(one)


async def show(request: Request) -> Response:
    """/api/show: to a node that serves the model (any live Hearth one), its answer as it comes."""
    gw = gateway_of(request.app)
    pool = gw.pool
    body = await read_json(request)
    key = "name" if not body.get("model") else "model"
    alias = resolve(pool, body.get(key))
    tried = _not_hearth(pool)
    while True:
        lease = await pool.acquire(alias, Affinity("none"), (), 0, exclude=tried)  # 503 once none is left
        node = lease.node
        model_id = node.up.models[alias]
        headers = {**forwarded_headers(request), **upstream_headers(node.up, caller(request)),
                   "content-type": "application/json"}
        try:
            r = await gw.client.post(node_url(node.up, request.url.path), content=json.dumps({**body, key: model_id}),
                                     headers=headers, timeout=httpx.Timeout(
                                         gw.settings.stall_timeout_for(node.up) or None,
                                         connect=gw.settings.connect_timeout))
        except httpx.HTTPError:
            pool.release(lease, False)
            tried.add(node.name)
            continue
        if r.status_code >= 500:
            pool.release(lease, False)
            tried.add(node.name)
            continue
        pool.release(lease, True if r.status_code < 400 else None)
        answer = Response(ollama_renamer(model_id, alias)(r.content), status_code=r.status_code,
                          media_type=r.headers.get("content-type"))
        answer.headers["X-Hearth-Upstream"] = node.name
        return answer


async def _each_node(request: Request, path: str) -> list[tuple[Node, list[dict[str, Any]]]]:
    gw = gateway_of(request.app)

    async def one(node: Node) -> tuple[Node, list[dict[str, Any]]]:
        try:
            r = await gw.client.get(node_url(node.up, path), headers={**forwarded_headers(request),
                                                                 **upstream_headers(node.up, caller(request))},
                                    timeout=gw.settings.digest_timeout)
            models = r.json().get("models") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            models = None
        return node, [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []

    return list(await asyncio.gather(*(one(n) for n in live(gw.pool))))


def _as_alias(entry: dict[str, Any], alias: str) -> dict[str, Any]:
    return {**entry, "name": names.tagged(alias), "model": names.tagged(alias)}


async def tags(request: Request) -> Response:
    gw = gateway_of(request.app)
    answers = await _each_node(request, "/api/tags")
    out = []
    for alias in gw.pool.aliases():
        found = next((m for node, models in answers for m in models
                      if alias in node.up.models and m.get("name") == names.tagged(node.up.models[alias])), None)
        out.append(_as_alias(found, alias) if found is not None else {
            "name": names.tagged(alias), "model": names.tagged(alias), "modified_at": names.from_epoch(gw.started),
            "size": 0, "digest": "", "details": {"format": "gguf"}})
    return JSONResponse({"models": out})


async def ps(request: Request) -> Response:
    out = []
    for node, models in await _each_node(request, "/api/ps"):
        by_id = {names.tagged(mid): alias for alias, mid in node.up.models.items()}
        for m in models:
            alias = by_id.get(str(m.get("name")))
            if alias is not None:
                out.append({**_as_alias(m, alias), "node": node.name})
    return JSONResponse({"models": out})


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION, "hearth": hearth_version()})


async def not_here(request: Request) -> Response:
    raise BadRequest(f"{request.url.path} is not served by a gateway: it routes the models its fleet names and "
                     "installs none; pull or delete on a node", param="model")


def routes() -> list[Route]:
    return [
        *(Route(p, turn, methods=["POST"]) for p in TURNS),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/version", version, methods=["GET"]),
        Route("/api/pull", not_here, methods=["POST"]),
        Route("/api/delete", not_here, methods=["DELETE"]),
    ]

