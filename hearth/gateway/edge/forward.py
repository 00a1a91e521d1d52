"""A client's request passed through to a node, as it came (method, path, query, body), with
the node's key: sessions, snapshots, responses, cancel and tokens, everything but generation
(`proxy.py`) and the gateway's own endpoints.

The client's headers go as `headers.forwarded_headers` says.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import Unavailable
from hearth.gateway.fleet.pool import Node, Pool
from hearth.gateway.protocols import renamer
from hearth.gateway.state import gateway_of
from hearth.gateway.tenancy import caller
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.headers import forwarded_headers, upstream_headers
from hearth.http.sse import EventStreamResponse


async def call(request: Request, node: Node, body: bytes | None = None, admin: bool = False,
               path: str | None = None) -> httpx.Response:
    """The client's request, as it came (path, query, body), to `node` with the node's key.
    `path`: another path (a session's stored id, for a call with the node's admin key)."""
    url = node_url(node.up, path or request.url.path)
    if request.url.query:
        url += "?" + request.url.query
    content = body if body is not None else await request.body()
    gw = gateway_of(request.app)
    try:
        return await gw.client.request(
            request.method, url, content=content,
            headers={**forwarded_headers(request), **upstream_headers(node.up, caller(request), admin)},
            timeout=httpx.Timeout(600, connect=gw.settings.connect_timeout))
    except httpx.HTTPError as e:
        raise Unavailable(f"upstream {node.name} could not be reached: {type(e).__name__}", code="upstream_failed",
                          retry_after=2) from e


async def relay_stream(request: Request, node: Node) -> Response:
    """The client's request to `node`, its answer relayed as it comes when it is an event stream
    (`GET /v1/responses/{id}?stream=true`: a background response's events, for as long as its
    run lasts), whole otherwise. The node beats while it is silent, so a read that waits the
    stall timeout means the node is gone: the stream then just ends (the client resumes with
    `starting_after`). The client leaving closes the upstream request, nothing more."""
    url = node_url(node.up, request.url.path + ("?" + request.url.query if request.url.query else ""))
    gw = gateway_of(request.app)
    stall = gw.settings.stall_timeout_for(node.up)
    upstream = gw.client.build_request(request.method, url,
                                       headers={**forwarded_headers(request),
                                                **upstream_headers(node.up, caller(request))},
                                       timeout=httpx.Timeout(stall or None, connect=gw.settings.connect_timeout))
    try:
        r = await gw.client.send(upstream, stream=True)
    except httpx.HTTPError as e:
        raise Unavailable(f"upstream {node.name} could not be reached: {type(e).__name__}", code="upstream_failed",
                          retry_after=2) from e
    if r.status_code != 200 or not r.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            await r.aread()
        finally:
            await r.aclose()
        return as_response(r)

    rename = aliases(node)

    async def chunks() -> AsyncIterator[bytes]:
        buf = b""
        with contextlib.suppress(httpx.HTTPError):
            async for chunk in r.aiter_raw():
                buf += chunk
                end = buf.rfind(b"\n\n")
                if end >= 0:  # whole events only: a model name is never cut in two
                    whole, buf = buf[:end + 2], buf[end + 2:]
                    yield rename(whole)

    return EventStreamResponse(chunks(), close=r.aclose)


async def holder(request: Request, nodes: list[Node], path: str | None = None) -> Node | None:
    """The first of `nodes` where the caller sees `path` (a plain GET of it, as the caller,
    answers 200): the check before an operation that goes with the node's admin key."""
    gw = gateway_of(request.app)
    for node in nodes:
        with contextlib.suppress(httpx.HTTPError):
            headers = {**forwarded_headers(request), **upstream_headers(node.up, caller(request))}
            r = await gw.client.get(node_url(node.up, path or request.url.path), headers=headers, timeout=30)
            if r.status_code == 200:
                return node
    return None


def aliases(node: Node) -> Callable[[bytes], bytes]:
    """Answers from `node` name the model as clients do (its alias), as relayed answers do."""
    renames = [renamer(upstream_id, alias) for alias, upstream_id in node.up.models.items() if upstream_id != alias]

    def rename(data: bytes) -> bytes:
        for one in renames:
            data = one(data)
        return data

    return rename


def as_response(r: httpx.Response) -> Response:
    return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


async def send(request: Request, node: Node, body: bytes | None = None, admin: bool = False) -> Response:
    return as_response(await call(request, node, body, admin))


def live(pool: Pool, kind: str | None = "hearth") -> list[Node]:
    return [n for n in pool.nodes.values() if n.live.up and (kind is None or n.up.kind == kind)]


async def first_found(request: Request, nodes: list[Node], admin: bool = False) -> tuple[Node, httpx.Response]:
    """Ask each node in turn; the first answer that is not a 404 (or the last 404)."""
    body = await request.body()
    last: tuple[Node, httpx.Response] | None = None
    for node in nodes:
        r = await call(request, node, body=body, admin=admin)
        last = (node, r)
        if r.status_code != 404:
            return last
    if last is None:
        raise Unavailable("no Hearth upstream is up", code="no_healthy_upstream", retry_after=2)
    return last


async def gather_lists(request: Request) -> Response:
    """GET /v1/sessions and /v1/snapshots: every live node's list, each item tagged with its node."""
    pool = gateway_of(request.app).pool
    nodes = live(pool)

    async def one(node: Node) -> list[dict[str, Any]]:
        r = await call(request, node)
        if r.status_code != 200:
            return []
        items = r.json().get("data", [])
        return [{**i, "node": node.name} for i in items if isinstance(i, dict)]

    lists = await asyncio.gather(*(one(n) for n in nodes))
    items = [i for sub in lists for i in sub]
    kind = request.url.path.rsplit("/", 1)[-1]  # "sessions" or "snapshots": superlinear's key, as on a node
    return JSONResponse({"object": "list", "data": items, kind: items})
