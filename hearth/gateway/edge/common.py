"""What every route of the edge reads: the gateway's parts from the request, and who may do what."""

from __future__ import annotations

import httpx
from starlette.requests import Request

from hearth.errors import Forbidden
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.state import gateway_of
from hearth.gateway.store.base import GatewayStore
from hearth.http.auth import matches, presented_key
from hearth.tenants import Caller


def pool_of(request: Request) -> Pool:
    return gateway_of(request.app).pool


def store_of(request: Request) -> GatewayStore:
    return gateway_of(request.app).store


def client_of(request: Request) -> httpx.AsyncClient:
    return gateway_of(request.app).client


def scoped(who: Caller) -> bool:
    """A tenant's request on a gateway with keys (not the admin's, not an open gateway's)."""
    return who.key_name is not None and not who.admin


def require_admin(request: Request) -> None:
    admin = pool_of(request).settings.admin_key
    if admin and not matches(presented_key(dict(request.scope["headers"])), [admin]):
        raise Forbidden("this operation needs the gateway's admin key")
