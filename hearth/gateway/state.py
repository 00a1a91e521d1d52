"""The gateway's parts as its routes see them: one typed, frozen object, built once by the app
factory (`app.create_gateway_app`) and reached from a request through `gateway_of`.

Routes read nothing else from `app.state`: the one attribute `gateway` holds this object, and
only this module names it.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.types import ASGIApp

from hearth.gateway.background import RelayedBackground
from hearth.gateway.batches.runner import GatewayBatches
from hearth.gateway.fleet.membership import Membership
from hearth.gateway.fleet.moves import Mover
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.turn.proxy import Proxy
from hearth.gateway.upstream.node_client import NodeClient


@dataclass(frozen=True, slots=True)
class Gateway:
    settings: GatewaySettings
    pool: Pool
    store: GatewayStore  # the database (the pool keeps its own reference for binding-key reads only)
    proxy: Proxy
    client: httpx.AsyncClient  # routes that pass a client's request through to a node as it is
    nodes: NodeClient  # every other call to a node that is not a generation request
    mover: Mover
    started: int  # unix time the gateway started: `created` of its model cards
    # The node's protocol layer over the openai-kind upstreams, and the aliases it serves
    # (None and empty when no upstream is of that kind).
    translator: Starlette | None
    translated: frozenset[str]
    background: RelayedBackground  # the background responses the gateway runs on Hearth upstreams
    membership: Membership  # nodes joining and leaving, the fleet file reloaded
    batches: GatewayBatches  # the Batch API's runs (its state: `batches.tables`, in the store)


def attach(app: Starlette, gateway: Gateway) -> None:
    app.state.gateway = gateway


def gateway_of(app: ASGIApp) -> Gateway:
    """The gateway `app` serves (`request.app` in a route, `TestClient.app` in a test)."""
    gateway = getattr(getattr(app, "state", None), "gateway", None)
    if not isinstance(gateway, Gateway):
        raise TypeError(f"{app!r} is not the gateway's app")
    return gateway
