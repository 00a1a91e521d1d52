"""Generation: to the proxy (turn/), to the gateway's background runs, or delegated to the node's
protocol layer for openai-kind upstreams (delegate.py); and the per-model calls (count tokens,
tokenize) passed to a node that serves the model."""

from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.responses import Response

from hearth.errors import Unavailable
from hearth.gateway.background import is_background
from hearth.gateway.edge.delegate import Delegate
from hearth.gateway.edge.forward import (
    send,
)
from hearth.gateway.foreign.turn import watched
from hearth.gateway.routing.policy import least_loaded
from hearth.gateway.state import gateway_of
from hearth.gateway.tenancy import caller
from hearth.http.parsing import read_json


async def generate(request: Request) -> Response:
    arrived = time.monotonic()
    body = await read_json(request)
    gw = gateway_of(request.app)
    alias = gw.pool.resolve(body.get("model"))
    if gw.translator is not None and alias in gw.translated:
        return Delegate(gw.translator, json.dumps({**body, "model": alias}).encode(), caller(request),
                        watched(gw.proxy, request, alias, arrived))
    if is_background(request.url.path, body):  # run by the gateway, to survive its node (background.py)
        return await gw.background.create(request, body)
    return await gw.proxy.generate(request, body)


async def by_model(request: Request) -> Response:
    """count_tokens, tokenize, detokenize: any live node that serves the model."""
    gw = gateway_of(request.app)
    pool = gw.pool
    body = await read_json(request)
    alias = pool.resolve(body.get("model")) if body.get("model") is not None else next(iter(pool.aliases()))
    if gw.translator is not None and alias in gw.translated:  # its backend says what it can and cannot count
        return Delegate(gw.translator, json.dumps({**body, "model": alias}).encode(), caller(request))
    now = pool.clock()
    options = [n for n in pool.nodes.values() if alias in n.up.models and n.routable(now) and n.up.kind == "hearth"]
    if not options:
        raise Unavailable(f"no healthy Hearth upstream serves {alias!r}", code="no_healthy_upstream", retry_after=2)
    node = least_loaded(options)
    return await send(request, node, body=json.dumps({**body, "model": node.up.models[alias]}).encode())
