"""GET /v1/models on the gateway: the union of its nodes' models, each alias once, and where
each Hearth node stands with it.

A card per alias (the names clients use; an alias served by several nodes is listed once),
with `nodes`: each node configured for it, the model id it has there, and, for a Hearth node
that answered, that model's status on it (loaded, loading, unloading, unloaded: the node's own
/v1/models). The card's `status.value` is the best of them (loaded before loading before
unloaded), as a node's cards have it, so a client reads one shape from a node and a gateway;
no card has a status when no Hearth node told one (openai-kind nodes only, or none answered).
The nodes are asked at once, each within the digest timeout: a slow node costs its status on
this list, never the list.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import NotFound
from hearth.gateway.edge.common import pool_of
from hearth.gateway.fleet.pool import Node
from hearth.gateway.state import Gateway, gateway_of
from hearth.gateway.upstream.node_client import NodeClient

RANK = {"loaded": 0, "loading": 1, "unloading": 2, "unloaded": 3}  # best first


async def node_statuses(client: NodeClient, node: Node, timeout: float) -> dict[str, str]:
    """Model id (and each of its aliases) -> status on a Hearth node; {} if it did not answer so."""
    try:
        r = await client.models(node.up, timeout)
    except httpx.HTTPError:
        return {}
    data = r.obj.get("data") if r.status == 200 else None
    out: dict[str, str] = {}
    for card in data if isinstance(data, list) else []:
        status = card.get("status") if isinstance(card, dict) else None
        value = status.get("value") if isinstance(status, dict) else None
        if not isinstance(value, str) or value not in RANK:
            continue
        aliases = (card.get("meta") or {}).get("aliases") or []
        for name in [card.get("id"), *aliases]:
            if isinstance(name, str):
                out.setdefault(name, value)
    return out


async def model_cards(gw: Gateway) -> list[dict[str, Any]]:
    asked = [n for n in gw.pool.nodes.values() if n.up.kind == "hearth" and n.live.up]
    answers = await asyncio.gather(*(node_statuses(gw.nodes, n, gw.settings.digest_timeout) for n in asked))
    statuses = {n.name: a for n, a in zip(asked, answers, strict=True)}
    cards = []
    for alias, upstreams in gw.pool.aliases().items():
        nodes = []
        for u in upstreams:
            model = u.models[alias]
            nodes.append({"node": u.name, "model": model, "status": statuses.get(u.name, {}).get(model)})
        card: dict[str, Any] = {"id": alias, "object": "model", "created": gw.started, "owned_by": "hearth-gateway",
                                "nodes": nodes}
        known = [n["status"] for n in nodes if n["status"] is not None]
        if known:
            card["status"] = {"value": min(known, key=RANK.__getitem__)}
        cards.append(card)
    return cards


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": await model_cards(gateway_of(request.app))})


async def get_model(request: Request) -> Response:
    alias = request.path_params["model"]
    card = next((c for c in await model_cards(gateway_of(request.app)) if c["id"] == alias), None)
    if card is None:
        raise NotFound(f"The model {alias!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(card)


async def health(request: Request) -> Response:
    up = [n.name for n in pool_of(request).nodes.values() if n.live.up]
    if up:
        return JSONResponse({"status": "ok", "nodes_up": up})
    return JSONResponse({"status": "error", "error": "no upstream is up"}, status_code=503)
